"""LastCheckpoint under two CPU ranks (gloo), trainer=ddp and trainer=fsdp (FSDP2), launched as real processes.

- One rank's weights turn NaN (under FSDP2: an element of that rank's own shard, which the other rank never
  sees): both ranks refuse the save together (one all-reduce, no hang) and the files on disk keep the last
  finite weights.
- SIGTERM reaches one rank only: both ranks finish the iteration, save it and exit with status 143.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ragen2.models.checkpoint import read_checkpoint

HERE = Path(__file__).resolve().parent
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _train(run: Path, strategy: str, fault: str, iteration: int, rank: int) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "ragen2.train",
        f"trainer={strategy}",
        "model=tiny",
        "rollout=scripted",
        "rollout.groups=8",
        "algo.mini_batch_size=8",
        "trainer.limit_val_batches=0",
        "callbacks.curves=null",
        "iterations=4",
        f"+callbacks.fault._target_=integration.checkpoint_faults.{fault}",
        f"+callbacks.fault.iteration={iteration}",
        f"+callbacks.fault.rank={rank}",
        f"hydra.run.dir={run}",
    ]
    path = os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    return subprocess.run(command, cwd=run.parent, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_nan_weights_on_one_rank_are_never_saved(strategy: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = _train(run, strategy, "PoisonWeights", iteration=1, rank=1)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-4000:]
    assert "NonFiniteWeightsError: iteration 1: trained parameters hold NaN or inf " in out, out[-4000:]
    assert "policy.model.embed_tokens.weight (rank 1)" in out
    folder = run / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]  # iteration 0's, untouched
    state = read_checkpoint(folder / "last.ckpt")
    assert state["epoch"] == 0
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values() if v.is_floating_point())


def test_sigterm_to_one_rank_stops_both_after_saving_the_iteration(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = _train(run, "ddp", "Sigterm", iteration=1, rank=1)
    out = done.stdout + done.stderr
    assert done.returncode == 143, out[-4000:]
    folder = run / "checkpoints"
    assert [read_checkpoint(folder / n)["epoch"] for n in ("last.ckpt", "last.1.ckpt")] == [1, 0]
    assert f"SIGTERM: iteration 1 saved to {folder / 'last.ckpt'}; stopping with exit status 143" in out
