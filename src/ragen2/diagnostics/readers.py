"""Other trainers' rollouts as first-turn (X, Z) rows, so that ``ragen2-diagnose`` reports on any run.

Public API:

- ``row_from_text(tokenizer, prompt, completion, seed, sample)``: one prompt and its completion as a ``Row``
  (None when the completion holds no reasoning span), X and Z formed as training forms them.
- ``PromptGroups``: the (seed, sample) of each row, its group being the source's group id where it has one,
  else the rows with an identical first-turn prompt (TRL and verl record no group id).
- ``Skips``: how many rows were read but not scored, and why.
- ``detect(path)``: the format of a file or folder, one of ``FORMATS``; ``read_steps(path, tokenizer, fmt,
  vocab_size)``: its rows step by step (``Step``), streaming: one step's rows in memory at a time.

The formats: ``ragen2`` (``rollouts.rank<r>.jsonl``), ``messages`` (an OpenAI chat JSONL, one trajectory a
line: the reference implementation's export ``{"custom_id", "messages", "metadata": {"group_id",
"total_reward", "success", ...}}``, reward or success at the top level, or ``prompt``/``completion`` message
lists), ``trl`` (``GRPOTrainer``'s ``completions/completions_{step:05d}.parquet``, ``log_completions=True``:
prompt, completion, a column per reward function, advantage; the reward is their sum, TRL's default equal
weights) and ``verl`` (``trainer.rollout_data_dir``'s ``{step}.jsonl``: input, output, gts, score, step).

X is the turn-1 context through the forced ``<think>`` (``ragen2.agent.render.turn_one_ids``): chat messages go
through the model's chat template with its generation prompt; a text prompt is taken as the trainer fed it
(TRL feeds a text prompt as is; verl's dump holds the templated text decoded without its special tokens, so X
there lacks them: the one place these rows differ from what the model saw). Z is the reasoning span: the
``reasoning_content`` field of the first assistant message, or the text between ``<think>`` (or the start,
where the prompt opened it) and the first ``</think>``, tokenized on its own.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ragen2.agent.render import THINK_CLOSE, THINK_OPEN, thinking_ids, turn_one_ids
from ragen2.diagnostics.report import Row, iter_records, row_from_record
from ragen2.errors import ConfigError
from ragen2.log import log

__all__ = [
    "FORMATS",
    "Completion",
    "Prompt",
    "PromptGroups",
    "Row",
    "Skips",
    "Step",
    "detect",
    "read_steps",
    "reasoning_text",
    "row_from_text",
]

#: a chat message: {"role": ..., "content": ...} (and, for an assistant, maybe "reasoning_content")
Message = dict[str, Any]
Prompt = str | Sequence[Message]
Completion = str | Sequence[Message]

#: the fields an assistant message may hold its reasoning in (transformers' response parsing, some APIs)
REASONING_FIELDS = ("reasoning_content", "thinking")


class BadRow(ValueError):
    """A row whose prompt or completion is not text or chat messages (the reader names its file and line)."""


@dataclass
class Skips:
    """Rows read but not scored, by why (the report says how many)."""

    no_reasoning: int = 0  # no ``</think>`` and no reasoning field: the reasoning never closed
    empty_reasoning: int = 0  # a span of whitespace only
    no_prompt: int = 0  # a trajectory with no message before the first assistant turn

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def __iadd__(self, other: Skips) -> Skips:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def skipped(self, span: str | None) -> bool:
        """Whether a reasoning span (``reasoning_text``) cannot be scored; counts it when it cannot."""
        if span is None:
            self.no_reasoning += 1
        elif not span.strip():
            self.empty_reasoning += 1
        else:
            return False
        return True


def _text(content: Any, what: str) -> str:
    """A message's content as text: a string, or a list of content blocks whose text parts are joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) for b in content):
        return "".join(str(b.get("text", "")) for b in content if b.get("type", "text") == "text")
    raise BadRow(f"{what} is {type(content).__name__}, not text or a list of content blocks")


def _messages(value: Any, what: str) -> list[Message]:
    if not (isinstance(value, list | tuple) and all(isinstance(m, dict) and "role" in m for m in value)):
        raise BadRow(f"{what} is neither text nor a list of chat messages ({{'role', 'content'}})")
    return [dict(m) for m in value]


def reasoning_text(completion: Completion) -> str | None:
    """The reasoning span of a completion (module doc); None when it has none."""
    if isinstance(completion, str):
        text = completion
    else:
        replies = [m for m in _messages(completion, "completion") if m.get("role") == "assistant"]
        if not replies:
            return None
        for key in REASONING_FIELDS:
            if isinstance(replies[0].get(key), str) and replies[0][key]:
                return replies[0][key]
        text = _text(replies[0].get("content", ""), "the completion's content")
    close = text.find(THINK_CLOSE)
    if close < 0:
        return None
    open_ = text.rfind(THINK_OPEN, 0, close)
    return text[open_ + len(THINK_OPEN) if open_ >= 0 else 0 : close]


def prompt_ids(tokenizer: Any, prompt: Prompt) -> list[int]:
    """X (module doc): chat messages through the template, text as the trainer fed it; both through <think>."""
    if isinstance(prompt, str):
        return thinking_ids(tokenizer, prompt)
    return turn_one_ids(tokenizer, _messages(prompt, "prompt"))


def prompt_key(prompt: Prompt) -> str:
    """A key equal for identical prompts (messages compared by role and content)."""
    if isinstance(prompt, str):
        return prompt
    return json.dumps([[m.get("role"), m.get("content")] for m in _messages(prompt, "prompt")])


def _label(prompt: Prompt) -> str:
    """What the report shows for a prompt: its last user message, or the text."""
    if isinstance(prompt, str):
        return prompt
    users = [m for m in _messages(prompt, "prompt") if m.get("role") == "user"]
    return _text(users[-1].get("content", ""), "the prompt's content") if users else ""


def row_from_text(
    tokenizer: Any,
    prompt: Prompt,
    completion: Completion,
    seed: int,
    sample: int,
    reward: float | None = None,
    skips: Skips | None = None,
) -> Row | None:
    """One prompt and its completion as a first-turn row (module doc), or None when the completion has no
    reasoning span or an empty one (counted in ``skips`` when given). ``prompt``: text or chat messages;
    ``completion``: text or messages whose first assistant message is turn 1. ``BadRow`` for other values."""
    z_text = reasoning_text(completion)
    if (skips or Skips()).skipped(z_text):
        return None
    assert z_text is not None
    x = prompt_ids(tokenizer, prompt)
    z = tokenizer.encode(z_text, add_special_tokens=False)
    return Row(tuple(x), tuple(z), seed, sample, _label(prompt), z_text, reward)


class PromptGroups:
    """Seeds (one per group) and sample indices (within it) for rows in reading order. A group is the
    metadata's group id where the source has one, else the set of rows with an identical prompt."""

    def __init__(self) -> None:
        self._seeds: dict[str, int] = {}
        self._sizes: dict[str, int] = {}

    def add(self, prompt: Prompt, group: str | int | None = None) -> tuple[int, int]:
        """The (seed, sample) of the next row of ``prompt``'s group (or of ``group``'s, when given)."""
        key = f"group:{group}" if group is not None else f"prompt:{prompt_key(prompt)}"
        seed = self._seeds.setdefault(key, len(self._seeds))
        sample = self._sizes.get(key, 0)
        self._sizes[key] = sample + 1
        return seed, sample

    def __len__(self) -> int:
        return len(self._seeds)


# ---- files: formats, detection, reading step by step ----

#: the formats ``detect`` tells apart (``format=`` in diagnose.yaml names one when it cannot)
FORMATS = ("ragen2", "messages", "trl", "verl")
#: what each format's rows must hold (the fix of a refused file names them)
NEEDS = {
    "ragen2": "iteration, seed and turns (rollout.save_jsonl=true)",
    "messages": "messages (an OpenAI chat list), or prompt and completion",
    "trl": "the columns prompt and completion (GRPOTrainer's log_completions=True)",
    "verl": "input and output (verl's trainer.rollout_data_dir dump)",
}
_FIX = (
    "Fix: rollouts=<a ragen2 rollouts.rank<r>.jsonl, an OpenAI chat messages JSONL, TRL's completions/ folder "
    "or verl's {step}.jsonl dump>, and format=<" + "|".join(FORMATS) + "> where it cannot be told"
)


@dataclass
class Step:
    """The rows of one training step (a ragen2 iteration), as ``read_steps`` yields them."""

    step: int
    rows: list[Row]  # scored rows: a valid, non-empty Z
    skips: Skips  # rows read but not scored
    rewards: dict[int, list[float]]  # each group's rewards over every row read (scored or not)

    @property
    def read(self) -> int:
        return len(self.rows) + self.skips.total


def _number(path: Path) -> int | None:
    """The step in a file's name (``completions_00010.parquet``, ``10.jsonl``), or None."""
    found = re.findall(r"\d+", path.stem)
    return int(found[-1]) if found else None


def step_files(path: str | Path) -> list[Path]:
    """The files read for ``path``: itself, or a folder's ``.jsonl`` and ``.parquet`` files in step order
    (TRL's output folder: its ``completions/``)."""
    where = Path(path).expanduser()
    if where.is_file():
        return [where]
    if not where.is_dir():
        raise ConfigError(f"rollouts={path} is neither a file nor a folder. {_FIX}")
    if (where / "completions").is_dir():
        where = where / "completions"
    files = [p for p in where.iterdir() if p.is_file() and p.suffix in (".jsonl", ".parquet")]
    if not files:
        raise ConfigError(f"rollouts={path} holds no .jsonl or .parquet file. {_FIX}")
    ranks = [p for p in files if p.name.startswith("rollouts.rank")]
    if ranks:
        raise ConfigError(
            f"rollouts={path} is a ragen2 run folder: its ranks' files are read one at a time. "
            f"Fix: rollouts={ranks[0]}"
        )
    return sorted(files, key=lambda p: (_number(p) is None, _number(p) or 0, p.name))


def _first_record(path: Path) -> tuple[int, Any]:
    """The first non-empty line of a JSONL file and its JSON; a ``ConfigError`` for an empty file or garbage
    (a lone last line cut short by a killed writer counts as none)."""
    with path.open(errors="replace") as f:
        for n, line in enumerate(f, start=1):
            if line.strip():
                try:
                    return n, json.loads(line)
                except json.JSONDecodeError as err:
                    if line.endswith("\n"):
                        raise ConfigError(
                            f"rollouts={path}: line {n} is not JSON ({err.msg}). {_FIX}"
                        ) from None
    raise ConfigError(f"rollouts={path} holds no records. {_FIX}")


def _format_of(record: dict[str, Any]) -> str | None:
    keys = set(record)
    if keys & {"iteration", "turns"}:  # ragen2's own: its reader names what else such a record lacks
        return "ragen2"
    if "messages" in keys or {"prompt", "completion"} <= keys:
        return "messages"
    if {"input", "output"} <= keys:
        return "verl"
    return None


def detect(path: str | Path) -> str:
    """The format of a rollouts file or folder (``FORMATS``), from its files' names and first record."""
    first = step_files(path)[0]
    if first.suffix == ".parquet":
        return "trl"
    n, record = _first_record(first)
    if not isinstance(record, dict):
        raise ConfigError(f"rollouts={first}: line {n} is JSON but not a record (an object). {_FIX}")
    fmt = _format_of(record)
    if fmt is None:
        raise ConfigError(
            f"rollouts={first}: line {n} (keys {sorted(record)[:8]}) is in no known format. {_FIX}"
        )
    return fmt


@dataclass(frozen=True)
class Record:
    """One trajectory as a reader hands it on: where it came from and what it holds."""

    where: str  # "rollouts=<file>: line <n>" (or "row <n>" of a parquet)
    step: int
    prompt: Prompt
    completion: Completion
    group: str | int | None  # the source's group id, None to group by identical prompts
    reward: float | None


def _reward(*values: Any) -> float | None:
    """The first value that is a number (a bool counts: success as 0/1)."""
    for v in values:
        if isinstance(v, bool | int | float) and not (isinstance(v, float) and math.isnan(v)):
            return float(v)
    return None


def _step(*values: Any) -> int:
    """The first value that reads as a whole number (TRL wrote the step as text before 1.0), else 0."""
    for v in values:
        try:
            return int(v)
        except (TypeError, ValueError):
            continue
    return 0


def _split_messages(messages: list[Message]) -> tuple[list[Message], list[Message]]:
    """A trajectory's turn-1 prompt (the messages before the first assistant turn) and the rest."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    return messages[:first], messages[first:]


def _messages_record(obj: dict[str, Any], where: str, step: int) -> Record:
    given = obj.get("metadata")
    meta: dict[str, Any] = given if isinstance(given, dict) else {}
    if "messages" in obj:
        prompt, completion = _split_messages(_messages(obj["messages"], "messages"))
    else:
        prompt, completion = obj["prompt"], obj["completion"]
    group = meta.get("group_id", obj.get("group_id", obj.get("group")))
    reward = _reward(
        meta.get("total_reward"),
        obj.get("total_reward"),
        meta.get("reward"),
        obj.get("reward"),
        obj.get("score"),
        meta.get("success"),
        obj.get("success"),
    )
    return Record(where, _step(obj.get("step"), meta.get("step"), step), prompt, completion, group, reward)


def _verl_record(obj: dict[str, Any], where: str, step: int) -> Record:
    return Record(
        where, _step(obj.get("step"), step), obj["input"], obj["output"], None, _reward(obj.get("score"))
    )


#: the keys a JSONL format's record holds (one of the sets)
_SHAPES = {"messages": ({"messages"}, {"prompt", "completion"}), "verl": ({"input", "output"},)}


def _jsonl_objects(path: Path, fmt: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each line's object with where it is; a ``ConfigError`` naming the line for garbage or missing keys.
    A last line cut short (no newline, not JSON: a writer killed mid-line) is dropped with a warning."""
    with path.open(errors="replace") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"rollouts={path}: line {n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                if not line.endswith("\n"):
                    log.warning(
                        "%s is cut short (a writer stopped mid-line); reading the lines before it", where
                    )
                    return
                raise ConfigError(f"{where} is not JSON ({err.msg}). {_FIX}") from None
            if not isinstance(obj, dict) or not any(keys <= set(obj) for keys in _SHAPES[fmt]):
                raise ConfigError(f"{where} lacks {NEEDS[fmt]}. {_FIX}")
            yield where, obj


def _trl_records(path: Path, step: int) -> Iterator[Record]:
    """The rows of one TRL completions parquet, batch by batch. The reward is the sum of the reward
    columns (GRPOTrainer's default, equal reward_weights): every numeric column but step and advantage."""
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as err:  # pyarrow's errors share no base class worth naming
        raise ConfigError(f"rollouts={path} is not a parquet file ({err}). {_FIX}") from None
    names = set(table.schema_arrow.names)
    missing = {"prompt", "completion"} - names
    if missing:
        raise ConfigError(
            f"rollouts={path} lacks the columns {', '.join(sorted(missing))} (it has {sorted(names)}): not "
            f"TRL's completions log. Fix: GRPOTrainer's <output_dir>/completions/ written with "
            "log_completions=True"
        )
    rewards = [f.name for f in table.schema_arrow if f.name not in ("step", "advantage") and _numeric(f.type)]
    n = 0
    for batch in table.iter_batches(batch_size=256):
        for obj in batch.to_pylist():
            n += 1
            values = [obj[c] for c in rewards if obj[c] is not None and not math.isnan(obj[c])]
            reward = float(sum(values)) if values else None
            yield Record(
                f"rollouts={path}: row {n}",
                _step(obj.get("step"), step),
                obj["prompt"],
                obj["completion"],
                None,
                reward,
            )


def _numeric(kind: Any) -> bool:
    import pyarrow.types as pt

    return bool(pt.is_integer(kind) or pt.is_floating(kind) or pt.is_boolean(kind))


def _text_records(path: Path, fmt: str) -> Iterator[Record]:
    """The trajectories of one file of a text format, in order (a file's step: its rows' ``step``, else the
    number in its name)."""
    step = _number(path) or 0
    if fmt == "trl":
        if path.suffix != ".parquet":
            raise ConfigError(
                f"rollouts={path}: format=trl reads TRL's completions_<step>.parquet files. {_FIX}"
            )
        yield from _trl_records(path, step)
    elif fmt == "messages":
        for where, obj in _jsonl_objects(path, fmt):
            try:
                yield _messages_record(obj, where, step)
            except BadRow as err:
                raise ConfigError(f"{where}: {err}. {_FIX}") from None
    else:
        for where, obj in _jsonl_objects(path, fmt):
            yield _verl_record(obj, where, step)


class _StepRows:
    """One step's rows as they are read: the caps (``num_prompts`` groups, ``samples`` rows each, counting
    scored rows as ``ragen2.diagnostics.report.rows_from_records`` does), the skips and every row's reward by group."""

    def __init__(self, step: int, num_prompts: int | None, samples: int | None) -> None:
        self.step, self.num_prompts, self.samples = step, num_prompts, samples
        self.groups = PromptGroups()
        self.taken: dict[int, int] = {}
        self.result = Step(step, [], Skips(), {})

    def admits(self, group: int) -> bool:
        if group not in self.taken and self.num_prompts is not None and len(self.taken) >= self.num_prompts:
            return False
        return self.samples is None or self.taken.get(group, 0) < self.samples

    def keep(self, group: int, row: Row) -> None:
        self.taken[group] = self.taken.get(group, 0) + 1
        self.result.rows.append(row)


def _checked_ids(ids: Sequence[int], vocab_size: int, where: str) -> None:
    bad = next((i for i in ids if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise ConfigError(
            f"{where}: token id {bad} is outside the scoring model's vocabulary of {vocab_size}: the rollouts "
            "were tokenized for another model. Fix: model.name_or_path=<the model that wrote them>"
        )


def read_steps(
    path: str | Path,
    tokenizer: Any,
    fmt: str,
    vocab_size: int,
    num_prompts: int | None = None,
    samples: int | None = None,
) -> Iterator[Step]:
    """The rows of a rollouts file or folder (``fmt``: one of ``FORMATS``), one ``Step`` at a time in the
    order read; a step's rows are all in memory, the next step's are not yet. A folder of several files
    shows a progress bar. A ``ConfigError`` naming the file and line for anything unreadable."""
    from tqdm.auto import tqdm

    files = step_files(path)
    current: _StepRows | None = None
    for file in tqdm(files, desc="rollouts", unit="file", disable=len(files) < 2):
        for step, add in _adders(file, fmt, tokenizer, vocab_size):
            if current is None or step != current.step:
                if current is not None:
                    yield current.result
                current = _StepRows(step, num_prompts, samples)
            add(current)
    if current is None:
        raise ConfigError(f"rollouts={path} holds no rows. {_FIX}")
    yield current.result


def _adders(
    file: Path, fmt: str, tokenizer: Any, vocab_size: int
) -> Iterator[tuple[int, Callable[[_StepRows], None]]]:
    """Each trajectory of ``file`` as (its step, what adds it to its step's rows)."""
    if fmt == "ragen2":
        for n, record in enumerate(iter_records(file, warn=False), start=1):
            where = f"rollouts={file}: record {n}"
            yield int(record["iteration"]), _ragen2_adder(record, where, tokenizer, vocab_size)
        return
    for rec in _text_records(file, fmt):
        yield rec.step, _text_adder(rec, tokenizer, vocab_size)


def _ragen2_adder(
    record: dict[str, Any], where: str, tokenizer: Any, vocab_size: int
) -> Callable[[_StepRows], None]:
    def add(rows: _StepRows) -> None:
        seed = int(record["seed"])
        reward = _reward(record.get("return"), record.get("success"))
        if reward is not None:
            rows.result.rewards.setdefault(seed, []).append(reward)
        for turn in record["turns"][:1]:  # ids a model's tokenizer cannot decode: refused before decoding
            _checked_ids([*turn["prompt_ids"], *turn["sampled_ids"]], vocab_size, where)
        row = row_from_record(record, _decoder(tokenizer))
        if row is None:
            if record["turns"]:
                rows.result.skips.no_reasoning += 1
            else:
                rows.result.skips.no_prompt += 1
        elif rows.admits(seed):
            rows.keep(seed, row)

    return add


def _text_adder(rec: Record, tokenizer: Any, vocab_size: int) -> Callable[[_StepRows], None]:
    def add(rows: _StepRows) -> None:
        try:
            seed, sample = rows.groups.add(rec.prompt, rec.group)
            if rec.reward is not None:
                rows.result.rewards.setdefault(seed, []).append(rec.reward)
            if not rec.prompt:
                rows.result.skips.no_prompt += 1
                return
            if rows.result.skips.skipped(reasoning_text(rec.completion)) or not rows.admits(seed):
                return
            row = row_from_text(tokenizer, rec.prompt, rec.completion, seed, sample, rec.reward)
        except BadRow as err:
            raise ConfigError(f"{rec.where}: {err}. {_FIX}") from None
        assert row is not None
        _checked_ids([*row.prompt_ids, *row.reasoning_ids], vocab_size, rec.where)
        rows.keep(seed, row)

    return add


def _decoder(tokenizer: Any) -> Callable[[Sequence[int]], str]:
    def decode(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=False)  # as the runner decodes

    return decode
