"""ragen2-aggregate: the t interval, cells from overrides, which runs count, and the tables of a grid folder."""

from __future__ import annotations

import csv
import math
import pickle
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import cloudpickle
import pytest
import yaml
from hydra.core.utils import JobReturn, JobStatus

from ragen2.aggregate import main
from ragen2.grids import OUTPUTS, aggregate_folder
from ragen2.grids.forensics import NOT_READABLE, job_problem, log_problem, result_problem
from ragen2.grids.report import summary
from ragen2.grids.runs import AggregateError, Run, parse_overrides, run_problem
from ragen2.grids.stats import Interval, ci95, t_quantile
from ragen2.grids.table import (
    METRICS,
    Metric,
    cell_keys,
    entry,
    fmt,
    pick_key,
    run_value,
    stat_of,
    swept_keys,
)

# ------------------------------------------------------------------------------------------- the math


@pytest.mark.parametrize(
    ("df", "t"),
    # two-sided 95 % critical values of Student's t, as printed in statistics tables
    [
        (1, 12.706205),
        (2, 4.302653),
        (3, 3.182446),
        (4, 2.776445),
        (9, 2.262157),
        (30, 2.042272),
        (120, 1.979930),
    ],
)
def test_t_quantile_matches_the_tables(df: int, t: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(t, abs=5e-7)


def test_ci95_hand_derived() -> None:
    # [1, 2, 3]: mean 2, s² = (1 + 0 + 1)/2 = 1, half-width t_{0.975,2} · 1/√3 = 4.302653/1.732051 = 2.484138
    mean, low, high = ci95([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert (low, high) == pytest.approx((2 - 2.484138, 2 + 2.484138), abs=1e-6)
    # [2, 4]: mean 3, s = √2, half-width t_{0.975,1} · √2/√2 = 12.706205
    assert ci95([2.0, 4.0]) == pytest.approx((3.0, 3 - 12.706205, 3 + 12.706205), abs=1e-6)
    # equal values: s = 0, a zero-width interval
    assert ci95([0.5, 0.5]) == (0.5, 0.5, 0.5)
    # one run: a mean, no interval; none: nothing
    one = ci95([0.7])
    assert one.mean == 0.7 and math.isnan(one.low) and math.isnan(one.high)
    assert all(math.isnan(v) for v in ci95([]))


def test_fmt_shows_mean_and_half_width() -> None:
    assert fmt(ci95([1.0, 2.0, 3.0])) == "2 ± 2.5"
    assert fmt(ci95([0.7])) == "0.7 ± —"
    assert fmt(ci95([])) == "—"
    assert fmt(Interval(0.123456, 0.1, 0.146912)) == "0.123 ± 0.023"


def test_run_value_reads_by_iteration_and_keeps_a_non_finite_end() -> None:
    series = {"k": [(0.0, 0.5), (2.0, 0.25), (1.0, 0.75)]}
    assert run_value(series, "k") == 0.25  # iteration 2 is the last, whatever the order of the rows
    assert run_value(series, "k", "first") == 0.5
    assert run_value(series, "k", "best") == 0.75
    assert run_value(series, "k", "mean") == 0.5  # (0.5 + 0.75 + 0.25)/3
    assert run_value(series, "missing") is None
    # a run that ends on NaN ends there: its last value is NaN (counted), never an earlier pass's
    ended = {"k": [*series["k"], (3.0, math.nan)]}
    assert math.isnan(run_value(ended, "k")) and math.isnan(run_value(ended, "k", "mean"))
    assert run_value(ended, "k", "best") == 0.75  # the largest finite value
    assert math.isnan(run_value({"k": [(0.0, math.inf), (1.0, math.nan)]}, "k", "best"))


def test_a_non_finite_value_is_counted_not_dropped() -> None:
    # runs ending on 0.5, 1.0 and NaN: the mean and interval of the two finite ones, the third counted
    stat = stat_of("k", [0.5, 1.0, math.nan, None])
    assert (stat.values, stat.nonfinite) == ([0.5, 1.0], 1)
    # mean 0.75, s = 0.353553, half-width 12.706205 · 0.353553/√2 = 3.176551
    assert stat.interval == pytest.approx((0.75, 0.75 - 3.176551, 0.75 + 3.176551), abs=1e-6)
    # 4 runs in the cell: 2 finite values, 1 non-finite, 1 that never logged it
    assert entry(stat, 4) == "0.75 ± 3.2 (n = 2 +1 non-finite)"
    assert entry(stat_of("k", [0.5, None]), 2) == "0.5 ± — (n = 1)"
    assert entry(stat_of("k", [0.5, 1.0]), 2) == "0.75 ± 3.2"
    assert entry(stat_of(None, []), 2) == "—"


def test_success_source_is_validation_only_where_every_run_validated() -> None:
    success = METRICS["final_success"]
    validated = {"val/success": [(1.0, 1.0)], "rollout/success": [(0.0, 0.5), (1.0, 0.25)]}
    rollout_only = {"rollout/success": [(0.0, 0.5), (1.0, 0.75)]}
    assert pick_key([validated, validated], success) == "val/success"
    # one cell never averages two kinds of success: one run without validation puts the cell on rollouts
    assert pick_key([validated, rollout_only], success) == "rollout/success"
    assert pick_key([rollout_only], success) == "rollout/success"
    # a key some runs lack and no fallback: the key still, counted over the runs that logged it
    assert pick_key([validated, {}], Metric(("val/success",))) == "val/success"
    assert pick_key([{}], success) is None


# ------------------------------------------------------------------------------------ overrides and cells


def test_cells_come_from_the_keys_that_differ_but_seed() -> None:
    jobs = [
        parse_overrides(["filter=top_p", "seed=0", "debug=fast", "~callbacks.curves"]),
        parse_overrides(["filter=top_p", "seed=1", "debug=fast", "~callbacks.curves"]),
        # a later stage resumed it: how the job started is not a setting of the cell
        parse_overrides(
            [
                "ckpt_path=last",
                "filter=none",
                "seed=0",
                "debug=fast",
                "~callbacks.curves",
                "+algo.kl_coef=0.1",
            ]
        ),
    ]
    assert jobs[2] == {
        "filter": "none",
        "seed": "0",
        "debug": "fast",
        "~callbacks.curves": "",
        "algo.kl_coef": "0.1",
    }
    # a key only some jobs override differs too (the others run the config's own value)
    assert swept_keys(jobs) == ["filter", "seed", "algo.kl_coef"]
    assert cell_keys(jobs) == ["filter", "algo.kl_coef"]
    assert cell_keys(jobs, ["filter", "seed"]) == ["filter", "seed"]
    with pytest.raises(
        AggregateError, match=r"--keys algo\.lr: no job of the grid overrides 'algo\.lr'\. Fix:.*filter"
    ):
        cell_keys(jobs, ["algo.lr"])


def test_log_problem_reads_submitit_verdicts() -> None:
    ok = "submitit INFO (…) - Job completed successfully\nsubmitit INFO (…) - Exiting after successful completion\n"
    assert log_problem(ok) is None
    raised = (
        "Traceback (most recent call last):\n  File 'x.py', line 1\n"
        "ragen2.config.ConfigError: algo.optim.lr=-1 is out of range. Fix: algo.optim.lr=1e-6\n"
        "submitit ERROR (…) - Submitted job triggered an exception\n"
        "Error executing job with overrides: ['seed=0']\n"
    )
    assert (
        log_problem(raised)
        == "ragen2.config.ConfigError: algo.optim.lr=-1 is out of range. Fix: algo.optim.lr=1e-6"
    )
    cancelled = "[ragen2] iteration 0: …\nslurmstepd: error: *** JOB 12 ON node CANCELLED AT 2026-01-01 DUE TO TIME LIMIT ***\n"
    assert log_problem(cancelled) == "*** JOB 12 ON node CANCELLED AT 2026-01-01 DUE TO TIME LIMIT ***"
    assert "ends without a verdict" in log_problem("[ragen2] iteration 0: …\n")
    # requeued after a failure and then finished: the last verdict counts
    assert log_problem(raised + ok) is None


def _failed_job_return(error: Exception) -> JobReturn:
    """What Hydra's run_job returns for a task that raised (submitit then logs the job as successful)."""
    ret = JobReturn(overrides=["seed=1"], status=JobStatus.FAILED)
    ret._return_value = error
    return ret


class _Overrides(list):
    """A list subclass: its pickle fills the object a global built (APPENDS), as a defaultdict's does (SETITEMS)."""


def _result(folder: Path, name: str, outcome: object) -> Path:
    """A result file as submitit writes it (cloudpickle, highest protocol)."""
    path = folder / f"{name}_0_result.pkl"
    with path.open("wb") as f:
        cloudpickle.dump(outcome, f, pickle.HIGHEST_PROTOCOL)
    return path


def test_result_problem_reads_the_failure_hydra_caught(tmp_path: Path) -> None:
    completed = JobReturn(overrides=_Overrides(["seed=0"]), status=JobStatus.COMPLETED)
    completed.cfg = {"seen": defaultdict(list, {"seed": [0]})}
    failed = _failed_job_return(ValueError("algo.optim.lr=-1 is out of range"))
    failed.overrides = _Overrides(["seed=1"])
    traceback = (
        "Traceback (most recent call last):\n  File 'x'\nsubmitit.core.utils.UncompletedJobError: timed out\n"
    )
    cases = {
        "completed": (("success", completed), None),
        "failed": (("success", failed), "ValueError: algo.optim.lr=-1 is out of range"),
        "error": (("error", traceback), "submitit.core.utils.UncompletedJobError: timed out"),
        "plain": (("success", 12), None),  # submitit without Hydra: the function's return value
        "two args": (("success", _failed_job_return(ValueError("lr", -1))), "ValueError: ('lr', -1)"),
    }
    for name, (outcome, problem) in cases.items():
        path = _result(tmp_path, name, outcome)
        assert result_problem(path) == problem, name
        assert result_problem(path, trust_pickles=True) == problem, name


def test_result_read_as_records_names_what_only_code_would(tmp_path: Path) -> None:
    # KeyError's own __str__ quotes its key; read as records, str() of the arguments is BaseException's
    key = _result(tmp_path, "key", ("success", _failed_job_return(KeyError("lr"))))
    assert (result_problem(key), result_problem(key, trust_pickles=True)) == (
        "KeyError: lr",
        "KeyError: 'lr'",
    )

    # an exception class cloudpickle pickles by value: only building the class would give its name
    class LocalError(RuntimeError):
        pass

    local = _result(tmp_path, "local", ("success", _failed_job_return(LocalError("x"))))
    assert (result_problem(local), result_problem(local, trust_pickles=True)) == (
        NOT_READABLE,
        "LocalError: x",
    )
    # not submitit's (status, value): nothing to read it by
    for name, outcome in (("bare", "ValueError: x"), ("traceback", ("error", ValueError("x")))):
        assert result_problem(_result(tmp_path, name, outcome)) == NOT_READABLE, name


def test_job_problem_falls_back_to_the_log_when_a_result_is_damaged(tmp_path: Path) -> None:
    path = _result(tmp_path, "77_0", ("success", _failed_job_return(ValueError("x"))))
    (tmp_path / "77_0_log.out").write_text("submitit ERROR - Submitted job triggered an exception\n")
    assert job_problem(tmp_path) == "ValueError: x"
    path.write_bytes(path.read_bytes()[:40])  # truncated
    assert job_problem(tmp_path) == "the job raised an exception (see its log)"
    assert job_problem(tmp_path, trust_pickles=True) == "the job raised an exception (see its log)"


def test_run_problem_says_why_a_run_is_left_out(tmp_path: Path) -> None:
    def run(**fields: object) -> Run:
        base: dict = dict(name="job 0", folder=tmp_path, overrides={"seed": "0"}, has_csv=True, iterations=2)
        return Run(**(base | {"expected": 2, "has_checkpoint": True} | fields))

    assert run_problem(run()) is None
    assert run_problem(run(has_checkpoint=False)) is None  # a cleaned grid: last.ckpt alone decides nothing
    assert (
        run_problem(run(iterations=1, has_checkpoint=False)) == "1 of 2 iterations; no checkpoints/last.ckpt"
    )
    assert (
        run_problem(run(iterations=0))
        == "no iteration in csv/metrics.csv (ended before the first one finished)"
    )
    assert (
        run_problem(run(has_csv=False, iterations=0, job_error="ValueError: x"))
        == "no csv/metrics.csv; submitit: ValueError: x"
    )
    assert run_problem(run(job_error="ValueError: after the end")) == "submitit: ValueError: after the end"
    assert run_problem(run(overrides=None)) == "no .hydra/overrides.yaml"
    assert run_problem(run(has_folder=False, overrides=None, has_csv=False)) == "no run folder"


# --------------------------------------------------------------------------- a grid folder, real layout


def _rows(success: Sequence[float], val: Sequence[float] = (), mi: float = 0.0) -> list[dict[str, float]]:
    """metrics.csv rows: one per iteration (MI pass values fixed but the last iteration's), validation rows after."""
    rows: list[dict[str, float]] = []
    for i, s in enumerate(success):
        last = i == len(success) - 1
        rows.append(
            {
                "epoch": i,
                "step": i,
                "train/iteration": i,
                "rollout/success": s,
                "rollout/reasoning_length": 10.0 + i,
                "diag/first_turn/mi_zscore_ema": mi if last else -1.0,
                "diag/first_turn/retrieval_above_chance": 0.1 * i,
                "diag/first_turn/cond_entropy": 2.0 - i,
                # groups by outcome: half mixed at iteration 0, all at 1; effective reward = success
                "rollout/groups_all_success": 0.0,
                "rollout/groups_all_fail": 0.5 - 0.5 * i,
                "rollout/groups_mixed": 0.5 + 0.5 * i,
                "train/effective_reward": s,
            }
        )
        if i < len(val):
            rows.append({"epoch": i, "step": i, "val/success": val[i]})
    return rows


def _job(
    grid: Path,
    num: int,
    overrides: Sequence[str],
    rows: Sequence[Mapping[str, float]] | None,
    log: str | None = "Job completed successfully\n",
    checkpoint: bool = True,
    result: object = None,
) -> Path:
    """A run folder as ragen2-train writes it under a submitit launcher, and its job's log."""
    folder = grid / str(num)
    job_id = f"77_{num}"
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    (folder / ".hydra" / "config.yaml").write_text(
        "seed: 0\niterations: 2\nrun_dir: ${hydra:runtime.output_dir}\n"
    )
    (folder / ".hydra" / "hydra.yaml").write_text(
        yaml.safe_dump({"hydra": {"job": {"id": job_id, "num": num}}})
    )
    if rows is not None:
        columns = sorted({key for row in rows for key in row})  # Lightning's CSV: sorted keys, blanks
        (folder / "csv").mkdir()
        with (folder / "csv" / "metrics.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, columns)
            writer.writeheader()
            writer.writerows(rows)
    if checkpoint:
        (folder / "checkpoints").mkdir()
        (folder / "checkpoints" / "last.ckpt").write_bytes(b"ckpt")
    if log is not None:
        (grid / ".submitit" / job_id).mkdir(parents=True)
        (grid / ".submitit" / job_id / f"{job_id}_0_log.out").write_text(log)
    if result is not None:
        (grid / ".submitit" / job_id / f"{job_id}_0_result.pkl").write_bytes(pickle.dumps(result))
    return folder


def _grid(grid: Path) -> Path:
    # cell filter=top_p: 3 seeds, validated after each iteration
    _job(grid, 0, ["filter=top_p", "seed=0", "debug=fast"], _rows([0.0, 0.25], val=[0.5, 0.25], mi=0.1))
    _job(grid, 1, ["filter=top_p", "seed=1", "debug=fast"], _rows([0.5, 0.5], val=[0.5, 0.5], mi=0.2))
    _job(grid, 2, ["filter=top_p", "seed=2", "debug=fast"], _rows([0.5, 0.0], val=[0.25, 0.75], mi=0.3))
    # cell filter=none: 2 complete seeds without validation, one cut short, one that never logged
    _job(grid, 3, ["filter=none", "seed=0", "debug=fast"], _rows([0.75, 0.5], mi=0.0))
    _job(grid, 4, ["filter=none", "seed=1", "debug=fast"], _rows([0.25, 1.0], mi=0.0))
    _job(grid, 5, ["filter=none", "seed=2", "debug=fast"], _rows([1.0]), log=None, checkpoint=False)
    crash = "Traceback (most recent call last):\nRuntimeError: CUDA out of memory | really\nsubmitit ERROR - Submitted job triggered an exception\n"
    _job(grid, 6, ["filter=none", "seed=3", "debug=fast"], None, log=crash, checkpoint=False)
    # cell filter=min_p: one seed
    _job(grid, 7, ["filter=min_p", "seed=0", "debug=fast"], _rows([0.5, 0.5], mi=0.5))
    # one that raised at start-up: Hydra caught it, submitit logged success, the result holds the error
    error = _failed_job_return(ValueError("algo.optim.lr=-1 is out of range"))
    _job(grid, 9, ["filter=min_p", "seed=1", "debug=fast"], None, checkpoint=False, result=("success", error))
    # a submitit job that never made its run folder
    (grid / ".submitit" / "77_8").mkdir()
    (grid / ".submitit" / "77_8" / "77_8_0_log.out").write_text("srun: error: node lost\n")
    return grid


def _csv(path: Path) -> dict[str, dict[str, str]]:
    with path.open() as f:
        return {row["filter"]: row for row in csv.DictReader(f)}


def test_grid_tables(tmp_path: Path) -> None:
    grid = _grid(tmp_path / "multirun" / "2026-01-01" / "10-00-00")
    (report,) = aggregate_folder(grid)
    assert report.keys == ["filter"]
    assert [p.name for p in report.files] == [
        "aggregate.csv",
        "aggregate.md",
        "aggregate_metrics.png",
        "aggregate_curves.png",
        "aggregate_trajectories.md",
        "aggregate_mi_curves.csv",
        "aggregate_gradients.csv",
        "aggregate_gradients.png",
        "aggregate_mi_steps.png",
        "aggregate_paired.md",
        "aggregate_paired.csv",
    ]
    assert all(p.parent == grid and p.stat().st_size > 0 for p in report.files)
    table = _csv(grid / "aggregate.csv")
    assert list(table) == ["top_p", "none", "min_p"]

    top_p = table["top_p"]
    assert (top_p["n"], top_p["seeds"], top_p["failed"]) == ("3", "0, 1, 2", "0")
    assert top_p["final_success_key"] == top_p["best_success_key"] == "val/success"
    # final val/success [0.25, 0.5, 0.75]: mean 0.5, s = 0.25, half = 4.302653 · 0.25/√3 = 0.621034
    assert float(top_p["final_success_mean"]) == pytest.approx(0.5)
    assert float(top_p["final_success_ci_low"]) == pytest.approx(0.5 - 0.621034, abs=1e-6)
    assert float(top_p["final_success_ci_high"]) == pytest.approx(0.5 + 0.621034, abs=1e-6)
    # best val/success [0.5, 0.5, 0.75]: mean 0.583333, s² = (2 · 0.083333² + 0.166667²)/2 = 0.0208333,
    # s = 0.1443376, half = 4.302653 · 0.1443376/√3 = 0.358554
    assert float(top_p["best_success_mean"]) == pytest.approx(0.583333, abs=1e-6)
    assert float(top_p["best_success_ci_high"]) == pytest.approx(0.583333 + 0.358554, abs=1e-6)
    # the last MI pass of each run [0.1, 0.2, 0.3]: mean 0.2, s = 0.1, half = 4.302653 · 0.1/√3 = 0.248414
    assert top_p["final_mi_zscore_ema_key"] == "diag/first_turn/mi_zscore_ema"
    assert float(top_p["final_mi_zscore_ema_mean"]) == pytest.approx(0.2)
    assert float(top_p["final_mi_zscore_ema_ci_low"]) == pytest.approx(0.2 - 0.248414, abs=1e-6)
    assert float(top_p["final_reasoning_length_mean"]) == 11.0  # the second iteration's, in every run
    assert float(top_p["final_cond_entropy_mean"]) == 1.0
    assert float(top_p["final_retrieval_above_chance_mean"]) == pytest.approx(0.1)
    # each run's mean over its 2 iterations: mixed (0.5 + 1)/2 = 0.75 in each run; effective reward = the
    # run's mean success (0, 0.25) -> 0.125, (0.5, 0.5) -> 0.5, (0.5, 0) -> 0.25: mean 0.291667,
    # s² = (0.166667² + 0.208333² + 0.041667²)/2 = 0.0364583, s = 0.190941, half = 4.302653 · s/√3 = 0.474323
    assert float(top_p["mean_mixed_groups_mean"]) == 0.75
    assert float(top_p["mean_effective_reward_mean"]) == pytest.approx(0.291667, abs=1e-6)
    assert float(top_p["mean_effective_reward_ci_high"]) == pytest.approx(0.291667 + 0.474323, abs=1e-6)
    assert top_p["mean_effective_reward_nonfinite"] == "0"

    none = table["none"]
    assert (none["n"], none["seeds"], none["failed"]) == ("2", "0, 1", "2")  # seeds 2 and 3 left out
    assert none["final_success_key"] == "rollout/success"
    # final rollout/success [0.5, 1.0]: mean 0.75, s = 0.353553, half = 12.706205 · 0.353553/√2 = 3.176551
    assert float(none["final_success_mean"]) == 0.75
    assert float(none["final_success_ci_high"]) == pytest.approx(0.75 + 3.176551, abs=1e-6)
    assert float(none["best_success_mean"]) == 0.875  # best of each: 0.75 and 1.0

    min_p = table["min_p"]
    assert (min_p["n"], min_p["failed"]) == ("1", "1")
    assert (min_p["final_success_mean"], min_p["final_success_ci_low"]) == ("0.5", "")
    assert min_p["final_success_n"] == "1"

    markdown = (grid / "aggregate.md").read_text()
    assert "| top_p | 3 | 0, 1, 2 | val/success | 0.5 ± 0.62 | 0.583 ± 0.36 |" in markdown
    assert "| none | 2 | 0, 1 | rollout/success | 0.75 ± 3.2 | 0.875 ± 1.6 |" in markdown
    assert "| min_p | 1 | 0 | rollout/success | 0.5 ± — | 0.5 ± — |" in markdown
    section = markdown.split("## Failed or incomplete")[1]
    assert "| job 5 | filter=none seed=2 | 1 of 2 iterations; no checkpoints/last.ckpt |" in section
    assert (
        r"| job 6 | filter=none seed=3 | no csv/metrics.csv; submitit: RuntimeError: CUDA out of memory \| really |"
        in section
    )
    assert (
        "| submitit job 77_8 | — | no run folder; submitit: the job's log ends without a verdict" in section
    )
    assert (
        "| job 9 | filter=min_p seed=1 | no csv/metrics.csv; submitit: ValueError: algo.optim.lr=-1 is out of range |"
        in section
    )
    assert "| job 3 |" not in section and "| job 7 |" not in section
    for name, metric in METRICS.items():  # the columns each metric reads are listed
        assert f"- {name}: " + " or ".join(f"`{k}`" for k in metric.keys) in markdown


def test_cli_prints_failures_and_writes_to_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = _grid(tmp_path / "sweep")
    main([str(grid), "--out", str(tmp_path / "out"), "--keys", "filter,seed"])
    printed = capsys.readouterr().out
    assert "6 complete runs in 9 cells; 4 failed or incomplete:" in printed
    assert "  job 5 (filter=none seed=2): 1 of 2 iterations" in printed
    assert "  submitit job 77_8 (—): no run folder" in printed
    assert not (grid / "aggregate.csv").exists()
    with (tmp_path / "out" / "aggregate.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["filter"], r["seed"], r["n"]) for r in rows][:3] == [
        ("top_p", "0", "1"),
        ("top_p", "1", "1"),
        ("top_p", "2", "1"),
    ]


def test_cli_errors_name_the_input_and_the_fix(tmp_path: Path) -> None:
    (tmp_path / "empty" / "2026-01-01").mkdir(parents=True)
    with pytest.raises(
        SystemExit, match=r"ragen2-aggregate: .*empty: no runs found .*Fix: pass the sweep folder"
    ):
        main([str(tmp_path / "empty")])
    with pytest.raises(SystemExit, match=r"ragen2-aggregate: .*missing: no such folder\. Fix:"):
        main([str(tmp_path / "missing")])
    grid = _grid(tmp_path / "sweep")
    with pytest.raises(
        SystemExit,
        match=r"--keys algo: no job of the grid overrides 'algo'\. Fix: --keys with some of filter,seed,debug",
    ):
        main([str(grid), "--keys", "algo"])
    with pytest.raises(SystemExit, match=r"--keys ',' names no key\. Fix:"):
        main([str(grid), "--keys", ","])


def test_a_folder_of_grids_aggregates_each(tmp_path: Path) -> None:
    parent = tmp_path / "multirun" / "main_table"
    _grid(parent / "2026-01-01_10-00-00")
    _job(parent / "2026-01-02_09-00-00", 0, ["seed=0"], _rows([0.5, 1.0]))
    _job(parent / "2026-01-02_09-00-00", 1, ["seed=1"], _rows([0.0, 0.5]))
    reports = aggregate_folder(parent)
    assert [r.grid.name for r in reports] == ["2026-01-01_10-00-00", "2026-01-02_09-00-00"]
    assert all((r.grid / "aggregate.md").is_file() for r in reports)
    # the second grid sweeps only the seed: one cell of both runs
    assert reports[1].keys == [] and [len(c.runs) for c in reports[1].cells] == [2]
    assert "| 2 | 0, 1 | rollout/success | 0.75 ± 3.2 |" in reports[1].markdown
    out = tmp_path / "out"
    aggregate_folder(tmp_path / "multirun", out)
    assert (out / "main_table" / "2026-01-02_09-00-00" / "aggregate.csv").is_file()


def test_empty_or_damaged_metrics_are_listed_not_fatal(tmp_path: Path) -> None:
    grid = tmp_path / "sweep"
    _job(grid, 0, ["seed=0"], _rows([0.5, 1.0]))
    _job(grid, 1, ["seed=1"], [])  # the CSV logger started, then the job died: a header at most
    _job(grid, 2, ["seed=2"], _rows([0.5, 1.0]))
    (grid / "2" / "csv" / "metrics.csv").write_bytes(b"\xff\xfe\x00garbage\x00")
    (report,) = aggregate_folder(grid)
    assert [len(c.runs) for c in report.cells] == [1]
    problems = {run.name: run.problem for run in report.runs}
    assert problems == {
        "job 0": None,
        "job 1": "no iteration in csv/metrics.csv (ended before the first one finished)",
        "job 2": "csv/metrics.csv unreadable: 'utf-8' codec can't decode byte 0xff in position 0: invalid start "
        "byte",
    }


def test_each_unreadable_file_and_each_left_out_value_says_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = tmp_path / "sweep"
    _job(grid, 0, ["seed=0"], _rows([0.5, 1.0]))
    _job(grid, 1, ["seed=1"], _rows([0.5, 1.0]))
    (grid / "1" / ".hydra" / "overrides.yaml").write_text("- seed=1\n  : [unclosed\n")
    _job(grid, 2, ["seed=2"], _rows([0.5, 1.0]))
    with (grid / "2" / "csv" / "metrics.csv").open("a") as f:  # one malformed huge row
        f.write('"' + "x" * 200_000 + '"\n')
    _job(grid, 3, ["seed=3"], _rows([0.5, 1.0]))
    (grid / "3" / ".hydra" / "config.yaml").write_text("just a string\n")
    _job(grid, 4, ["seed=4"], [{**row, "train/note": "n/a"} for row in _rows([0.5, 1.0])])
    (report,) = aggregate_folder(grid)
    problems = {run.name: run.problem for run in report.runs}
    assert problems["job 0"] is None
    assert problems["job 1"] is not None and problems["job 1"].startswith(
        ".hydra/overrides.yaml unreadable: while parsing a block"
    )
    assert problems["job 2"] == "csv/metrics.csv unreadable: field larger than field limit (131072)"
    assert problems["job 3"] == ".hydra/config.yaml unreadable: it holds str, not a YAML dict"
    assert problems["job 4"] is None  # complete: its text cells are left out, and said so
    assert report.runs[4].skipped["train/note"].count == 2
    line = "job 4: train/note: 2 non-numeric values (e.g. 'n/a')"
    assert f"- {line}" in report.markdown
    assert f"  {line}, left out" in summary(report)


def test_iterations_reads_every_run_at_one_horizon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = tmp_path / "sweep"
    # configured for 2 iterations, but stopped at different points: 4, 3 (still running), 2
    _job(grid, 0, ["filter=top_p", "seed=0"], _rows([0.0, 0.25, 0.5, 1.0], val=[0.5, 0.25, 0.75, 1.0]))
    still_running = "submitit INFO - Starting with JobEnvironment\n"
    _job(grid, 1, ["filter=top_p", "seed=1"], _rows([0.5, 0.5, 0.0]), log=still_running)
    _job(grid, 2, ["filter=top_p", "seed=2"], _rows([0.25, 0.75]))
    (report,) = aggregate_folder(grid, upto=3)
    problems = {run.name: run.problem for run in report.runs}
    # job 1 reached the horizon: how its job ends later does not count; job 2 did not
    assert problems == {"job 0": None, "job 1": None, "job 2": "2 of 3 iterations"}
    (cell,) = report.cells
    # job 1 never validated, so rollout/success; job 0 read at its third iteration (0.5), not its fourth (1.0)
    assert cell.stats["final_success"].key == "rollout/success"
    assert sorted(cell.stats["final_success"].values) == [0.0, 0.5]
    assert sorted(cell.stats["best_success"].values) == [0.5, 0.5]
    assert sorted(cell.stats["final_reasoning_length"].values) == [12.0, 12.0]
    assert "complete runs over their first 3 iterations (--iterations 3)" in report.markdown
    # without a horizon: job 0 ran past its setting (complete), job 1's job has no verdict yet
    (full,) = aggregate_folder(grid)
    assert {run.name: run.problem for run in full.runs}["job 1"] == (
        "submitit: the job's log ends without a verdict (still running, killed, out of memory?)"
    )
    assert sorted(full.cells[0].stats["final_success"].values) == [0.75, 1.0]
    with pytest.raises(SystemExit, match=r"--iterations 0: must be ≥ 1\. Fix: e\.g\. --iterations 8"):
        main([str(grid), "--iterations", "0"])
    main([str(grid), "--iterations", "2", "--out", str(tmp_path / "out")])
    assert "3 complete runs in 1 cells" in capsys.readouterr().out


def test_trajectories_are_per_iteration_means_over_seeds(tmp_path: Path) -> None:
    grid = _grid(tmp_path / "sweep")
    aggregate_folder(grid, every=1)
    text = (grid / "aggregate_trajectories.md").read_text()
    top_p = text.split("## filter=top_p (seeds 0, 1, 2)")[1].split("##")[0]
    rows = [line for line in top_p.splitlines() if line.startswith("| 0 |") or line.startswith("| 1 |")]
    # iteration 0: success [0, 0.5, 0.5] -> mean 0.333, sd √((0.111 + 2 · 0.0278)/2) = 0.289; format never
    # logged; H(Z|X) 2 in each; MI EMA -1 in each (not the last pass); retrieval 0; length 10; no filter keys
    # then groups: all-success 0, all-fail 0.5, mixed 0.5 in each run; effective reward = success
    assert rows[0] == (
        "| 0 | 0.333 ± 0.29 | — | 2 ± 0 | -1 ± 0 | 0 ± 0 | 10 ± 0 | — | — | 0 ± 0 | 0.5 ± 0 | 0.5 ± 0 | 0.333 ± 0.29 |"
    )
    # iteration 1: success [0.25, 0.5, 0] -> 0.25 ± 0.25; MI EMA [0.1, 0.2, 0.3] -> 0.2 ± 0.1; every group mixed
    assert rows[1] == (
        "| 1 | 0.25 ± 0.25 | — | 1 ± 0 | 0.2 ± 0.1 | 0.1 ± 0 | 11 ± 0 | — | — | 0 ± 0 | 0 ± 0 | 1 ± 0 | 0.25 ± 0.25 |"
    )
    # one run: its value, no spread; the cut-short and crashed seeds of filter=none are not in the means
    assert (
        "| 0 | 0.5 | — | 2 | -1 | 0 | 10 | — | — | 0 | 0.5 | 0.5 | 0.5 |"
        in text.split("## filter=min_p (seeds 0)")[1]
    )
    assert "| 0 | 0.5 ± 0.35 |" in text.split("## filter=none (seeds 0, 1)")[1]
    aggregate_folder(grid, every=2)
    shown = (grid / "aggregate_trajectories.md").read_text()
    assert "| 0 | 0.333 ± 0.29 |" in shown and "| 1 |" not in shown
    with pytest.raises(SystemExit, match=r"--every 0: must be ≥ 1\. Fix: e\.g\. --every 2"):
        main([str(grid), "--every", "0"])


def test_the_default_arms_pair_the_grid_by_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = _grid(tmp_path / "sweep")
    main([str(grid), "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    # top_p seeds 0, 1 against none's complete seeds 0, 1, on rollout/success (none never validated):
    # (0.25 − 0.5, 0.5 − 1.0) = (−0.25, −0.5): mean −0.375, half 12.706205 · 0.176777/√2 = 1.588276
    assert "paired filter=top_p − none, all runs: 2 pairs, 1 unpaired; final_success -0.375 ± 1.6" in printed
    text = (tmp_path / "out" / "aggregate_paired.md").read_text()
    # the one-sided Wilcoxon p-values: both differences negative, so P(W+ ≥ 0) = 1 and P(W− ≥ 3) = 1/4
    assert (
        "| final_success | `rollout/success` | 2 | 0.375 | 0.75 | -0.375 ± 1.6 | 0 / 2 | 1 / 0.25 |" in text
    )
    assert (
        "| job 2 | filter=top_p seed=2 | its filter=none partner (job 5) is left out: 1 of 2 iterations"
        in text
    )
    with (tmp_path / "out" / "aggregate_paired.csv").open() as f:
        row = next(r for r in csv.DictReader(f) if r["quantity"] == "final_success")
    assert (row["pairs"], row["seeds"], row["mean_top_p"], row["mean_none"]) == ("2", "0, 1", "0.375", "0.75")
    assert float(row["ci_high"]) == pytest.approx(-0.375 + 1.588276, abs=1e-6)
    assert (float(row["wilcoxon_p_greater"]), float(row["wilcoxon_p_less"])) == (1.0, 0.25)
    # arms named: min_p against top_p, one pair (seed 0): 0.5 − 0.25 on rollout/success
    main([str(grid), "--out", str(tmp_path / "named"), "--pair", "filter=min_p,top_p", "--steps", "0"])
    assert (
        "| final_success | `rollout/success` | 1 | 0.5 | 0.25 | 0.25 ± — | 1 / 0 |"
        in (tmp_path / "named" / "aggregate_paired.md").read_text()
    )
    with pytest.raises(
        SystemExit, match=r"^ragen2-aggregate: --pair filter=top_p,x: no job of the grid overrides"
    ):
        main([str(grid), "--out", str(tmp_path / "out"), "--pair", "filter=top_p,x"])
    with pytest.raises(
        SystemExit, match=r"^ragen2-aggregate: --steps '4,a': not a list of step counts ≥ 0\. Fix:"
    ):
        main([str(grid), "--steps", "4,a"])
    with pytest.raises(SystemExit, match=r"--steps '-1': not a list"):
        main([str(grid), "--steps", "-1"])


def test_a_grid_without_both_arms_says_it_has_no_pairs(tmp_path: Path) -> None:
    grid = tmp_path / "sweep"
    _job(grid, 0, ["seed=0"], _rows([0.5, 1.0]))
    _job(grid, 1, ["seed=1"], _rows([0.0, 0.5]))
    (report,) = aggregate_folder(grid)
    assert report.arms is None and report.comparisons == []
    assert (
        "No pairs: the grid has no `filter=top_p` and `filter=none` runs"
        in (grid / "aggregate_paired.md").read_text()
    )


def test_a_non_finite_value_is_counted_in_the_table(tmp_path: Path) -> None:
    grid = tmp_path / "sweep"
    rows = _rows([0.5, 1.0], mi=0.2)
    rows[-1]["diag/first_turn/mi_zscore_ema"] = math.nan  # the last MI pass of seed 2 is NaN
    _job(grid, 0, ["seed=0"], _rows([0.5, 1.0], mi=0.1))
    _job(grid, 1, ["seed=1"], _rows([0.0, 0.5], mi=0.3))
    _job(grid, 2, ["seed=2"], rows)
    (report,) = aggregate_folder(grid)
    (cell,) = report.cells
    stat = cell.stats["final_mi_zscore_ema"]
    # (0.1, 0.3): mean 0.2, half 12.706205 · 0.141421/√2 = 1.27; seed 2 counted, never averaged nor read
    # at its earlier pass (−1)
    assert (stat.values, stat.nonfinite) == ([0.1, 0.3], 1)
    # (success (1, 0.5, 1): mean 0.833, s = 0.288675, half 4.302653 · 0.288675/√3 = 0.717; best the same)
    assert (
        "| 3 | 0, 1, 2 | rollout/success | 0.833 ± 0.72 | 0.833 ± 0.72 | 0.2 ± 1.3 (n = 2 +1 non-finite) |"
        in (report.markdown)
    )
    with (grid / "aggregate.csv").open() as f:
        row = next(csv.DictReader(f))
    assert (row["final_mi_zscore_ema_n"], row["final_mi_zscore_ema_nonfinite"]) == ("2", "1")


def test_an_unwritable_destination_is_one_line_before_anything_is_read(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    # the folder does not even exist: --out is checked first
    with pytest.raises(
        SystemExit,
        match=rf"^ragen2-aggregate: --out {blocker}/out: cannot write there \(Not a directory\)\. "
        r"Fix: --out a folder you can write$",
    ):
        main([str(tmp_path / "missing"), "--out", str(blocker / "out")])
    # several grids: each one's subfolder of --out is checked before the first grid is read
    parent = tmp_path / "multirun"
    _grid(parent / "a")
    _grid(parent / "b")
    out = tmp_path / "out"
    out.mkdir()
    (out / "b").write_text("")
    with pytest.raises(
        SystemExit, match=rf"^ragen2-aggregate: --out {out}: cannot write {out}/b \(File exists\)\. Fix:"
    ):
        main([str(parent), "--out", str(out)])
    assert not (out / "a" / "aggregate.csv").exists()  # no grid was aggregated


def test_help_names_every_output_and_the_pairing_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for name in OUTPUTS:
        assert name.split(".")[0] in text, name
    assert "--pair PAIR" in text and "--steps STEPS" in text and "matched optimizer steps" in text
