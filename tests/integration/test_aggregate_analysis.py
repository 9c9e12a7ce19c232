"""ragen2-aggregate's analysis of a real grid: filter=top_p,none × 2 seeds of real training runs (the tiny model,
scripted responses) with gradient buckets and every MI curve on, read back and checked against each run's
own metrics.csv."""

from __future__ import annotations

import csv
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from ragen2.grids import aggregate_folder
from ragen2.grids.stats import ci95

GRID = (
    "model=tiny",
    "rollout=scripted",
    "algo.optim.lr=1e-3",
    "trainer.limit_val_batches=0",
    "iterations=2",
    "diagnostics.every_n_iterations=1",
    "diagnostics.modes=[first_turn,trajectory,per_turn]",
    "callbacks.gradient_buckets.every_n_iterations=1",
    "callbacks.gradient_buckets.num_buckets=2",
    "callbacks.gradient_buckets.plot=false",
    "~callbacks.curves",
    "filter=top_p,none",
    "seed=0,1",
)


def _rows(run: Path) -> list[dict[str, str]]:
    with (run / "csv" / "metrics.csv").open() as f:
        return [r for r in csv.DictReader(f) if r.get("train/iteration")]


@pytest.mark.slow
def test_a_real_grid_is_paired_matched_and_pooled(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    done = subprocess.run(
        [sys.executable, "-m", "ragen2.train", "--multirun", *GRID, f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (report,) = aggregate_folder(sweep, tmp_path / "out")
    jobs = {(r.overrides or {})["filter"] + (r.overrides or {})["seed"]: r.folder for r in report.runs}
    rows = {name: _rows(folder) for name, folder in jobs.items()}

    # pairs by seed; each difference is the two runs' own last values, differenced
    (comparison,) = report.comparisons
    assert [p.seed for p in comparison.pairs] == ["0", "1"] and comparison.unpaired == []
    success = comparison.metrics["final_success"]
    expected = [
        float(rows[f"top_p{s}"][-1]["rollout/success"]) - float(rows[f"none{s}"][-1]["rollout/success"])
        for s in "01"
    ]
    assert [a - b for _, a, b in success.pairs] == pytest.approx(expected)
    assert success.interval == pytest.approx(ci95(expected))

    # the MI pass of iteration 0 reads both arms before any step, on the same batch: no difference at 0 steps
    assert comparison.steps[0] == 0.0
    for key, diffs in comparison.matched.items():
        assert [round(a - b, 12) for _, a, b in diffs[0].pairs] == [0.0, 0.0], key
    curves = {key.split("/")[1] for key in comparison.matched}
    assert {"first_turn", "trajectory", "turn_2"} <= curves

    # the groups by outcome are shares that add up, the effective reward a mean return
    for name, iterations in rows.items():
        for row in iterations:
            shares = [float(row[f"rollout/groups_{k}"]) for k in ("all_success", "all_fail", "mixed")]
            assert sum(shares) == pytest.approx(1.0), name
            assert float(row["rollout/groups"]) == 4.0

    # gradient norms by bucket: per run the mean over its 2 passes, then mean and interval over the cell's runs
    with (tmp_path / "out" / "aggregate_gradients.csv").open() as f:
        table = {(r["filter"], r["bucket"], r["column"]): r for r in csv.DictReader(f)}
    for arm in ("top_p", "none"):
        per_run = [statistics.fmean(float(r["grad/q2/task"]) for r in rows[f"{arm}{s}"]) for s in "01"]
        row = table[(arm, "q2", "task")]
        assert (row["n"], row["nonfinite"]) == ("2", "0")
        assert float(row["mean"]) == pytest.approx(statistics.fmean(per_run))
        assert float(row["ci_high"]) == pytest.approx(ci95(per_run).high)
    for name in (
        "aggregate_gradients.png",
        "aggregate_mi_steps.png",
        "aggregate_paired.md",
        "aggregate_mi_curves.csv",
    ):
        assert (tmp_path / "out" / name).stat().st_size > 0, name
