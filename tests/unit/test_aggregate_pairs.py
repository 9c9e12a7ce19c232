"""ragen2-aggregate's analysis of two arms: paired-seed differences, MI at matched optimizer steps, Spearman's ρ
of the gain's predictors, MI by curve and gradients by RV bucket, against numbers derived by hand."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from ragen2.grids import buckets, gain, mi
from ragen2.grids.pairs import Arms, compare, comparison_markdown, find_arms, pair_runs
from ragen2.grids.runs import AggregateError, Run, Series
from ragen2.grids.stats import spearman
from ragen2.grids.steps import at_step, by_steps, default_steps, steps_before
from ragen2.grids.table import aggregate

# --------------------------------------------------------------------------------------------- steps


def test_mi_is_read_at_the_optimizer_steps_taken_before_its_pass() -> None:
    # iterations 0–4 took 2, 0 (skipped by the filter: no row), 4, 3, 1 steps; MI passes at 0, 1, 2, 4
    series: Series = {
        "train/iteration": [(float(i), float(i)) for i in range(5)],
        "train/optimizer_steps": [(0.0, 2.0), (2.0, 4.0), (3.0, 3.0), (4.0, 1.0)],
        "diag/first_turn/mi_est_seq": [(0.0, 1.0), (1.0, 0.9), (2.0, 0.5), (4.0, 0.2)],
    }
    # a pass reads the policy before its iteration's update: steps of the iterations before it
    assert steps_before(series) == {0.0: 0.0, 1.0: 2.0, 2.0: 2.0, 3.0: 6.0, 4.0: 9.0}
    # the passes at iterations 1 and 2 both come after 2 steps: the later one (0.5) stands
    points = by_steps(series, "diag/first_turn/mi_est_seq")
    assert points == [(0.0, 1.0), (2.0, 0.5), (9.0, 0.2)]
    assert at_step(points, 2.0) == 0.5  # exact at a pass
    assert at_step(points, 1.0) == pytest.approx(0.75)  # 1.0 + (0.5 − 1.0) · 1/2
    assert at_step(points, 6.0) == pytest.approx(0.5 - 0.3 * 4 / 7)  # 0.5 + (0.2 − 0.5) · (6 − 2)/(9 − 2)
    assert at_step(points, 9.5) is None and at_step(points, -1.0) is None and at_step([], 0.0) is None
    # 6 whole step counts from 0 to the horizon: 0, 0.8, 1.6, 2.4, 3.2, 4 round to 0, 1, 2, 2, 3, 4
    assert default_steps(4.0) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert default_steps(20.0) == [0.0, 4.0, 8.0, 12.0, 16.0, 20.0]
    assert default_steps(0.0) == [0.0]


# ---------------------------------------------------------------------------------------- pairs


def _series(
    success: float,
    steps: Sequence[float],
    mi: Mapping[int, float],
    mi_ema: float = 0.0,
    rv_cv: float = 0.0,
    score_cv: Sequence[float] = (),
) -> Series:
    """A run's columns: len(steps) iterations, validation success at the end, MI passes at ``mi``'s iterations."""
    n = len(steps)
    return {
        "train/iteration": [(float(i), float(i)) for i in range(n)],
        "train/optimizer_steps": [(float(i), s) for i, s in enumerate(steps)],
        "val/success": [(float(n - 1), success)],
        "diag/first_turn/mi_est_seq": [(float(i), v) for i, v in mi.items()],
        "diag/first_turn/mi_zscore_ema": [(float(max(mi)), mi_ema)],
        "rollout/rv_cv": [(0.0, rv_cv), (1.0, 9.0)],  # a later batch's ratio is not the predictor
        "filter/score_cv": [(float(i), v) for i, v in enumerate(score_cv)],
    }


def _run(name: str, overrides: Mapping[str, str], series: Series, problem: str | None = None) -> Run:
    return Run(name, Path(name), dict(overrides), series=series, iterations=3, problem=problem)


def _study() -> list[Run]:
    """filter=top_p steps 2 per iteration, none 4; each run's MI passes at iterations 0 and 2."""
    return [
        _run(
            "job 0", {"filter": "top_p", "seed": "0"}, _series(0.5, [2, 2, 2], {0: 1.0, 2: 0.4}, mi_ema=0.3)
        ),
        _run("job 1", {"filter": "top_p", "seed": "1"}, _series(0.75, [2, 2, 2], {0: 0.8, 2: 0.6}, math.nan)),
        _run("job 2", {"filter": "top_p", "seed": "2"}, _series(0.5, [2, 2, 2], {0: 0.5, 2: 0.5})),
        _run(
            "job 3", {"filter": "none", "seed": "0"}, _series(0.25, [4, 4, 4], {0: 1.0, 2: 0.2}, mi_ema=0.1)
        ),
        _run(
            "job 4", {"filter": "none", "seed": "1"}, _series(0.25, [4, 4, 4], {0: 0.8, 2: 0.0}, mi_ema=0.2)
        ),
        _run("job 5", {"filter": "none", "seed": "2"}, {}, problem="1 of 3 iterations"),
        _run("job 6", {"filter": "none", "seed": "3"}, _series(0.0, [4, 4, 4], {0: 0.1})),
    ]


def test_runs_pair_by_seed_and_the_rest_are_listed_with_why() -> None:
    runs = _study()
    pairs, unpaired = pair_runs(runs, Arms("filter", "top_p", "none"))
    assert [(p.seed, p.a.name, p.b.name) for p in pairs] == [("0", "job 0", "job 3"), ("1", "job 1", "job 4")]
    assert [(run.name, why) for run, why in unpaired] == [
        ("job 2", "its filter=none partner (job 5) is left out: 1 of 3 iterations"),
        ("job 6", "no filter=top_p run with the same other overrides"),
    ]
    # a second complete run with the same overrides: which to pair is unclear, so neither is
    twice = [*runs, _run("job 7", {"filter": "none", "seed": "0"}, runs[3].series)]
    pairs, unpaired = pair_runs(twice, Arms("filter", "top_p", "none"))
    assert [p.seed for p in pairs] == ["1"]
    assert (
        "2 complete filter=none runs with these overrides" in dict((r.name, w) for r, w in unpaired)["job 3"]
    )
    # every other override must match: a different lr is no partner
    other = [
        _run("a", {"filter": "top_p", "seed": "0", "algo.optim.lr": "1e-5"}, runs[0].series),
        _run("b", {"filter": "none", "seed": "0", "algo.optim.lr": "1e-6"}, runs[3].series),
    ]
    assert pair_runs(other, Arms("filter", "top_p", "none"))[0] == []


def test_paired_differences_and_their_t_interval() -> None:
    (comparison,) = compare(_study(), ["filter"], Arms("filter", "top_p", "none"))
    success = comparison.metrics["final_success"]
    # per pair top_p − none: 0.5 − 0.25 = 0.25 (seed 0), 0.75 − 0.25 = 0.5 (seed 1); mean 0.375,
    # s_d = 0.25/√2 = 0.176777, half-width t_{0.975,1} · s_d/√2 = 12.706205 · 0.125 = 1.588276
    assert success.key == "val/success"
    assert success.pairs == [("0", 0.5, 0.25), ("1", 0.75, 0.25)]
    assert success.interval == pytest.approx((0.375, 0.375 - 1.588276, 0.375 + 1.588276), abs=1e-6)
    assert success.means == (0.625, 0.25) and success.signs == (2, 0)
    # seed 1's last MI z-score is NaN: the pair is counted, not averaged
    ema = comparison.metrics["final_mi_zscore_ema"]
    assert (ema.pairs, ema.nonfinite) == ([("0", 0.3, 0.1)], 1)
    assert ema.interval.mean == pytest.approx(0.2) and math.isnan(ema.interval.low)


def test_mi_is_compared_at_matched_optimizer_steps() -> None:
    (comparison,) = compare(_study(), ["filter"], Arms("filter", "top_p", "none"))
    # each pair reaches 4 steps (top_p's last pass, iteration 2 after 2 + 2 steps; none passes at 0 and 8)
    assert comparison.steps == [0.0, 1.0, 2.0, 3.0, 4.0]
    at = dict(zip(comparison.steps, comparison.matched["diag/first_turn/mi_est_seq"]))
    # at 4 steps: seed 0, top_p's pass 0.4 against none's 1.0 + (0.2 − 1.0) · 4/8 = 0.6: −0.2; seed 1,
    # 0.6 against 0.8 + (0 − 0.8) · 4/8 = 0.4: +0.2. Mean 0, s_d = 0.282843, half 12.706205 · 0.2 = 2.541241
    # (read at the same iteration instead, 2, top_p would lead by 0.2 and 0.6)
    assert at[4.0].pairs == [("0", 0.4, pytest.approx(0.6)), ("1", 0.6, pytest.approx(0.4))]
    assert at[4.0].interval == pytest.approx((0.0, -2.541241, 2.541241), abs=1e-6)
    # at 2 steps: seed 0, 1.0 − 0.6 · 2/4 = 0.7 against 1.0 − 0.8 · 2/8 = 0.8; seed 1, 0.7 against 0.6
    assert [round(a - b, 9) for _, a, b in at[2.0].pairs] == [-0.1, 0.1]
    # named step counts: past top_p's last pass (4 steps) no pair is read
    (named,) = compare(_study(), ["filter"], Arms("filter", "top_p", "none"), steps=[0.0, 6.0])
    assert [len(d.pairs) for d in named.matched["diag/first_turn/mi_est_seq"]] == [2, 0]


def test_the_paired_section_shows_each_seed_and_the_unpaired() -> None:
    arms = Arms("filter", "top_p", "none")
    (comparison,) = compare(_study(), ["filter"], arms)
    text = "\n".join(comparison_markdown(comparison, arms, []))
    assert "## all runs: 2 pairs (seeds 0, 1)" in text
    assert "| final_success | `val/success` | 2 | 0.625 | 0.25 | 0.375 ± 1.6 | 2 / 0 |" in text
    assert (
        "| final_mi_zscore_ema | `diag/first_turn/mi_zscore_ema` | 1 | 0.3 | 0.1 | 0.2 ± — (+1 non-finite) |"
        in text
    )
    assert "| 0 | +0.25 (0.5 vs 0.25) |" in text
    assert (
        "| job 2 | filter=top_p seed=2 | its filter=none partner (job 5) is left out: 1 of 3 iterations |"
        in text
    )
    assert "| 4 | 2 | 0.5 | 0.5 | 0 ± 2.5 | 1 / 1 |" in text  # MI at 4 steps, as above


def test_arms_are_named_or_found_and_a_bad_pair_is_one_line() -> None:
    runs = _study()
    assert find_arms(runs, None) == Arms("filter", "top_p", "none")
    assert find_arms(runs, "filter=none,top_p") == Arms("filter", "none", "top_p")
    assert find_arms([_run("x", {"seed": "0"}, {})], None) is None  # no default arms: no pairs
    for bad in ("filter", "filter=top_p", "filter=top_p,top_p", "=a,b", "filter=a,b,c"):
        with pytest.raises(
            AggregateError, match=r"^--pair .*: not KEY=A,B .*Fix: e\.g\. --pair filter=top_p,none$"
        ):
            Arms.parse(bad)
    with pytest.raises(
        AggregateError,
        match=r"^--pair filter=top_p,min_p: no job of the grid overrides filter=min_p\. Fix: .*\['none', 'top_p'\]",
    ):
        find_arms(runs, "filter=top_p,min_p")


# -------------------------------------------------------------------------------------- Spearman


def test_spearman_hand_derived() -> None:
    # ranks (1, 2, 3, 4) and (1, 3, 2, 4): Σd² = 2, ρ = 1 − 6 · 2/(4 · 15) = 0.8; with n − 2 = 2 degrees of
    # freedom t = ρ√(2/(1 − ρ²)) and the two-sided p = 1 − t/√(t² + 2) = 1 − ρ = 0.2
    assert spearman([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0]) == pytest.approx((0.8, 0.2))
    # ties share their ranks: x ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4): Σdxdy = 4.5, Σdx² = 4.5,
    # Σdy² = 5, ρ = 4.5/√22.5 = 0.948683
    assert spearman([1.0, 2.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0])[0] == pytest.approx(0.948683, abs=1e-6)
    assert all(math.isnan(v) for v in spearman([1.0, 2.0], [2.0, 1.0]))  # too few
    assert all(math.isnan(v) for v in spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))  # a constant


def test_the_gain_is_ranked_against_predictors_read_on_the_baseline() -> None:
    # 4 envs, one pair each: gains (top_p − none success) −0.1, 0.2, 0.1, 0.15; the none runs' first-batch
    # Std(RV)/Mean(RV) 0.3, 1.2, 0.8, 1.5 (ranks 1, 3, 2, 4 against the gains' 1, 4, 2, 3: Σd² = 2, ρ = 0.8,
    # p = 0.2); their score_cv means 0.5, 0.5, 1, 2 (ranks 1.5, 1.5, 3, 4: Σdxdy = 0.5, Σdx² = 4.5,
    # Σdy² = 5, ρ = 0.5/√22.5 = 0.105409, p = 1 − ρ = 0.894591)
    gains = [-0.1, 0.2, 0.1, 0.15]
    rv = [0.3, 1.2, 0.8, 1.5]
    score = [(0.0, 1.0), (0.5, 0.5), (1.0, 1.0), (1.5, 2.5)]
    runs = []
    for i, (g, r, s) in enumerate(zip(gains, rv, score)):
        env = f"e{i}"
        base = _series(0.5, [4, 4], {0: 1.0}, rv_cv=r, score_cv=s)
        runs += [
            _run(
                f"{env} top_p",
                {"env": env, "filter": "top_p", "seed": "0"},
                _series(0.5 + g, [2, 2], {0: 1.0}),
            ),
            _run(f"{env} none", {"env": env, "filter": "none", "seed": "0"}, base),
        ]
    arms = Arms("filter", "top_p", "none")
    comparisons = compare(runs, ["env", "filter"], arms)
    assert [c.values for c in comparisons] == [("e0",), ("e1",), ("e2",), ("e3",)]
    first, trained = gain.PREDICTORS.values()
    assert [gain.predictor(c, first) for c in comparisons] == rv
    assert [gain.predictor(c, trained) for c in comparisons] == [0.5, 0.5, 1.0, 2.0]
    assert [gain.gain(c, "final_success") for c in comparisons] == pytest.approx(gains)
    text = "\n".join(gain.markdown(comparisons, arms, ["env"]))
    assert "| Std(RV)/Mean(RV), first batch | final_success | 4 | +0.800 | 0.2 |" in text
    assert "| score_cv, mean over training | final_success | 4 | +0.105 | 0.895 |" in text
    assert "| env=e1 | 1 | 1.2 | 0.5 | 0.2 | 0 |" in text  # the MI z-score EMA gain: 0 − 0


# ------------------------------------------------------------------------------ curves and buckets


def _cell_runs() -> list[Run]:
    def run(seed: str, ema: float, task: Sequence[float], rv: Sequence[float]) -> Run:
        series: Series = {
            "train/iteration": [(0.0, 0.0), (1.0, 1.0)],
            "diag/first_turn/mi_zscore_ema": [(0.0, 0.5), (1.0, ema)],
            "diag/trajectory/mi_zscore_ema": [(0.0, 0.2), (1.0, ema / 2)],
            "diag/turn_2/mi_zscore_ema": [(0.0, 0.1)],
            "diag/turn_10/mi_zscore_ema": [(0.0, 0.0)],
        }
        for b, name in enumerate(("q1", "q2", "all")):
            series[f"grad/{name}/task"] = [(0.0, task[b]), (1.0, task[b] + 0.2)]
            series[f"grad/{name}/entropy"] = [(0.0, 0.01), (1.0, 0.03)]
            series[f"grad/{name}/rv_mean"] = [(0.0, rv[b])]
        return Run(f"job {seed}", Path(seed), {"seed": seed}, series=series, iterations=2)

    return [
        run("0", 0.3, [0.0, 1.0, 0.5], [0.0, 0.5, 0.25]),
        run("1", 0.1, [0.2, 1.4, 0.8], [0.0, 1.5, 0.75]),
    ]


def test_every_mi_curve_is_aggregated(tmp_path: Path) -> None:
    runs = _cell_runs()
    (cell,) = aggregate(runs, [])
    assert mi.mi_curves([r.series for r in runs]) == ["first_turn", "trajectory", "turn_2", "turn_10"]
    # the last pass: first_turn (0.3, 0.1) -> 0.2 ± 12.706205 · 0.141421/√2 = 1.27; trajectory (0.15, 0.05)
    stats = mi.curve_stats(cell, "trajectory")["MI z-score EMA"]
    assert stats.interval.mean == pytest.approx(0.1) and stats.values == [0.15, 0.05]
    text = "\n".join(mi.markdown([cell], []))
    assert "| first_turn | 2 | — | 0.2 ± 1.3 |" in text and "| turn_10 | 2 | — | 0 ± 0 |" in text
    # per iteration: each curve's mean ± sd over seeds; a curve without a pass then shows —
    rows = mi.by_iteration(runs)
    assert "| iteration | first_turn | trajectory | turn_2 | turn_10 |" in rows
    assert "| 1 | 0.2 ± 0.14 | 0.1 ± 0.071 | — | — |" in rows
    with (mi.write_csv([cell], [], tmp_path / "mi.csv")).open() as f:
        table = list(csv.DictReader(f))
    assert [r["curve"] for r in table] == ["first_turn", "trajectory", "turn_2", "turn_10"]
    assert float(table[1]["mi_zscore_ema_mean"]) == pytest.approx(0.1) and table[1]["mi_est_seq_n"] == "0"
    # the first-turn curve alone: the main trajectory table already has it
    assert (
        mi.by_iteration([Run("x", Path("x"), {}, series={"diag/first_turn/mi_zscore_ema": [(0.0, 1.0)]})])
        == []
    )


def test_gradient_norms_by_bucket_pool_each_runs_mean_over_runs(tmp_path: Path) -> None:
    runs = _cell_runs()
    (cell,) = aggregate(runs, [])
    assert buckets.layout([cell]) == (["q1", "q2", "all"], ["task", "entropy"])  # no KL term logged
    # each run's mean over its 2 passes: q2 task (1.0, 1.2) -> 1.1 and (1.4, 1.6) -> 1.5; over runs
    # 1.3 ± 12.706205 · 0.282843/√2 = 2.541241
    q2 = buckets.bucket_stat(cell, "q2", "task")
    assert q2.values == pytest.approx([1.1, 1.5])
    assert q2.interval == pytest.approx((1.3, 1.3 - 2.541241, 1.3 + 2.541241), abs=1e-6)
    assert buckets.bucket_stat(cell, "q1", "entropy").interval == pytest.approx((0.02, 0.02, 0.02))
    assert buckets.bucket_stat(cell, "all", "rv_mean").values == [0.25, 0.75]
    assert buckets.bucket_stat(cell, "q1", "kl").key is None
    text = "\n".join(buckets.markdown([cell], []))
    # q2's RV (0.5, 1.5): mean 1, half-width 12.706205 · 0.707107/√2 = 6.35
    assert "| q2 | 2 | 1.3 ± 2.5 | 0.02 ± 0 | 1 ± 6.4 |" in text
    with buckets.write_csv([cell], [], tmp_path / "g.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if (r["bucket"], r["column"]) == ("q2", "task")]
    assert float(rows[0]["mean"]) == pytest.approx(1.3) and rows[0]["n"] == "2"
    assert buckets.plot([cell], [], tmp_path / "g.png").stat().st_size > 0
    assert "no run logged `grad/*`" in "\n".join(
        buckets.markdown(aggregate([Run("x", Path("x"), {})], []), [])
    )
