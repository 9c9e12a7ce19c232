"""ragen2-export: the policy of a ragen2 checkpoint as an HF ``save_pretrained`` folder (model + tokenizer).

    ragen2-export outputs/<run>/checkpoints/last.ckpt exported/sokoban-grpo

(the base model is the one the run trained, saved in the checkpoint; ``--model`` names it for older ones)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ragen2._env import set_defaults
from ragen2.config import version_line


def export(checkpoint: str, out: str, name_or_path: str | None = None, dtype: str | None = None) -> Path:
    from ragen2.models.checkpoint import CheckpointError, load_policy, read_checkpoint
    from ragen2.models.loading import load_tokenizer

    state = read_checkpoint(checkpoint)
    saved = (state.get("ragen2") or {}).get("model") or {}
    name_or_path = name_or_path or saved.get("name_or_path")
    if name_or_path is None:
        raise CheckpointError(
            f"checkpoint={checkpoint} does not name its base model (an older checkpoint). Fix: --model <the "
            "run's model.name_or_path>"
        )
    folder = Path(out)
    model = load_policy(name_or_path, checkpoint, dtype or saved.get("dtype", "float32"), state)
    model.config.use_cache = True
    model.save_pretrained(folder)
    load_tokenizer(name_or_path).save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> None:
    set_defaults()
    from ragen2.log import log

    # no docstring under python -OO: the help then goes without its description
    parser = argparse.ArgumentParser(prog="ragen2-export", description=__doc__ and __doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=version_line("ragen2-export"))
    parser.add_argument("checkpoint", help="a ragen2 .ckpt, e.g. outputs/<run>/checkpoints/last.ckpt")
    parser.add_argument("out", help="the folder to write")
    parser.add_argument(
        "--model",
        default=None,
        help="the base model the run trained (default: the one saved in the checkpoint)",
    )
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    from ragen2.models.checkpoint import CheckpointError

    try:
        folder = export(args.checkpoint, args.out, args.model, args.dtype)
    except CheckpointError as err:  # the file is the user's to fix: one line, no traceback
        parser.exit(1, f"{parser.prog}: {err}\n")
    log.info("exported HF model folder: %s", folder)


if __name__ == "__main__":
    main()
