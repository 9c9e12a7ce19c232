"""Settings that used to end in a traceback or in Hydra's several-line errors, on the real programs: each is one
line on stderr, ``<program>: <key>=<value> … Fix: …``, exit status 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

BIN = Path(sys.executable).parent
TRAIN = ("ragen2-train", "debug=fast")

# (case id, program and arguments, the line), the folder-dependent ones below
CASES = [
    (
        "an option a group does not have",
        (*TRAIN, "env=nope"),
        "ragen2-train: env=nope is not a config of env. Fix: env=<one of bandit, countdown, deepcoder, frozenlake, "
        "gem, metamathqa, openenv, reasoning_gym, searchqa, sokoban, sokoban_8x8, twohop, verifiers, webshop>",
    ),
    (
        "a key that is not there, without +",
        (*TRAIN, "env.kwargs.foo=1"),
        "ragen2-train: env.kwargs.foo=1 is not a key of the config. Fix: +env.kwargs.foo=1 to add one",
    ),
    (
        "another framework's name for a key",
        (*TRAIN, "algo.clip_ratio_high=0.3"),
        "ragen2-train: algo.clip_ratio_high=0.3 is not a key of the config. Fix: algo.policy_loss.fn.clip_high=0.3, "
        "or +algo.clip_ratio_high=0.3 to add one",
    ),
    (
        "+ on a key that is there",
        (*TRAIN, "+seed=1"),
        "ragen2-train: +seed=1 adds a key that is already there. Fix: seed=1",
    ),
    (
        "a sweep without --multirun",
        (*TRAIN, "seed=0,1"),
        "ragen2-train: seed=0,1 holds several values. Fix: --multirun seed=0,1 to sweep them, or seed=[0,1] for a "
        "list",
    ),
    (
        "the run's length set on the trainer",
        (*TRAIN, "trainer.max_epochs=abc"),
        "ragen2-train: trainer.max_epochs='abc': a run's length is set by iterations (one RL iteration per Lightning "
        "epoch; trainer.max_epochs follows it). Fix: iterations=1",
    ),
    (
        "a logger that would never write",
        (*TRAIN, "logger.csv.flush_logs_every_n_steps=0"),
        "ragen2-train: logger.csv.flush_logs_every_n_steps=0 must be ≥ 1 (the logger writes its rows to disk every N "
        "iterations). Fix: logger.csv.flush_logs_every_n_steps=1",
    ),
    (
        "a negative temperature in eval",
        ("ragen2-eval", "model=tiny", "num_seeds=1", "rollout.temperature=-1"),
        "ragen2-eval: rollout.temperature=-1 must be ≥ 0 (0 = greedy). Fix: rollout.temperature=1.0",
    ),
    (
        "a DeepCoder interpreter that is no Python",
        (*TRAIN, "env=deepcoder", "env.kwargs.python=/bin/false"),
        "ragen2-train: env.kwargs of ragen2/DeepCoder-v0: python=/bin/false does not run as a Python interpreter "
        "(exit status 1, nothing on stderr). Fix: change the env.kwargs named (conf/env/ holds each env's defaults)",
    ),
]


def _one_line(args: tuple[str, ...], cwd: Path) -> str:
    done = subprocess.run(
        [str(BIN / args[0]), *args[1:]], capture_output=True, text=True, cwd=cwd, timeout=600
    )
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize(("args", "line"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_line(args: tuple[str, ...], line: str, tmp_path: Path) -> None:
    assert _one_line((*args, f"hydra.run.dir={tmp_path / 'run'}"), tmp_path) == line


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_a_gpu_that_is_not_there(tmp_path: Path) -> None:
    assert _one_line((*TRAIN, "trainer.accelerator=gpu", f"hydra.run.dir={tmp_path}"), tmp_path) == (
        "ragen2-train: trainer.accelerator=gpu but this machine has no CUDA device (torch.cuda.is_available() is "
        "False). Fix: trainer.accelerator=cpu (or auto)"
    )


@pytest.mark.parametrize(
    "args",
    [
        ("ragen2-eval", "model=tiny", "num_seeds=1"),
        ("ragen2-diagnose", "model=tiny", "num_seeds=2", "samples=2"),
    ],
    ids=["eval", "diagnose"],
)
def test_a_run_folder_that_cannot_be_written(args: tuple[str, ...], tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    run_dir = tmp_path / "a-file" / "run"
    assert _one_line((*args, f"hydra.run.dir={run_dir}"), tmp_path) == (
        f"{args[0]}: hydra.run.dir={run_dir} cannot be written: {tmp_path / 'a-file'} is a file, not a folder. "
        "Fix: hydra.run.dir=<a writable folder>"
    )


def test_a_warm_start_folder_that_cannot_be_written(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    run_dir = tmp_path / "a-file" / "run"
    assert _one_line(("ragen2-warmstart", "model=tiny", f"hydra.run.dir={run_dir}"), tmp_path) == (
        f"ragen2-warmstart: run_dir={run_dir} cannot be written: {tmp_path / 'a-file'} is a file, not a folder. "
        "Fix: run_dir=<a writable folder>, or hydra.run.dir=<a writable folder>"
    )


def test_an_empty_export_destination_names_no_folder(tmp_path: Path) -> None:
    assert _one_line(("ragen2-export", str(tmp_path / "last.ckpt"), ""), tmp_path) == (
        "ragen2-export: out='' names no folder. Fix: out=<a new folder>, e.g. exported/<run>"
    )


def test_ctrl_c_ends_with_the_checkpoint_to_continue_from(tmp_path: Path) -> None:
    import os
    import signal
    import time

    run_dir = tmp_path / "run"
    run = subprocess.Popen(
        [str(BIN / "ragen2-train"), "debug=fast", "iterations=200", f"hydra.run.dir={run_dir}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(
            signal.SIGINT, signal.SIG_DFL
        ),  # (a shell's background jobs ignore it)
    )
    last = run_dir / "checkpoints" / "last.ckpt"
    for _ in range(1200):
        if last.is_file() or run.poll() is not None:
            break
        time.sleep(0.25)
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=300)
    assert run.returncode == 1
    line = next(line for line in out.splitlines() if "Ctrl-C" in line)
    assert line.startswith("[ragen2] WARNING: Ctrl-C: stopped in iteration "), line
    assert line.endswith(f", which is not saved. Continue with ckpt_path={last}"), line
    assert not os.path.exists(run_dir / ".ragen2.lock")  # the folder is free again


def test_eval_composes_the_checkpoints_env_before_the_command_lines_keys(tmp_path: Path) -> None:
    """A FrozenLake run's checkpoint with ``env.kwargs.p=0.8`` (a FrozenLake option): composed on FrozenLake's
    config, not eval's default Sokoban (which has no ``p``)."""
    import json

    run_dir = tmp_path / "run"
    done = subprocess.run(
        [str(BIN / "ragen2-train"), "debug=fast", "env.kwargs.size=3", f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "eval.json"
    evaluated = subprocess.run(
        [
            str(BIN / "ragen2-eval"),
            f"checkpoint={run_dir / 'checkpoints' / 'last.ckpt'}",
            "env.kwargs.p=0.8",
            "num_seeds=1",
            "samples=0",
            "oracle=false",
            f"output={out}",
            f"hydra.run.dir={tmp_path / 'eval'}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads(out.read_text())["env"] == "ragen2/FrozenLake-v0"
    config = (tmp_path / "eval" / ".hydra" / "overrides.yaml").read_text()
    assert config.splitlines()[0] == "- env=frozenlake"  # the option chosen for the checkpoint, on record


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (TRAIN, "truncated"),
        (("ragen2-eval", "num_seeds=1"), "sizes"),
        (("ragen2-diagnose", "num_seeds=2", "samples=2"), "garbage tokenizer"),
        (("ragen2-warmstart",), "garbage tokenizer"),
    ],
    ids=["train", "eval", "diagnose", "warmstart"],
)
def test_a_broken_model_folder_is_one_line_in_every_program(
    args: tuple[str, ...], kind: str, tmp_path: Path
) -> None:
    from unit.test_models import _broken

    folder = _broken(tmp_path, kind)
    line = _one_line((*args, f"model.name_or_path={folder}", f"hydra.run.dir={tmp_path / 'run'}"), tmp_path)
    assert line.startswith(f"{args[0]}: model.name_or_path='{folder}' holds "), line
    assert line.endswith(
        "Fix: the folder save_pretrained wrote (config.json, weights, tokenizer files), or builtin / tiny"
    )


@pytest.fixture(scope="module")
def frozenlake_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    done = subprocess.run(
        [str(BIN / "ragen2-train"), "debug=fast", f"hydra.run.dir={run_dir}"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize(
    "args",
    [("ragen2-eval", "num_seeds=1"), ("ragen2-diagnose", "num_seeds=2", "samples=2")],
    ids=["eval", "diagnose"],
)
def test_a_checkpoint_of_another_model_is_one_line(
    args: tuple[str, ...], frozenlake_checkpoint: Path, tmp_path: Path
) -> None:
    from test_config_errors import _other_shapes

    narrow = _other_shapes(tmp_path)
    line = _one_line(
        (
            *args,
            f"checkpoint={frozenlake_checkpoint}",
            f"model.name_or_path={narrow}",
            f"hydra.run.dir={tmp_path / 'r'}",
        ),
        tmp_path,
    )
    assert line.startswith(
        f"{args[0]}: checkpoint={frozenlake_checkpoint} holds the weights of another model than "
        f"model.name_or_path={narrow} ("
    ), line
    assert line.endswith("Fix: model.name_or_path=tiny (the checkpoint's)"), line
