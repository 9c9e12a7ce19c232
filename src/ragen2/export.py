"""ragen2-export: the policy of a ragen2 checkpoint as an HF ``save_pretrained`` folder (model + tokenizer).

    ragen2-export outputs/<run>/checkpoints/last.ckpt exported/sokoban-grpo

(the base model is the one the run trained, saved in the checkpoint; ``--model`` names it for older ones)

A LoRA run's adapters (``model.lora``) are merged into the base model's weights: the folder is a plain HF
model, what ``ragen2-eval`` and vLLM load. ``--adapter`` writes PEFT's adapter folder instead
(``adapter_config.json``, ``adapter_model.safetensors``, the tokenizer), for loaders that take the base model
and the adapters apart (``PeftModel.from_pretrained``, vLLM's ``LoRARequest``).

The folder is written beside the destination (``.<name>.<random>.tmp``) and renamed into place once whole
(``ragen2.outputs.replacing_folder``), so a failed or killed export leaves no half-written folder. A
destination that holds files is refused unless ``--overwrite`` (which replaces the folder as a whole); one
that is a file, holds the checkpoint, or is, holds or lies in a training run's ``checkpoints/``, ``.hydra/``
or ``csv/`` always is.
"""

from __future__ import annotations

from pathlib import Path

from ragen2._env import set_defaults
from ragen2.cli import ProgramParser
from ragen2.errors import ConfigError
from ragen2.lifecycle.folder import LOCK, holding
from ragen2.outputs import check_apart, check_no_run, replacing_folder, unwritable

# ragen2-export --help
ABOUT = (
    "ragen2-export: the policy of a ragen2 checkpoint as an HF model folder (weights, config and tokenizer)."
)
EXAMPLES = (
    "ragen2-export outputs/<run>/checkpoints/last.ckpt exported/sokoban-grpo",
    "ragen2-export outputs/<run>/checkpoints/last.ckpt exported/sokoban-grpo --overwrite",
    "ragen2-export old.ckpt exported/old --model <the run's model.name_or_path>   (an older checkpoint)",
)
NOTES = """\
The base model is the one the run trained, saved in the checkpoint (--model names it for older ones).
The folder is written beside the destination and renamed into place once whole: a failed or killed
export leaves no half-written folder. A destination that holds files is refused unless --overwrite
(which replaces the folder as a whole); one that is a file, holds the checkpoint, or is, holds or lies
in a training run's checkpoints/, .hydra/ or csv/ always is.
Then: ragen2-eval model.name_or_path=<out> (or any HF loader, vLLM included)."""


def check_destination(out: str, overwrite: bool = False, checkpoint: str | None = None) -> Path:
    """Refuse a destination that is a file, holds ``checkpoint`` or a training run's files, holds files
    (unless ``overwrite``) or cannot be written, before anything loads; returns it."""
    if not out.strip():  # Path("") is the working folder: an export would replace it
        raise ConfigError(f"out={out!r} names no folder. Fix: out=<a new folder>, e.g. exported/<run>")
    folder = Path(out).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ConfigError(
            f"out={out} is a file, and the export is a folder (config, weights, tokenizer). Fix: pass a folder "
            "path that does not exist yet"
        )
    check_apart("out", Path(out), "folder", [folder], {"checkpoint": checkpoint})
    check_no_run("out", Path(out))
    if folder.is_dir() and any(folder.iterdir()) and not overwrite:
        raise ConfigError(
            f"out={out} already holds files, which the export would replace. Fix: another folder, or "
            "--overwrite to replace that folder as a whole"
        )
    problem = unwritable(folder.absolute().parent)
    if problem:
        raise ConfigError(f"out={out} cannot be written: {problem}. Fix: out=<a folder in a writable place>")
    return folder


def export(
    checkpoint: str,
    out: str,
    name_or_path: str | None = None,
    dtype: str | None = None,
    overwrite: bool = False,
    adapter: bool = False,
) -> Path:
    """Write the checkpoint's policy (``adapter``: a LoRA run's adapters alone) and its tokenizer to the folder
    ``out``; returns it."""
    from ragen2.models.loading import check_source

    folder = check_destination(out, overwrite, checkpoint)
    if name_or_path is not None:
        check_source(name_or_path)
    # beside the folder (which is replaced as a whole): a second export into it at the same time is refused
    with holding(folder.absolute().parent / f".{folder.name}{LOCK}", "ragen2-export"):
        return _export(checkpoint, folder, name_or_path, dtype, adapter)


def _export(
    checkpoint: str, folder: Path, name_or_path: str | None, dtype: str | None, adapter: bool
) -> Path:
    from ragen2.models.checkpoint import CheckpointError, load_policy, read_checkpoint, saved_lora
    from ragen2.models.loading import load_tokenizer

    state = read_checkpoint(checkpoint)
    if adapter and saved_lora(state) is None:
        raise CheckpointError(
            f"--adapter: checkpoint={checkpoint} holds no LoRA adapters (its run trained the whole model, "
            "model.lora=null). Fix: drop --adapter to export the model"
        )
    saved = (state.get("ragen2") or {}).get("model") or {}
    name_or_path = name_or_path or saved.get("name_or_path")
    if name_or_path is None:
        raise CheckpointError(
            f"checkpoint={checkpoint} does not name its base model (an older checkpoint). Fix: --model <the "
            "run's model.name_or_path>"
        )
    try:
        model = load_policy(
            name_or_path, checkpoint, dtype or saved.get("dtype", "float32"), state, merge=not adapter
        )
    except OSError as err:  # transformers' word for a folder or hub name without loadable weights
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"--model={name_or_path} cannot be loaded ({reason}). Fix: --model <the HF folder or hub name the "
            "run trained, with its weights>"
        ) from None
    model.config.use_cache = True
    with replacing_folder(folder) as staged:
        model.save_pretrained(staged)
        load_tokenizer(name_or_path).save_pretrained(staged)
    return folder


def main(argv: list[str] | None = None) -> None:
    set_defaults()
    from ragen2.log import log

    parser = ProgramParser("ragen2-export", ABOUT, EXAMPLES, NOTES)
    parser.add_argument("checkpoint", help="a ragen2 .ckpt, e.g. outputs/<run>/checkpoints/last.ckpt")
    parser.add_argument("out", help="the folder to write (new or empty, unless --overwrite)")
    parser.add_argument(
        "--model",
        default=None,
        help="the base model the run trained (default: the one saved in the checkpoint)",
    )
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    parser.add_argument(
        "--adapter",
        action="store_true",
        help="a LoRA run: write its adapters as a PEFT adapter folder instead of the merged model",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a destination folder that already holds files (its files are removed)",
    )
    args = parser.parse_args(argv)
    try:
        folder = export(args.checkpoint, args.out, args.model, args.dtype, args.overwrite, args.adapter)
    except ConfigError as err:  # the files are the user's to fix: one line, no traceback
        parser.exit(1, f"{parser.prog}: {err}\n")
    log.info("exported HF model folder: %s", folder)


if __name__ == "__main__":
    main()
