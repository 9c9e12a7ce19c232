"""SLURM preemption on a real local cluster.

- USR2 mid-run → submitit requeues → the job resumes from last.ckpt. The same signal SLURM sends
  ``--signal=USR2@signal_delay_s`` before a job's time limit (and that submitit's own ``job._interrupt()`` sends
  to simulate one). The requeued job re-runs the same Hydra job in the same run folder with ``ckpt_path=auto``;
  every logger continues its history there.
- ``scancel`` (SIGTERM, then SIGKILL after SLURM's KillWait, 30 s by default) mid-run → the iteration in
  progress finishes, is saved (though not a due save) and the job ends before the SIGKILL; a later run given
  that checkpoint continues from the next iteration.
"""

from __future__ import annotations

import csv
import re
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.test_slurm import slurm_cluster  # noqa: F401  (the fixture: a one-node cluster)
from ragen2.config import compose
from ragen2.loggers import wandb_run_id
from ragen2.models.checkpoint import read_checkpoint
from ragen2.train import run

ITERATIONS = 3
TASK = ["model=tiny", "rollout=scripted", "trainer.limit_val_batches=0", "~callbacks.curves"]


def _iterations(metrics: Path) -> list[int]:
    if not metrics.is_file():
        return []
    with metrics.open(newline="") as f:
        return [int(float(r["train/iteration"])) for r in csv.DictReader(f) if r.get("train/iteration")]


def _wandb_records(path: Path) -> Iterator[Any]:
    """The protobuf records of a ``run-<id>.wandb`` file (wandb's LevelDB-style log: 32 KiB blocks of
    chunks with a 7-byte header: crc32c, length, type full/first/middle/last), after its 7-byte file header."""
    from wandb.proto import wandb_internal_pb2

    data, pos, pending = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (kind == 0 and length == 0):  # block padding
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def _job_log(sweep_dir: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sweep_dir.glob(".submitit/*/*_log.out"))


def _launch(sweep_dir: Path, env: dict[str, str], *overrides: str) -> subprocess.Popen[str]:
    """A one-job ``ragen2-train --multirun`` through submitit's SLURM launcher on the local cluster."""
    command = [
        sys.executable,
        "-m",
        "ragen2.train",
        "--multirun",
        "hydra/launcher=slurm",
        "hydra.launcher.partition=debug",
        "hydra.launcher.cpus_per_task=2",
        "hydra.launcher.mem_gb=4",
        "hydra.launcher.gpus_per_node=null",
        f"hydra.sweep.dir={sweep_dir}",
        *TASK,
        *overrides,
    ]
    return subprocess.Popen(
        command, cwd=sweep_dir.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.slow
def test_usr2_requeues_and_the_run_resumes_with_its_history(
    slurm_cluster: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    sweep_dir = tmp_path / "sweep"
    run_dir = sweep_dir / "0"
    launcher = _launch(  # ckpt_path is left at its default, auto
        sweep_dir,
        slurm_cluster,
        "hydra.launcher.timeout_min=15",  # submitit counts a signal in the first 5 min as a preemption
        "logger=wandb",
        f"iterations={ITERATIONS}",
    )
    try:
        # mid-run: iteration 0 is logged and checkpointed, the others are still to come
        deadline = time.monotonic() + 120
        while not (
            _iterations(run_dir / "csv" / "metrics.csv") and (run_dir / "checkpoints" / "last.ckpt").is_file()
        ):
            assert launcher.poll() is None, launcher.communicate()[0][-3000:]
            assert time.monotonic() < deadline, _job_log(sweep_dir)[-3000:]
            time.sleep(0.5)
        (job_dir,) = [p for p in (sweep_dir / ".submitit").iterdir() if re.fullmatch(r"\d+(_\d+)?", p.name)]
        job_id = job_dir.name
        subprocess.run(["scancel", "--signal=USR2", job_id], env=slurm_cluster, check=True, timeout=30)
        out, _ = launcher.communicate(timeout=420)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    log = _job_log(sweep_dir)
    assert launcher.returncode == 0, out[-3000:] + log[-3000:]

    # checkpoint → requeue → resume, on the real path: submitit's handler requeued, the job started again
    assert "Caught signal SIGUSR2" in log and "Exiting gracefully after preemption/timeout" in log, log[
        -3000:
    ]
    assert re.search(r"\[ragen2\] SLURM_JOB_ID=\d+ .* restart 1\b", log), log[-3000:]
    resumed = re.search(r"ckpt_path=auto: resuming from (\S+) \(SLURM restart 1\)", log)
    assert resumed and Path(resumed.group(1)) == run_dir / "checkpoints" / "last.ckpt", log[-3000:]
    assert "Job completed successfully" in log
    assert "Requeuing SLURM job" not in log and "hpc_ckpt" not in log  # Lightning never requeued
    assert not list(run_dir.glob("**/hpc_ckpt_*.ckpt"))

    # every iteration exactly once in metrics.csv, and the run ended at the right iteration
    assert _iterations(run_dir / "csv" / "metrics.csv") == list(range(ITERATIONS))
    assert read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["epoch"] == ITERATIONS - 1

    # TensorBoard: one value per step (the restart marker hides anything the first attempt logged after)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/iteration")] == list(range(ITERATIONS))
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one per attempt

    # wandb offline: one folder per attempt (in start order), both the one run whose id the run folder
    # gives, and between them every iteration's row: the second attempt's from the iteration it resumed at
    # on. When USR2 lands after an iteration was logged and before it was saved, that iteration's row stays
    # in the first attempt's file too (wandb cannot rewind offline; docs/reliability.md)
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 2, offline
    run_ids, attempts = set(), []
    for folder in offline:
        logged = []
        for record in _wandb_records(next(folder.glob("run-*.wandb"))):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_ids.add(record.run.run_id)
            elif kind == "history":
                # "a/b" keys are stored split: nested_key ["a", "b"]
                row = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
                if "train/iteration" in row:
                    logged.append(int(float(row["train/iteration"])))
        attempts.append(logged)
    assert run_ids == {wandb_run_id(run_dir)}
    first, second = attempts
    resumed_at = second[0] if second else ITERATIONS
    assert 1 <= resumed_at < ITERATIONS and second == list(range(resumed_at, ITERATIONS)), attempts
    assert first in (list(range(resumed_at)), list(range(resumed_at + 1))), attempts


def _job_state(job_id: str, env: dict[str, str]) -> str:
    done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env, capture_output=True, text=True)
    return done.stdout.strip()


@pytest.mark.slow
def test_scancel_saves_the_iteration_in_progress_and_a_later_run_continues_from_it(
    slurm_cluster: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    iterations = 5
    sweep_dir = tmp_path / "sweep"
    run_dir = sweep_dir / "0"
    every = "callbacks.checkpoint.every_n_iterations=3"  # due: iteration 2 and the last; 1 is not
    launcher = _launch(sweep_dir, slurm_cluster, every, f"iterations={iterations}")
    metrics = run_dir / "csv" / "metrics.csv"
    try:
        deadline = time.monotonic() + 180
        while not _iterations(metrics):  # iteration 0 is logged: iteration 1 is under way
            assert launcher.poll() is None, launcher.communicate()[0][-3000:]
            assert time.monotonic() < deadline, _job_log(sweep_dir)[-3000:]
            time.sleep(0.2)
        (job_dir,) = [p for p in (sweep_dir / ".submitit").iterdir() if re.fullmatch(r"\d+(_\d+)?", p.name)]
        logged_before = _iterations(metrics)[-1]
        sent = time.monotonic()
        subprocess.run(["scancel", job_dir.name], env=slurm_cluster, check=True, timeout=30)
        while _job_state(job_dir.name, slurm_cluster) in ("RUNNING", "COMPLETING"):
            assert time.monotonic() - sent < 120, _job_log(sweep_dir)[-3000:]
            time.sleep(0.2)
        ended = time.monotonic() - sent
    finally:
        launcher.kill()  # it waits on the job's result, which a cancelled job never writes
        launcher.communicate()
    log = _job_log(sweep_dir)
    stopped = _iterations(metrics)[-1]
    # the iteration under way when SIGTERM came was finished, logged and saved; then the job ended by itself,
    # before SLURM's SIGKILL (KillWait, 30 s after the SIGTERM). Under way: the one just logged when the signal
    # came before its end's hooks (the checkpoint's, the summary line's: its row is written at its batch's end),
    # else the next, or the one after it when the signal came late
    assert logged_before <= stopped <= logged_before + 2 and stopped < iterations - 1, log[-3000:]
    assert _iterations(metrics) == list(range(stopped + 1))
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    assert f"SIGTERM: iteration {stopped} saved to {ckpt}; stopping with exit status 143" in log, log[-3000:]
    assert ended < 30, (ended, log[-3000:])
    state = read_checkpoint(ckpt)
    assert state["epoch"] == stopped and any(k.startswith("policy.") for k in state["state_dict"])

    # a later run given that checkpoint goes on from the next iteration, in the same run folder
    run(compose([*TASK, every, f"iterations={iterations}", f"ckpt_path={ckpt}"], run_dir=str(run_dir)))
    assert _iterations(metrics) == list(range(iterations))
    assert read_checkpoint(ckpt)["epoch"] == iterations - 1
