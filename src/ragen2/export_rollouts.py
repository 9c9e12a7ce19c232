"""ragen2-export-rollouts: a run's saved rollouts as an OpenAI chat messages JSONL, the form other tools read.

    ragen2-export-rollouts outputs/<run>/rollouts.rank0.jsonl rollouts.messages.jsonl

One line per episode, in the reference implementation's export shape: ``{"custom_id", "messages": [...],
"metadata": {"env_id", "group_id", "num_turns", "total_reward", "success", "step", ...}}``; the messages are
recovered from the token ids (``ragen2.agent.episode.record_messages``), so runs saved before records carried
them convert too. The tokenizer is the run's model: read from the run folder's ``.hydra/config.yaml`` beside
the file, else ``--model``. ``ragen2-diagnose rollouts=<the export>`` reads it back (format ``messages``).

The file is written beside the destination and renamed into place once whole (``ragen2.outputs.replacing``):
a failed export leaves none, or the earlier one. A destination that exists is refused unless ``--overwrite``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ragen2._env import set_defaults
from ragen2.cli import ProgramParser
from ragen2.errors import ConfigError

ABOUT = "ragen2-export-rollouts: a run's saved rollouts (rollouts.rank<r>.jsonl) as an OpenAI chat messages JSONL."
EXAMPLES = (
    "ragen2-export-rollouts outputs/<run>/rollouts.rank0.jsonl rollouts.messages.jsonl",
    "ragen2-export-rollouts old/rollouts.rank0.jsonl out.jsonl --model Qwen/Qwen2.5-0.5B-Instruct",
)


def messages_record(record: Mapping[str, Any], tokenizer: Any) -> dict[str, Any]:
    """One saved episode in the messages form (the module doc); its own ``messages`` where it has them."""
    from ragen2.agent.episode import record_messages

    messages = record.get("messages") or record_messages(record, tokenizer)
    meta = {
        "env_id": record.get("env_id", ""),
        "group_id": record["seed"],  # the instance: a group's episodes share it
        "num_turns": len(record["turns"]),
        "total_reward": record.get("return"),
        "success": record.get("success"),
        "step": record["iteration"],
        **{k: record[k] for k in ("sample", "kept", "end_reason") if k in record},
    }
    custom_id = f"step{record['iteration']}-seed{record['seed']}-sample{record.get('sample', 0)}"
    return {"custom_id": custom_id, "messages": messages, "metadata": meta}


def run_model(rollouts: Path) -> str | None:
    """The model of the run whose folder holds ``rollouts`` (its ``.hydra/config.yaml``), if there is one."""
    saved = rollouts.parent / ".hydra" / "config.yaml"
    if not saved.is_file():
        return None
    from omegaconf import OmegaConf

    name = OmegaConf.select(OmegaConf.load(saved), "model.name_or_path", default=None)
    return None if name is None else str(name)


def export_rollouts(rollouts: str, out: str, model: str | None = None, overwrite: bool = False) -> int:
    """Write the messages form of ``rollouts`` to ``out``; returns the number of episodes written."""
    from ragen2.diagnostics.report import iter_records
    from ragen2.models.loading import load_tokenizer
    from ragen2.outputs import replacing

    source, target = Path(rollouts).expanduser(), Path(out).expanduser()
    if target.absolute() == source.absolute():
        raise ConfigError(
            f"out={out} is the rollouts file itself. Fix: another file, e.g. {source.stem}.messages.jsonl"
        )
    if target.exists() and not overwrite:
        raise ConfigError(f"out={out} already exists. Fix: another file, or --overwrite to replace it")
    name = model or run_model(source)
    if name is None:
        raise ConfigError(
            f"rollouts={rollouts} lies in no run folder (.hydra/config.yaml beside it) that names its model. "
            "Fix: --model <the run's model.name_or_path>"
        )
    tokenizer = load_tokenizer(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with replacing(target) as tmp, tmp.open("w") as f:
        for record in iter_records(source):
            f.write(json.dumps(messages_record(record, tokenizer)) + "\n")
            written += 1
    return written


def main(argv: list[str] | None = None) -> None:
    set_defaults()
    parser = ProgramParser("ragen2-export-rollouts", ABOUT, EXAMPLES)
    parser.add_argument("rollouts", help="a run's rollouts.rank<r>.jsonl (rollout.save_jsonl=true)")
    parser.add_argument("out", help="the messages JSONL to write")
    parser.add_argument(
        "--model", default=None, help="the run's model.name_or_path (default: its run folder's)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing destination file")
    args = parser.parse_args(argv)
    try:
        written = export_rollouts(args.rollouts, args.out, args.model, args.overwrite)
    except ConfigError as err:  # the files are the user's to fix: one line, no traceback
        parser.exit(1, f"{parser.prog}: {err}\n")
    print(f"{written} episodes -> {args.out}")


if __name__ == "__main__":
    main()
