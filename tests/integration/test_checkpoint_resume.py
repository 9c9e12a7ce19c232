"""The real loop resumes from the save before last.ckpt when last.ckpt itself does not load, and stops in one
line, its checkpoint whole, when the next save finds no room."""

from __future__ import annotations

import csv
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from integration.conftest import FAST
from ragen2.models.checkpoint import read_checkpoint


def _rows(run_dir: Path) -> dict[int, dict[str, str]]:
    with (run_dir / "csv" / "metrics.csv").open(newline="") as f:
        return {int(float(r["train/iteration"])): r for r in csv.DictReader(f) if r.get("train/iteration")}


@pytest.mark.slow
def test_a_truncated_last_ckpt_resumes_from_the_save_before(
    train, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _, cfg = train(["iterations=2"])
    run_dir = Path(cfg.run_dir)
    folder = run_dir / "checkpoints"
    first = _rows(run_dir)
    last = folder / "last.ckpt"
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 3])  # a copy cut short by a kill

    monkeypatch.setenv("SLURM_JOB_ID", "7")  # the job, requeued: ckpt_path=auto looks in its own run folder
    train(["iterations=3"])
    (warning,) = [r.getMessage() for r in caplog.records if "resuming from the older" in r.getMessage()]
    assert f"{last} is truncated or corrupt" in warning and str(folder / "last.1.ckpt") in warning
    # resumed after iteration 0: iteration 1 again, exactly as the first run did it, then iteration 2
    rows = _rows(run_dir)
    assert sorted(rows) == [0, 1, 2]
    assert rows[1]["train/loss"] == first[1]["train/loss"]
    # the unreadable file was dropped rather than kept as the fallback
    assert {p.name: read_checkpoint(p)["epoch"] for p in folder.iterdir()} == {
        "last.ckpt": 2,
        "last.1.ckpt": 1,
    }


@pytest.mark.slow
def test_a_full_disk_stops_ragen2_train_in_one_line_and_keeps_the_checkpoint(train) -> None:
    _, cfg = train(["iterations=1"])
    run_dir = Path(cfg.run_dir)
    last = run_dir / "checkpoints" / "last.ckpt"
    saved = last.read_bytes()

    def no_room() -> None:  # files stop at 1 MB (EFBIG): the run's logs fit, its checkpoint (39 MB) does not
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))

    command = [sys.executable, "-m", "ragen2.train", *FAST, "iterations=2", f"ckpt_path={last}"]
    done = subprocess.run(
        [*command, f"hydra.run.dir={run_dir}"],
        preexec_fn=no_room,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        f"ragen2-train: callbacks.checkpoint.dirpath={last.parent}: the file-size limit (ulimit -f) is reached "
        f"(File too large): the checkpoint needs about {len(saved) / 1e6:,.0f} MB, "
    ), line
    assert [p.name for p in last.parent.iterdir()] == ["last.ckpt"] and last.read_bytes() == saved


def test_resuming_a_finished_run_with_fewer_iterations_is_refused_before_anything_is_written(train) -> None:
    _, cfg = train(["iterations=3"])
    run_dir = Path(cfg.run_dir)
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    command = [sys.executable, "-m", "ragen2.train", *FAST, "ckpt_path=last", f"hydra.run.dir={run_dir}"]
    for iterations in (2, 3):  # fewer, or as many: nothing would run
        done = subprocess.run(
            [*command, f"iterations={iterations}"], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 1, done.stderr[-3000:]
        assert done.stderr.splitlines() == [
            f"ragen2-train: ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'} with iterations={iterations}: the run "
            "already has 3 iterations, so nothing would run. Fix: iterations=N with N > 3 to continue, or a new "
            "run folder"
        ]
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before  # not even Hydra's .hydra/
