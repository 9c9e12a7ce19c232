"""bench/bench_test_command.py reads pytest's own summary: the counts and seconds of the suite's line, the
slowest tests (the output below is the shape pytest-xdist prints, cut)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from bench_test_command import STAGE_2, DiskPeak, pytest_summary

OUTPUT = """ragen2 installed: torch 2.13.0+cpu
stage 1: ruff check, ruff format --check, the type check
All checks passed!
.                                                                        [100%]
1 passed in 226.66s (0:03:46)
stage 2: every test but the gpu-marked ones
created: 2/2 workers
........F...E....                                                        [100%]
============================= slowest 25 durations =============================
106.74s call     tests/integration/test_main_job.py::test_main_job_config_one_iteration_with_the_builtin_model
100.28s call     tests/integration/test_vllm_rollout.py::test_one_iteration_with_vllm_rollouts
0.50s setup    tests/unit/test_x.py::test_y[a-b]
=========================== short test summary info ============================
FAILED tests/unit/test_x.py::test_z - assert 1 == 2
ERROR tests/integration/test_multirank.py::test_two_ranks_update_exactly_as_one[full-ddp]
= 1455 passed, 1 failed, 32 skipped, 3 deselected, 5 errors, 1 warning in 914.31s (0:15:14) =
"""


def test_the_suites_counts_seconds_and_slowest_tests() -> None:
    summary = pytest_summary(OUTPUT.split(STAGE_2, 1)[1])
    assert summary["counts"] == {"passed": 1455, "failed": 1, "skipped": 32, "deselected": 3, "errors": 5}
    assert summary["suite_s"] == 914.31
    assert summary["slowest"] == [
        [
            106.74,
            "tests/integration/test_main_job.py::test_main_job_config_one_iteration_with_the_builtin_model",
        ],
        [100.28, "tests/integration/test_vllm_rollout.py::test_one_iteration_with_vllm_rollouts"],
        [0.5, "tests/unit/test_x.py::test_y[a-b]"],
    ]


def test_one_error_and_a_line_without_the_hour() -> None:
    summary = pytest_summary("== 3 passed, 1 error in 2.50s ==\n")
    assert summary == {"counts": {"passed": 3, "errors": 1}, "suite_s": 2.5, "slowest": []}


def test_output_without_a_summary_is_refused() -> None:
    with pytest.raises(ValueError, match="no pytest summary line"):
        pytest_summary("stage 2: every test\nKilled\n")


def test_the_disk_peak_sees_a_file_that_came_and_went(tmp_path: Path) -> None:
    """64 MB written, held across several reads, then removed: the peak keeps it (the disk is shared, so other
    writers can only add to what is seen, by a little in this short a window)."""
    disk = DiskPeak(tmp_path, every_s=0.05)
    disk.start()
    big = tmp_path / "big"
    with big.open("wb") as f:
        f.write(b"\1" * 64 * 2**20)
        f.flush()
        os.fsync(f.fileno())
    time.sleep(0.5)
    big.unlink()
    time.sleep(0.2)
    assert 60 * 2**20 <= disk.stop() < 1 * 2**30
