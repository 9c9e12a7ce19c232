"""The fault matrix: every program × every folder or file it writes × {already holds results, cannot be written,
holds the program's input, a second writer at the same time, a full disk}. Each cell runs the real program (in
process, the tiny model) and checks that it ends in one line naming the key and the fix (or, for a full disk,
the error of the write) and that every file there before is byte for byte as it was. The cells that do not
apply are listed in ``NOT_APPLICABLE`` with the reason (docs/reliability.md shows the table)."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from integration.conftest import FAST
from integration.test_output_guard import _hashes
from ragen2.config import compose
from ragen2.errors import ConfigError
from ragen2.lifecycle.folder import LOCK

FAULTS = ("holds results", "unwritable", "holds the input", "second writer", "disk full")
DESTINATIONS = (
    ("ragen2-train", "run folder"),
    ("ragen2-train", "logger folder"),
    ("ragen2-eval", "output"),
    ("ragen2-diagnose", "output"),
    ("ragen2-warmstart", "output"),
    ("ragen2-warmstart", "run folder"),
    ("ragen2-export", "destination"),
)
NOT_APPLICABLE = {
    ("ragen2-train", "run folder", "holds the input"): "a run folder holds its input only to continue it",
    ("ragen2-train", "logger folder", "holds the input"): "a logger reads nothing",
    ("ragen2-train", "logger folder", "disk full"): "the CSV rows are appended and flushed each iteration",
    ("ragen2-warmstart", "run folder", "holds the input"): "a folder holding its model source is refused as "
    "its output (the model lands in <run>/model)",
    ("ragen2-warmstart", "run folder", "disk full"): "the model is the only file it replaces (output)",
}
CELLS = [(p, d, f) for p, d in DESTINATIONS for f in FAULTS if (p, d, f) not in NOT_APPLICABLE]
NO_ROOM = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny FrozenLake run's last.ckpt (the input of eval, diagnose and export)."""
    from ragen2.train import run

    run_dir = tmp_path_factory.mktemp("trained") / "run"
    run(compose([*FAST, "iterations=1"], run_dir=str(run_dir)))
    return run_dir / "checkpoints" / "last.ckpt"


def _program(program: str, kind: str, dest: Path, tmp: Path, ckpt: Path) -> Callable[..., object]:
    """The program writing to ``dest`` (as ``kind``), called with extra overrides."""
    if program == "ragen2-train":
        from ragen2.train import run as train

        if kind == "run folder":
            return lambda *more: train(compose([*FAST, "iterations=1", *more], run_dir=str(dest)))
        logger = f"logger.csv.save_dir={dest}"
        return lambda *more: train(compose([*FAST, "iterations=1", logger, *more], run_dir=str(tmp / "run")))
    if program in ("ragen2-eval", "ragen2-diagnose"):
        import importlib

        name = program.removeprefix("ragen2-")
        run = importlib.import_module(f"ragen2.{name}").run
        samples = "samples=0" if name == "eval" else "samples=2"  # diagnose scores two samples a seed
        args = [
            "model=tiny",
            "rollout=scripted",
            "num_seeds=2",
            samples,
            f"checkpoint={ckpt}",
            f"output={dest}",
        ]
        return lambda *more: run(compose([*args, *more], config_name=name))
    if program == "ragen2-warmstart":
        from ragen2.warmstart import run as warmstart

        args = [
            "model=tiny",
            "demos.episodes=4",
            "sft.steps=1",
            "sft.batch_size=4",
            "trainer.accelerator=cpu",
        ]
        run_dir, out = (dest, dest / "model") if kind == "run folder" else (tmp / "wrun", dest)
        return lambda *more: warmstart(
            compose([*args, f"output={out}", *more], config_name="warmstart", run_dir=str(run_dir))
        )
    from ragen2.export import export

    return lambda *more: export(str(ckpt), str(dest), overwrite="overwrite=true" in more)


def _earlier(program: str, kind: str, dest: Path) -> None:
    """What an earlier run left at ``dest``."""
    files = {
        ("ragen2-train", "run folder"): {
            "csv/metrics.csv": "step,loss\n0,1.0\n",
            "checkpoints/last.ckpt": "ckpt",
        },
        ("ragen2-train", "logger folder"): {"csv/metrics.csv": "step,loss\n0,1.0\n"},
        ("ragen2-eval", "output"): {"": '{"success": 0.5}'},
        ("ragen2-diagnose", "output"): {
            "metrics.json": "{}",
            "heatmap.png": "png",
            "index.md": "# a report\n",
        },
        ("ragen2-warmstart", "output"): {"config.json": "{}", "model.safetensors": "weights"},
        ("ragen2-warmstart", "run folder"): {"model/config.json": "{}", "model/model.safetensors": "weights"},
        ("ragen2-export", "destination"): {"config.json": "{}", "model.safetensors": "weights"},
    }[(program, kind)]
    for name, text in files.items():
        path = dest / name if name else dest
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _lock_of(program: str, kind: str, dest: Path) -> Path:
    """Where the program's lock for ``dest`` lies."""
    if program == "ragen2-export":
        return dest.parent / f".{dest.name}{LOCK}"  # beside the folder it replaces as a whole
    if (program, kind) in (("ragen2-train", "run folder"), ("ragen2-train", "logger folder")):
        return dest / (LOCK if kind == "run folder" else f"csv/{LOCK}")
    if (program, kind) == ("ragen2-warmstart", "run folder"):
        return dest / LOCK
    return dest.parent / LOCK  # eval's, diagnose's and warmstart's output: the folder it lands in


@pytest.mark.parametrize(("program", "kind", "fault"), CELLS, ids=[" × ".join(c) for c in CELLS])
def test_fault_matrix(
    program: str, kind: str, fault: str, checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "out" / ("eval.json" if program == "ragen2-eval" else "dest")
    (tmp_path / "out").mkdir()
    ckpt = checkpoint
    run = _program(program, kind, dest, tmp_path, ckpt)
    more: tuple[str, ...] = ()
    expected = ConfigError
    if fault == "holds results":
        _earlier(program, kind, dest)
        said = r"(would replace an earlier run's results|already holds|holds a run's metrics)"
    elif fault == "unwritable":
        (tmp_path / "out" / "a-file").write_text("a file")
        dest = tmp_path / "out" / "a-file" / dest.name
        run = _program(program, kind, dest, tmp_path, ckpt)
        said = r"cannot be written: .*a-file is a file, not a folder"
    elif fault == "holds the input":
        if program == "ragen2-warmstart":  # its model source
            from ragen2.models.loading import resolve_model_path

            source = Path(resolve_model_path("tiny"))
            run = _program(program, kind, source, tmp_path, ckpt)
            more, dest = (f"model.name_or_path={source}",), source
        else:  # the checkpoint, or the folder that holds it
            dest = ckpt if program == "ragen2-eval" else ckpt.parent
            run = _program(program, kind, dest, tmp_path, ckpt)
        said = r"(holds checkpoint|holds rollouts|holds model\.name_or_path|is or holds|holds what it reads|a run writes no results over|is the training run|is in the training run)"
    elif fault == "second writer":
        lock = _lock_of(program, kind, dest)
        lock.parent.mkdir(parents=True, exist_ok=True)
        holder = f'{{"program": "ragen2-train", "host": "{socket.gethostname()}", "pid": {os.getppid()}, "job": null, "since": "t"}}'
        lock.write_text(holder)  # a live process of this host: pytest's parent
        said = rf"is in use by ragen2-train \(host {socket.gethostname()}, pid {os.getppid()}, since t\)"
    else:  # a full disk as the result is written, over an earlier one that overwrite=true would replace
        if program == "ragen2-train":
            run()  # one iteration; its resume fills the disk at the save
            more, said = ("iterations=2", "ckpt_path=last"), r"(No space left on device|disk|full)"
        else:
            _earlier(program, kind, dest)
            more, said = ("overwrite=true",), "No space left on device"
        expected = (OSError, ConfigError)  # type: ignore[assignment]

        def full(fd: int) -> None:
            raise NO_ROOM

        monkeypatch.setattr(os, "fsync", full)
    # what must come out byte for byte: everything under out/, the input's folder, and for a resumed run's full
    # disk its checkpoints (its metrics.csv gains the new iteration's row before the save)
    watch = tmp_path / "out"
    if fault == "holds the input":
        watch = dest if dest.is_dir() else dest.parent
    elif (program, fault) == ("ragen2-train", "disk full"):
        watch = dest / "checkpoints" if kind == "run folder" else tmp_path / "run" / "checkpoints"
    before = _hashes(watch)
    with pytest.raises(expected, match=said) as err:  # type: ignore[arg-type]
        run(*more)
    if isinstance(err.value, ConfigError):
        assert "\n" not in str(err.value) and "Fix:" in str(err.value), str(err.value)
    monkeypatch.undo()
    after = _hashes(watch)
    lost = {
        name for name in before if after.get(name) != before[name] and not name.endswith(("train.log", LOCK))
    }
    assert not lost, f"changed or removed: {sorted(lost)}"


@pytest.mark.parametrize("program", ["eval", "diagnose"])
def test_an_output_inside_the_model_folder_it_reads_is_refused(program: str, tmp_path: Path) -> None:
    import importlib
    import shutil

    from ragen2.models.loading import resolve_model_path

    model = Path(shutil.copytree(resolve_model_path("tiny"), tmp_path / "model"))
    before = _hashes(model)
    out = model / ("eval.json" if program == "eval" else "report")
    args = ["rollout=scripted", "num_seeds=2", "samples=4", f"model.name_or_path={model}", f"output={out}"]
    kind = "file" if program == "eval" else "folder"
    with pytest.raises(
        ConfigError,
        match=rf"^output={out} lies in model\.name_or_path={model}: .*Fix: output=<a {kind} outside it>$",
    ):
        importlib.import_module(f"ragen2.{program}").run(compose(args, config_name=program))
    assert _hashes(model) == before and sorted(p.name for p in model.iterdir()) == sorted(before)
