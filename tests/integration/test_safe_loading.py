"""A checkpoint is data, never code: every load path reads weights-only, and a file that does not load is one
line naming it and the fix.

The malicious file is what an attacker would share: a real ``torch.save`` checkpoint (a state_dict, an epoch)
with one more entry whose unpickling calls ``os.system``; had it run, a marker file would exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ragen2.config import compose
from ragen2.errors import ConfigError
from ragen2.lifecycle.resume import resolve_ckpt_path
from ragen2.models.checkpoint import load_policy, read_checkpoint

FAST = ("model=tiny", "rollout=scripted", "trainer.limit_val_batches=0", "callbacks.curves=null")


class _RunsShell:
    """Unpickles as ``os.system(command)``."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (self.command,))


def _malicious(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    weights = {"policy.model.embed_tokens.weight": torch.zeros(2, 2)}
    torch.save(
        {"epoch": 0, "global_step": 1, "state_dict": weights, "x": _RunsShell(f"touch {marker}")}, path
    )
    return path


def test_a_malicious_checkpoint_runs_no_code_on_any_load_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragen2.diagnose import run as diagnose
    from ragen2.eval import run as evaluate
    from ragen2.export import main as export
    from ragen2.train import run as train

    marker = tmp_path / "pwned"
    evil = _malicious(tmp_path / "shared.ckpt", marker)
    refused = (
        r"names objects other than tensors and plain values \(.*GLOBAL posix\.system.*\).* was not loaded"
    )

    # ragen2-eval, ragen2-diagnose, ragen2-export (and any script) read through read_checkpoint
    with pytest.raises(ConfigError, match=rf"^checkpoint={evil} {refused}"):
        read_checkpoint(evil)
    with pytest.raises(ConfigError, match=refused):
        load_policy("tiny", str(evil))
    with pytest.raises(ConfigError, match=refused):
        evaluate(compose(["model=tiny", f"checkpoint={evil}", f"output={tmp_path / 'e.json'}"], "eval"))
    with pytest.raises(ConfigError, match=refused):
        diagnose(compose(["model=tiny", f"checkpoint={evil}", f"output={tmp_path / 'd'}"], "diagnose"))
    with pytest.raises(SystemExit) as exited:
        export([str(evil), str(tmp_path / "exported")])
    assert exited.value.code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"ragen2-export: checkpoint={evil} names objects other than tensors")

    # training: an explicit ckpt_path and ckpt_path=auto verify the file first
    with pytest.raises(ConfigError, match=rf"^ckpt_path={evil} {refused}"):
        train(compose([*FAST, f"ckpt_path={evil}"], run_dir=str(tmp_path / "explicit")))
    folder = tmp_path / "job" / "checkpoints"
    _malicious(folder / "last.ckpt", marker)
    good = folder / "last.1.ckpt"
    torch.save({"epoch": 0, "state_dict": {}}, good)
    os.utime(good, (time.time() - 60, time.time() - 60))
    assert resolve_ckpt_path("auto", folder, {"SLURM_JOB_ID": "1"}) == str(good)
    assert not marker.exists()


def test_lightnings_own_resume_is_weights_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ragen2.train import run as train

    marker = tmp_path / "pwned"
    # Lightning's own load (ckpt_path=hpc reaches it unverified) is weights-only too, even where the
    # environment asks torch for full unpickling by default
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    for name, extra in (("hpc_io", []), ("hpc_plain", ["callbacks.checkpoint=null"])):
        run_dir = tmp_path / name
        _malicious(run_dir / "hpc_ckpt_1.ckpt", marker)
        with pytest.raises(Exception, match=r"posix\.system"):
            train(compose([*FAST, "ckpt_path=hpc", *extra], run_dir=str(run_dir)))
    assert not marker.exists()


def _cli(command: list[str], cwd: Path) -> list[str]:
    """The lines a command line prints on failure."""
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stderr.strip().splitlines()


@pytest.mark.slow
def test_garbage_and_empty_checkpoints_are_one_line_on_every_command_line(tmp_path: Path) -> None:
    garbage, empty = tmp_path / "garbage.ckpt", tmp_path / "empty.ckpt"
    garbage.write_bytes(os.urandom(2048))
    empty.write_bytes(b"")
    exe = Path(sys.executable).parent
    fix = "Fix: pass an intact checkpoint (checkpoints/last.1.ckpt holds the save before last.ckpt)"
    commands = {
        "ragen2-eval": [f"checkpoint={garbage}", f"hydra.run.dir={tmp_path / 'eval'}"],
        "ragen2-diagnose": [f"checkpoint={empty}", f"hydra.run.dir={tmp_path / 'diagnose'}"],
        "ragen2-train": ["model=tiny", f"ckpt_path={garbage}", f"hydra.run.dir={tmp_path / 'train'}"],
        "ragen2-export": [str(empty), str(tmp_path / "out")],
    }
    for prog, args in commands.items():
        lines = _cli([str(exe / prog), *args], tmp_path)
        key = "ckpt_path" if prog == "ragen2-train" else "checkpoint"
        file = empty if prog in ("ragen2-diagnose", "ragen2-export") else garbage
        assert len(lines) == 1, (prog, lines)  # no traceback
        assert lines[0].startswith(f"{prog}: {key}={file} is ") and lines[0].endswith(fix), (prog, lines)


def test_a_checkpoint_with_nonfinite_weights_is_refused_on_every_load_path(
    train, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from ragen2.diagnose import run as diagnose
    from ragen2.eval import run as evaluate
    from ragen2.export import main as export
    from ragen2.train import run as train_run

    _, cfg = train(["iterations=1"])
    good = Path(cfg.run_dir) / "checkpoints" / "last.ckpt"
    state = torch.load(good, weights_only=True)
    key = next(
        k for k in state["state_dict"] if k.startswith("policy.model.layers.") and k.endswith("weight")
    )
    state["state_dict"][key].view(-1)[7] = float("nan")
    bad = tmp_path / "diverged.ckpt"
    torch.save(state, bad)
    refused = (
        rf"{bad} holds NaN or inf weights \({re.escape(key)}\): .*Fix: pass a checkpoint with finite weights"
    )

    with pytest.raises(ConfigError, match=rf"^checkpoint={refused}"):
        evaluate(compose(["model=tiny", f"checkpoint={bad}", f"output={tmp_path / 'e.json'}"], "eval"))
    with pytest.raises(ConfigError, match=rf"^checkpoint={refused}"):
        diagnose(compose(["model=tiny", f"checkpoint={bad}", f"output={tmp_path / 'd'}"], "diagnose"))
    with pytest.raises(SystemExit) as exited:
        export([str(bad), str(tmp_path / "exported")])
    assert exited.value.code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert re.match(rf"^ragen2-export: checkpoint={refused}", line), line
    assert not (tmp_path / "exported").exists()
    # training: at start-up, before a model is built, rather than in the middle of the first iteration
    with pytest.raises(ConfigError, match=rf"^ckpt_path={refused}"):
        train_run(compose([*FAST, f"ckpt_path={bad}"], run_dir=str(tmp_path / "resumed")))
    # ckpt_path=auto passes over a diverged newest file to the save before it, saying why
    folder = tmp_path / "job" / "checkpoints"
    folder.mkdir(parents=True)
    os.link(good, folder / "last.1.ckpt")
    os.utime(folder / "last.1.ckpt", (time.time() - 60, time.time() - 60))
    os.link(bad, folder / "last.ckpt")
    assert resolve_ckpt_path("auto", folder, {"SLURM_JOB_ID": "1"}) == str(folder / "last.1.ckpt")
    assert any("holds NaN or inf weights" in r.getMessage() for r in caplog.records)
