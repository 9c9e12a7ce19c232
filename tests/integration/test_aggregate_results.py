"""ragen2-aggregate reads submitit's result files of a real Hydra multirun (submitit_local) without running
the code a pickle names; ``--trust-pickles`` unpickles them in full."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ragen2.aggregate import main
from ragen2.grids import aggregate_folder

# a task that raises for a negative lr: Hydra catches the exception into its JobReturn and submitit logs the
# job as successful, so only the result file says why it failed
APP = """\
import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path=None)
def main(cfg: DictConfig) -> None:
    if cfg.lr < 0:
        raise ValueError(f"lr={cfg.lr} is out of range")


if __name__ == "__main__":
    main()
"""


class _WritesMarker:
    """A result file as an attacker would craft it: unpickling it writes ``marker`` (any code could run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path, str]]:
        return Path.write_text, (self.marker, "unpickling ran this")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Jobs 0 (lr=-1, fails) and 1 (lr=0.1) of a real multirun, each with submitit's result file and log."""
    root = tmp_path_factory.mktemp("app")
    (root / "app.py").write_text(APP)
    launch = [
        sys.executable,
        "app.py",
        "--multirun",
        "hydra/launcher=submitit_local",
        "hydra.sweep.dir=sweep",
    ]
    subprocess.run([*launch, "+lr=-1,0.1"], cwd=root, capture_output=True, timeout=120)  # fails: job 0
    deadline = time.monotonic() + 60
    while len(list((root / "sweep" / ".submitit").glob("*/*_result.pkl"))) < 2:
        assert time.monotonic() < deadline, "the two submitit_local jobs wrote no results in 60 s"
        time.sleep(0.5)
    return root / "sweep"


def _problems(grid: Path, **options: bool) -> dict[str, str | None]:
    (report,) = aggregate_folder(grid, **options)
    return {run.name: run.problem for run in report.runs}


def test_a_crafted_result_runs_no_code_unless_trusted(sweep: Path, tmp_path: Path) -> None:
    grid = shutil.copytree(sweep, tmp_path / "sweep")
    marker = tmp_path / "marker"
    # one written over job 1's real result, and one in a job folder of its own (a log makes it a job)
    job_1 = yaml.safe_load((grid / "1" / ".hydra" / "hydra.yaml").read_text())["hydra"]["job"]["id"]
    (grid / ".submitit" / job_1 / f"{job_1}_0_result.pkl").write_bytes(pickle.dumps(_WritesMarker(marker)))
    fake = grid / ".submitit" / "666"
    fake.mkdir()
    (fake / "666_0_log.out").write_text("submitit INFO - Job completed successfully\n")
    (fake / "666_0_result.pkl").write_bytes(pickle.dumps(("success", _WritesMarker(marker))))

    problems = _problems(grid)
    assert not marker.exists()
    assert problems == {
        "job 0": "no csv/metrics.csv; submitit: ValueError: lr=-1 is out of range",
        "job 1": "no csv/metrics.csv; submitit: result not readable without --trust-pickles",
        "submitit job 666": "no run folder",  # read as records: a success whose result is no JobReturn
    }
    main([str(grid), "--trust-pickles", "--out", str(tmp_path / "out")])
    assert marker.read_text() == "unpickling ran this"


def test_real_results_read_alike_as_records_and_in_full(sweep: Path) -> None:
    expected = {
        "job 0": "no csv/metrics.csv; submitit: ValueError: lr=-1 is out of range",
        "job 1": "no csv/metrics.csv",  # the task logs no metrics; its job succeeded
    }
    assert _problems(sweep) == expected
    assert _problems(sweep, trust_pickles=True) == expected
