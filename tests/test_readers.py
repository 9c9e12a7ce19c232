"""ragen2.diagnostics.readers: other trainers' rollouts read as first-turn rows, and ragen2's own as messages.

Each format's fixture is written with that tool's field names (TRL 1.16's ``GRPOTrainer.log``: a pandas
DataFrame of step, prompt, completion, one column per reward function and advantage, ``to_parquet``; verl's
``_dump_generations``: input, output, gts, score, step; the reference implementation's export: custom_id,
messages, metadata). On each, reasoning that copies its input and templated reasoning over the same prompts
are scored under the built-in model and told apart by a wide margin.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from ragen2.agent.render import ChatRenderer, turn_one_ids
from ragen2.diagnostics.readers import (
    PromptGroups,
    Skips,
    detect,
    read_steps,
    reasoning_text,
    row_from_text,
    step_files,
)
from ragen2.errors import ConfigError

SYSTEM = "You are a helpful agent."
WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "maple",
    "tiger",
    "lemon",
    "violet",
    "copper",
    "harbor",
    "falcon",
    "meadow",
]
TEMPLATES = ("Let me move toward the goal.", "I should follow the plan.", "I choose the safest move.")
PROMPTS, SAMPLES = 4, 3  # groups × rows each, per step


def trajectories(kind: str, step: int = 0) -> list[tuple[list[dict[str, str]], str, float]]:
    """PROMPTS × SAMPLES (prompt messages, the assistant's text, reward): ``copy`` reasoning repeats the words
    its prompt shows, ``template`` picks one of three sentences whatever the prompt."""
    rng = random.Random(step)
    out = []
    for i in range(PROMPTS):
        words = " ".join(rng.sample(WORDS, 4))
        prompt = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Task {i}: remember the words {words}."},
        ]
        for k in range(SAMPLES):
            z = f"The words are {words}." if kind == "copy" else rng.choice(TEMPLATES)
            out.append((prompt, f"<think>{z}</think><answer>ok</answer>", float(i % 2 == 0 or k == 0)))
    return out


def write_messages(path: Path, kind: str, variant: str = "reference") -> Path:
    """The reference implementation's export shape, or its close variants (reward at the top level;
    prompt / completion message lists)."""
    lines = []
    for n, (prompt, reply, reward) in enumerate(trajectories(kind)):
        assistant = {"role": "assistant", "content": reply}
        group = n // SAMPLES
        if variant == "reference":
            record: dict[str, Any] = {
                "custom_id": f"traj-{n}",
                "messages": [*prompt, assistant, {"role": "user", "content": "Turn 2: done."}],
                "metadata": {
                    "env_id": "words",
                    "group_id": group,
                    "num_turns": 1,
                    "total_reward": reward,
                    "success": reward > 0,
                },
            }
        elif variant == "top-level":
            record = {"messages": [*prompt, assistant], "reward": reward, "group_id": group}
        else:
            record = {"prompt": prompt, "completion": [assistant], "reward": reward}
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_trl(folder: Path, kind: str, step: int = 1, conversational: bool = True) -> Path:
    """``<output_dir>/completions/completions_{step:05d}.parquet`` as GRPOTrainer writes it."""
    import pandas as pd

    rows = trajectories(kind, step)
    prompts: list[Any] = [p for p, _, _ in rows]
    completions: list[Any] = [[{"role": "assistant", "content": r}] for _, r, _ in rows]
    if not conversational:  # the standard format: text fed to the model as is
        prompts = [f"{p[1]['content']}\n" for p in prompts]
        completions = [c[0]["content"] for c in completions]
    table = {
        "step": [step] * len(rows),
        "prompt": prompts,
        "completion": completions,
        "accuracy_reward": [w for _, _, w in rows],
        "format_reward": [1.0] * len(rows),
        "advantage": [0.0] * len(rows),
    }
    out = folder / "completions"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"completions_{step:05d}.parquet"
    pd.DataFrame(table).to_parquet(path)
    return path


def write_verl(folder: Path, kind: str, tokenizer: Any, step: int = 1) -> Path:
    """verl's ``{step}.jsonl`` rollout dump: the prompt and response decoded without special tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for prompt, reply, reward in trajectories(kind, step):
        ids = turn_one_ids(tokenizer, prompt)[:-1]  # verl's prompt ends at the generation header
        text = tokenizer.decode(ids, skip_special_tokens=True)
        entry = {"input": text, "output": reply, "gts": "ok", "score": reward, "step": step}
        lines.append(json.dumps(entry, ensure_ascii=False))
    path = folder / f"{step}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def builtin() -> tuple[Any, Any]:
    from ragen2.models import load_model, load_tokenizer

    return load_tokenizer("builtin"), load_model("builtin").eval()


# ---- row_from_text ----


def test_a_rows_prompt_is_the_turn_one_context_training_forms(tokenizer: Any) -> None:
    prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "state 7"}]
    row = row_from_text(
        tokenizer, prompt, [{"role": "assistant", "content": "<think>go left</think>x"}], 3, 1
    )
    assert row is not None and (row.seed, row.sample, row.observation) == (3, 1, "state 7")
    assert list(row.prompt_ids) == ChatRenderer(tokenizer, SYSTEM).first_prompt("state 7")
    assert tokenizer.decode(list(row.reasoning_ids)) == "go left" and row.reasoning == "go left"
    # text is taken as the trainer fed it, through one <think> (not doubled where the prompt opened it)
    opened = row_from_text(tokenizer, "Q: 2+2?\n<think>", "four</think>4", 0, 0)
    assert opened is not None and tokenizer.decode(list(opened.prompt_ids)) == "Q: 2+2?\n<think>"
    assert opened.reasoning == "four"


def test_reasoning_spans_as_training_finds_them() -> None:
    assert reasoning_text("<think>a</think>b</think>") == "a"  # the first close ends Z
    assert reasoning_text("preamble <think>a</think>") == "a"
    assert reasoning_text("opened by the prompt</think>b") == "opened by the prompt"
    assert reasoning_text("no span at all") is None
    reply = {"role": "assistant", "content": "4", "reasoning_content": "two and two"}
    assert reasoning_text([reply]) == "two and two"
    blocks = [{"role": "assistant", "content": [{"type": "text", "text": "<think>z</think>"}]}]
    assert reasoning_text(blocks) == "z"


def test_rows_without_a_span_are_counted_and_skipped(tokenizer: Any) -> None:
    skips = Skips()
    assert row_from_text(tokenizer, "p", "no reasoning here", 0, 0, skips=skips) is None
    assert row_from_text(tokenizer, "p", "<think>  \n</think>x", 0, 1, skips=skips) is None
    assert (skips.no_reasoning, skips.empty_reasoning, skips.total) == (1, 1, 2)


def test_groups_come_from_metadata_else_from_identical_prompts() -> None:
    groups = PromptGroups()
    a = [{"role": "user", "content": "a"}]
    assert [groups.add(a), groups.add("b"), groups.add(list(a)), groups.add("b")] == [
        (0, 0),
        (1, 0),
        (0, 1),
        (1, 1),
    ]
    assert [groups.add("c", group=7), groups.add("d", group=7)] == [(2, 0), (2, 1)]  # one group, two prompts
    assert len(groups) == 3


# ---- each format, read and scored ----


def _read(path: Path, tokenizer: Any, model: Any, fmt: str | None = None) -> list[Any]:
    fmt = fmt or detect(path)
    return list(read_steps(path, tokenizer, fmt, model.get_input_embeddings().num_embeddings))


@pytest.mark.parametrize(
    "source", ["messages", "messages:top-level", "messages:prompt-completion", "trl", "trl:text", "verl"]
)
def test_each_format_tells_input_copying_from_templated_reasoning(
    tmp_path: Path, builtin: tuple[Any, Any], source: str
) -> None:
    from ragen2.diagnostics.report import diagnose, reward_picture

    tokenizer, model = builtin
    fmt, _, variant = source.partition(":")
    passes = {}
    for kind in ("copy", "template"):
        folder = tmp_path / kind
        folder.mkdir()
        if fmt == "messages":
            path = write_messages(folder / "export.jsonl", kind, variant or "reference")
        elif fmt == "trl":
            path = write_trl(folder, kind, conversational=variant != "text").parent.parent  # the output_dir
        else:
            path = write_verl(folder, kind, tokenizer)
        assert detect(path) == fmt
        (step,) = _read(path, tokenizer, model)
        assert (
            len(step.rows) == PROMPTS * SAMPLES and step.skips.total == 0
        )  # a reader that skips all fails here
        assert len({r.prompt_ids for r in step.rows}) == PROMPTS
        diag = diagnose(model, step.rows)
        passes[kind] = diag.metrics | reward_picture(step.rewards)
    copy, template = passes["copy"], passes["template"]
    assert copy["retrieval_acc"] >= 0.9 and template["retrieval_acc"] <= 0.5, (copy, template)
    assert copy["mi_fraction"] - template["mi_fraction"] >= 0.5, (copy, template)
    # two groups of four have a constant reward (i even: 1 on every row); the others vary
    assert copy["zero_variance_share"] == pytest.approx(0.5)


def test_a_ragen2_run_reads_as_its_messages_export(tmp_path: Path) -> None:
    """ragen2's saved rollouts carry their chat messages; the export of them reads back to the same X."""
    import hydra

    from ragen2.config import compose
    from ragen2.export_rollouts import main

    run_dir = tmp_path / "run"
    cfg = compose(
        ["model=tiny", "rollout=scripted", "env=sokoban", "rollout.save_jsonl=true"], run_dir=str(run_dir)
    )
    dm = hydra.utils.instantiate(cfg.data)
    dm.setup()
    dm.rollout(0)
    saved = run_dir / "rollouts.rank0.jsonl"
    records = [json.loads(line) for line in saved.read_text().splitlines()]
    assert records and all(
        r["messages"][0] == {"role": "system", "content": r["system_prompt"]} for r in records
    )
    for r in records:
        assert len(r["messages"]) == 1 + 2 * len(r["turns"])
        assert turn_one_ids(dm.tokenizer, r["messages"][:2]) == r["turns"][0]["prompt_ids"]
    old = tmp_path / "old.jsonl"  # a run saved before records carried messages
    old.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "messages"}) + "\n" for r in records)
    )
    out = tmp_path / "export.jsonl"
    main([str(old), str(out), "--model", "tiny"])
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["messages"] for e in exported] == [r["messages"] for r in records]
    assert exported[0]["metadata"]["group_id"] == records[0]["seed"] and detect(out) == "messages"
    vocab = dm.tokenizer.vocab_size + 64
    (own,) = list(read_steps(saved, dm.tokenizer, "ragen2", vocab, 64, 64))
    (back,) = list(read_steps(out, dm.tokenizer, "messages", vocab, 64, 64))
    assert [r.prompt_ids for r in back.rows] == [r.prompt_ids for r in own.rows] and own.rows
    with pytest.raises(SystemExit):
        main([str(old), str(out), "--model", "tiny"])  # exists: refused without --overwrite


def test_a_folder_of_steps_streams_in_step_order(tmp_path: Path, tokenizer: Any) -> None:
    for step in (10, 2, 1):
        write_trl(tmp_path, "copy", step)
    assert [p.name for p in step_files(tmp_path)] == [f"completions_{s:05d}.parquet" for s in (1, 2, 10)]
    steps = read_steps(tmp_path, tokenizer, "trl", tokenizer.vocab_size + 64)
    first = next(steps)  # a generator: one step read at a time
    assert first.step == 1 and len(first.rows) == PROMPTS * SAMPLES
    assert [s.step for s in steps] == [2, 10]


# ---- bad input: one line naming the file, the row and the fix ----


def _bad(tmp_path: Path, case: str) -> tuple[Path, str | None]:
    """A bad rollouts file and the format to read it as (None: detected)."""
    if case == "parquet-columns":
        import pandas as pd

        path = tmp_path / "completions_00003.parquet"
        pd.DataFrame({"step": [3], "text": ["x"]}).to_parquet(path)
        return path, None
    path = tmp_path / "rollouts.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
    text = {
        "unknown": '{"question": "q", "answer": "a"}\n',
        "empty": "",
        "garbage": f"{good}\n{good}\nnot json at all\n",
        "not-messages": f'{good}\n{{"messages": "q"}}\n',
        "vocabulary": json.dumps(
            {
                "iteration": 0,
                "seed": 0,
                "turns": [{"prompt_ids": [1, 10**7], "sampled_ids": [2], "observation": ""}],
            }
        )
        + "\n",
    }[case]
    path.write_text(text)
    return path, None


@pytest.mark.parametrize(
    ("case", "match"),
    [
        (
            "unknown",
            r"rollouts={path}: line 1 \(keys \['answer', 'question'\]\) is in no known format\. Fix: ",
        ),
        ("empty", r"rollouts={path} holds no records\. Fix: "),
        ("garbage", r"rollouts={path}: line 3 is not JSON \(Expecting value\)\. Fix: "),
        ("not-messages", r"rollouts={path}: line 2: messages is neither text nor a list of chat messages"),
        (
            "parquet-columns",
            r"rollouts={path} lacks the columns completion, prompt \(it has \['step', 'text'\]\)",
        ),
        (
            "vocabulary",
            r"rollouts={path}: record 1: token id 10000000 is outside the scoring model's vocabulary",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_file_and_row(
    tmp_path: Path, tokenizer: Any, case: str, match: str
) -> None:
    path, fmt = _bad(tmp_path, case)
    with pytest.raises(ConfigError, match="^" + match.format(path=path)) as err:
        list(read_steps(path, tokenizer, fmt or detect(path), tokenizer.vocab_size + 64))
    assert "\n" not in str(err.value) and "Fix: " in str(err.value)
