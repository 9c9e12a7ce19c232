"""One program per folder at a time (``ragen2.lifecycle.folder.claim``), and Hydra's record written only once the checks
pass: two real ``ragen2-train`` runs into one folder (the second refused in one line naming the first), a lock
left by a killed run (taken over), a requeued SLURM job's own lock (taken back) and another job's (refused), a
resume with another seed (refused before anything is written), and the lock file's rules on their own."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from integration.conftest import FAST
from integration.test_output_guard import _hashes as every_hash
from ragen2.errors import ConfigError
from ragen2.lifecycle.folder import LOCK, Holder, job_rank, release, take

TRAIN = [sys.executable, "-m", "ragen2.train", *FAST]


def _hashes(folder: Path) -> dict[str, str]:
    """``test_output_guard._hashes`` but for train.log, where a refusal appends its own line."""
    return {name: digest for name, digest in every_hash(folder).items() if Path(name).name != "train.log"}


def _ended_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(done.stdout)


def _lock(folder: Path, **fields: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    holder = {"program": "ragen2-train", "host": socket.gethostname(), "pid": os.getpid(), "job": None}
    (folder / LOCK).write_text(json.dumps({**holder, "since": "2026-01-01 00:00:00", **fields}))
    return folder / LOCK


# ---- the lock file's rules ------------------------------------------------------------------------------------
def test_a_live_holder_keeps_the_folder_and_a_released_lock_is_gone(tmp_path: Path) -> None:
    first, second = (
        Holder("ragen2-train", "h", 1, None, "t"),
        Holder("ragen2-eval", "other-host", 2, None, "t"),
    )
    take(tmp_path / LOCK, first)
    with pytest.raises(ConfigError) as refused:
        take(tmp_path / LOCK, second)
    assert str(refused.value) == (
        f"{tmp_path} is in use by ragen2-train (host h, pid 1, since t): two runs in one folder would interleave "
        "their metrics and checkpoints. Fix: wait for it to end, or a new folder (hydra.run.dir=<folder>); if that "
        f"process is gone, delete {tmp_path / LOCK}"
    )
    release(tmp_path / LOCK, second)  # not the holder: the lock stays
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == 1
    release(tmp_path / LOCK, first)
    assert not (tmp_path / LOCK).exists()


def test_who_gives_way() -> None:
    here, dead = socket.gethostname(), _ended_pid()
    me = Holder("ragen2-train", here, os.getpid(), "7")
    assert Holder("ragen2-train", "elsewhere", 1, "7").gives_way_to(
        me
    )  # the same job, requeued on another node
    assert Holder("ragen2-train", here, dead, "6").gives_way_to(
        me
    )  # another job whose process has ended here
    assert Holder("ragen2-train", here, dead).gives_way_to(me)
    assert not Holder("ragen2-train", "elsewhere", dead, "6").gives_way_to(me)  # not known to have ended
    assert not Holder("ragen2-train", here, os.getppid()).gives_way_to(me)  # alive
    assert not Holder("ragen2-train", "elsewhere", 1).gives_way_to(me)


def test_only_rank_zero_claims() -> None:
    assert job_rank({}) == 0
    assert job_rank({"LOCAL_RANK": "1"}) == 1
    assert job_rank({"SLURM_PROCID": "3"}) == 3
    assert job_rank({"RANK": "0", "LOCAL_RANK": "1"}) == 0  # the global rank comes first


def test_a_lock_cut_short_by_a_crash_holds_nothing(tmp_path: Path) -> None:
    (tmp_path / LOCK).write_text('{"program": "ragen2-tr')
    take(tmp_path / LOCK, Holder("ragen2-train", "h", 5))
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == 5


# ---- the real program ------------------------------------------------------------------------------------------
def test_two_runs_into_one_folder_at_once_the_second_is_refused_in_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        [*TRAIN, "iterations=30", f"hydra.run.dir={run_dir}"], stderr=subprocess.PIPE, text=True
    )
    try:
        for _ in range(600):  # until the first holds the folder
            if (run_dir / LOCK).is_file() and (run_dir / LOCK).read_text():
                break
            time.sleep(0.1)
        holder = json.loads((run_dir / LOCK).read_text())
        second = subprocess.run(
            [*TRAIN, "iterations=31", "ckpt_path=last", f"hydra.run.dir={run_dir}"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert second.returncode == 1
        assert second.stderr.splitlines() == [
            f"ragen2-train: {run_dir} is in use by ragen2-train (host {holder['host']}, pid {first.pid}, since "
            f"{holder['since']}): two runs in one folder would interleave their metrics and checkpoints. Fix: wait "
            f"for it to end, or a new folder (hydra.run.dir=<folder>); if that process is gone, delete "
            f"{run_dir / LOCK}"
        ]
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=300)
    assert not (run_dir / LOCK).exists()  # released as the first run stopped


def test_a_killed_runs_lock_is_taken_over_by_its_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [*TRAIN, "iterations=1", f"hydra.run.dir={run_dir}"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    dead = _ended_pid()
    _lock(run_dir, pid=dead)  # as a run killed with SIGKILL leaves it
    resumed = subprocess.run(
        [*TRAIN, "iterations=2", "ckpt_path=last", f"hydra.run.dir={run_dir}"], capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (
        f"the lock of ragen2-train (host {socket.gethostname()}, pid {dead},"
        in resumed.stdout + resumed.stderr
    )
    assert not (run_dir / LOCK).exists()


@pytest.mark.parametrize("job", ["41", "42"])
def test_a_requeued_slurm_job_takes_its_own_lock_back_and_another_job_is_refused(
    tmp_path: Path, job: str
) -> None:
    run_dir = tmp_path / "run"
    _lock(run_dir, host="another-node", pid=1, job="41")
    done = subprocess.run(
        [*TRAIN, f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_JOB_ID": job},
    )
    if job == "41":  # the job's own earlier attempt, on another node: taken back, and released at the end
        assert done.returncode == 0, done.stderr[-3000:]
        assert not (run_dir / LOCK).exists()
    else:
        assert done.returncode == 1
        assert done.stderr.splitlines()[0].startswith(
            f"ragen2-train: {run_dir} is in use by ragen2-train (SLURM job 41, host another-node, pid 1, since "
        )
        assert not (run_dir / ".hydra").exists()  # nothing written: not even Hydra's record


def test_a_resume_with_another_seed_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [*TRAIN, "iterations=1", "seed=5", f"hydra.run.dir={run_dir}"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    before = _hashes(run_dir)
    # ckpt_path=last, and ckpt_path=auto in an salloc shell (SLURM_JOB_ID set: a job restarted in place)
    for how, env in (("ckpt_path=last", {}), ("ckpt_path=auto", {"SLURM_JOB_ID": "9"})):
        refused = subprocess.run(
            [*TRAIN, "iterations=2", "seed=9", how, f"hydra.run.dir={run_dir}"],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
        )
        assert refused.returncode == 1
        line = refused.stderr.splitlines()
        assert len(line) == 1 and line[0].startswith(
            f"ragen2-train: ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'} continues a run of seed=5, and this "
            "run sets seed=9: "
        ), line
        assert line[0].endswith("Fix: seed=5 to continue it, or ckpt_path=null in a new run folder")
    assert _hashes(run_dir) == before  # its .hydra/config.yaml and overrides.yaml still say seed=5


def test_a_logger_folder_holding_another_runs_metrics_is_refused(train, tmp_path: Path) -> None:
    _, first = train(["iterations=1"], name="first")
    before = _hashes(Path(first.run_dir))
    with pytest.raises(ConfigError) as refused:
        train(["iterations=1", f"logger.csv.save_dir={first.run_dir}"], name="second")
    metrics = Path(first.run_dir) / "csv" / "metrics.csv"
    assert str(refused.value) == (
        f"logger.csv.save_dir={first.run_dir} holds a run's metrics ({metrics} with 1 row), and ckpt_path=auto "
        "does not continue this run: the logger would write over them. Fix: logger.csv.save_dir=${run_dir} (the "
        "default), or a folder of its own"
    )
    assert _hashes(Path(first.run_dir)) == before
    assert not (tmp_path / "second" / ".hydra").exists()


def test_an_unwritable_logger_folder_is_refused_at_start_up(train, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError) as refused:
        train([f"logger.tensorboard.save_dir={tmp_path / 'a-file' / 'tb'}"])
    assert str(refused.value) == (
        f"logger.tensorboard.save_dir={tmp_path / 'a-file' / 'tb'} cannot be written: {tmp_path / 'a-file'} is a "
        "file, not a folder. Fix: logger.tensorboard.save_dir=<a writable folder>"
    )
