"""ragen2-aggregate on a real grid: debug=fast jobs run as SLURM jobs on the local cluster, one cell failing."""

from __future__ import annotations

import csv
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from integration.test_slurm import SLURM_JOBS, slurm_cluster  # noqa: F401  (the fixture: a one-node cluster)

T_975_DF1 = 12.706204736174707  # t_{0.975, 1}: two seeds per cell

# each cell's jobs are its seeds; algo.optim.lr=-1 is accepted by the sweep (Hydra composes it) and refused
# at start-up inside its SLURM job, so that cell's two jobs fail before their first iteration
LRS = ("0.001", "-1")


def _wait_for_queue(env: dict[str, str], timeout: float = 180) -> None:
    """The submitting process returns at the first failed job; the others may still be queued or running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queue = subprocess.run(
            ["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, timeout=30
        )
        if queue.returncode == 0 and not queue.stdout.strip():
            return
        time.sleep(1)
    pytest.fail(f"SLURM jobs still queued after {timeout} s: {queue.stdout}")


def _expected(run: Path) -> dict[str, float]:
    """The run's numbers straight from its metrics.csv: validation rows carry val/success, iteration rows the rest."""
    with (run / "csv" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    val = [float(r["val/success"]) for r in rows if r.get("val/success")]
    iteration = [r for r in rows if r.get("train/iteration")]

    def last(key: str) -> float:
        return float([r[key] for r in iteration if r.get(key)][-1])

    return {
        "final_success": val[-1],
        "best_success": max(val),
        "final_mi_zscore_ema": last("diag/first_turn/mi_zscore_ema"),
        "final_retrieval_above_chance": last("diag/first_turn/retrieval_above_chance"),
        "final_cond_entropy": last("diag/first_turn/cond_entropy"),
        "final_reasoning_length": last("rollout/reasoning_length"),
    }


@pytest.mark.slow
def test_aggregate_a_slurm_grid(slurm_cluster: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    sweep_dir = tmp_path / "sweep"
    overrides = [
        *SLURM_JOBS,
        f"hydra.sweep.dir={sweep_dir}",
        f"algo.optim.lr={','.join(LRS)}",
        "seed=0,1",
        "debug=fast",  # one iteration (the unit tests cover longer runs, best vs final, incomplete runs)
        "trainer.limit_val_batches=1.0",  # validate after it: success is read from val/success
        "~callbacks.curves",
    ]
    subprocess.run(
        [sys.executable, "-m", "ragen2.train", "--multirun", *overrides],
        cwd=tmp_path,
        env=slurm_cluster,
        capture_output=True,
        text=True,
        timeout=300,
    )  # exits non-zero: two jobs fail on purpose
    _wait_for_queue(slurm_cluster)
    jobs = {num: sweep_dir / str(num) for num in range(4)}  # lr outermost: jobs 2 and 3 are lr=-1
    for num in range(2):
        assert (jobs[num] / "checkpoints" / "last.ckpt").is_file(), f"job {num} did not finish"

    done = subprocess.run(
        [sys.executable, "-m", "ragen2.aggregate", str(sweep_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("aggregate.csv", "aggregate.md", "aggregate_metrics.png", "aggregate_curves.png"):
        assert (sweep_dir / name).stat().st_size > 0, name

    with (sweep_dir / "aggregate.csv").open() as f:
        table = {row["algo.optim.lr"]: row for row in csv.DictReader(f)}
    assert list(table) == list(LRS)  # one row per cell, in job order; seed is not a cell key
    row = table["0.001"]  # its two seeds, jobs 0 and 1
    assert (row["n"], row["seeds"], row["failed"]) == ("2", "0, 1", "0")
    per_run = [_expected(jobs[num]) for num in (0, 1)]
    for metric in per_run[0]:
        values = [r[metric] for r in per_run]
        mean, half = statistics.fmean(values), T_975_DF1 * statistics.stdev(values) / math.sqrt(2)
        assert float(row[f"{metric}_mean"]) == pytest.approx(mean, rel=1e-9, abs=1e-12), metric
        assert float(row[f"{metric}_ci_low"]) == pytest.approx(mean - half, rel=1e-9, abs=1e-12), metric
        assert float(row[f"{metric}_ci_high"]) == pytest.approx(mean + half, rel=1e-9, abs=1e-12), metric
        assert row[f"{metric}_n"] == "2"
    assert row["final_success_key"] == row["best_success_key"] == "val/success"
    failed = table["-1"]
    assert (failed["n"], failed["failed"], failed["final_success_mean"]) == ("0", "2", "")

    # the failed jobs, with the error submitit kept of each, in aggregate.md and on stdout
    markdown = (sweep_dir / "aggregate.md").read_text()
    section = markdown.split("## Failed or incomplete")[1]
    for num, seed in ((2, 0), (3, 1)):
        line = re.search(rf"^\| job {num} \| algo\.optim\.lr=-1 seed={seed} \| (.*) \|$", section, re.M)
        assert line, section
        assert "no csv/metrics.csv" in line[1] and "ConfigError: algo.optim.lr=-1" in line[1], line[1]
        assert re.search(
            rf"^  job {num} \(algo\.optim\.lr=-1 seed={seed}\): no csv/metrics.csv", done.stdout, re.M
        )
    assert "| 0.001 | 2 | 0, 1 | val/success |" in markdown
