"""results/organism/analyze.py: the protocol's measures and rules on hand-made runs."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ANALYZE = Path(__file__).resolve().parents[2] / "results" / "organism" / "analyze.py"


@pytest.fixture(scope="module")
def analyze():  # results/ is no package: the script's module, loaded from its file
    spec = importlib.util.spec_from_file_location("organism_analyze", ANALYZE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _rows(mi: dict[int, float], h: dict[int, float], success: float, iterations: int = 100) -> list[dict]:
    rows = [
        {"train/iteration": float(i), "rollout/success_learnable": success, "rollout/format_valid_rate": 1.0}
        for i in range(iterations)
    ]
    for i in mi:
        rows[i] |= {"diag/exact/mi": mi[i], "diag/exact/cond_entropy": h[i]}
    return rows


def test_outcome_reads_the_first_and_last_pass_and_the_last_50_iterations(analyze) -> None:
    rows = _rows({0: 3.0, 50: 2.0, 90: 1.4}, {0: 2.0, 50: 2.1, 90: 2.2}, success=0.3)
    for i in range(50):  # the first 50 iterations at 0.6, the last 50 at 0.3
        rows[i]["rollout/success_learnable"] = 0.6
    o = analyze.outcome(rows)
    assert (o.mi0, o.mi_end, o.h0, o.h_end, o.end) == (3.0, 1.4, 2.0, 2.2, 90)
    assert o.success == pytest.approx(0.3) and o.success0 == pytest.approx(0.6)
    assert o.collapse and o.template_collapse  # 1.4 ≤ 1.5 with H up
    falling = analyze.outcome(_rows({0: 3.0, 90: 1.4}, {0: 2.0, 90: 1.9}, 0.3))
    assert falling.collapse and not falling.template_collapse  # entropy fell: a collapse, not a template one
    assert not analyze.outcome(_rows({0: 3.0, 90: 1.6}, {0: 2.0, 90: 2.5}, 0.3)).collapse  # 1.6 > 1.5


def test_the_pilot_rule_takes_the_smallest_beta_with_two_of_three(analyze) -> None:
    o = analyze.Outcome
    tc = o(3.0, 1.0, 2.0, 2.5, 990, 0.5, 0.5, 1.0)  # template collapse, S 0.5
    weak = o(3.0, 1.0, 2.0, 2.5, 990, 0.1, 0.5, 1.0)  # template collapse, S < 0.2
    held = o(3.0, 2.9, 2.0, 2.0, 990, 0.5, 0.5, 1.0)
    outcomes = {
        (0.01, 0): tc,
        (0.01, 1): held,
        (0.01, 2): held,  # one of three: not enough
        (0.03, 0): weak,
        (0.03, 1): weak,
        (0.03, 2): held,  # two of three, both with S < 0.2
        (0.1, 0): tc,
        (0.1, 1): tc,
        (0.1, 2): held,
    }
    assert analyze.pilot_rule(outcomes) == 0.03  # Amendment 1: S is no condition
    assert analyze.pilot_rule(outcomes, min_success=0.2) == 0.1  # the rule as first registered
    assert analyze.pilot_rule({k: held for k in outcomes}) is None


def test_the_end_pass_is_the_last_with_the_format_held(analyze) -> None:
    rows = _rows({0: 3.0, 50: 0.1, 90: 0.9}, {0: 2.0, 50: 6.0, 90: 5.0}, success=0.0)
    for i, mass in ((0, 0.98), (50, 0.99), (90, 0.2)):
        rows[i]["diag/exact/grammar_mass"] = mass
    o = analyze.outcome(rows)
    assert (o.end, o.mi_end, o.h_end, o.format_broke) == (50, 0.1, 6.0, 90)
    assert o.template_collapse


def test_saturation_gap_is_where_the_estimate_is_within_a_tenth_of_log_n(analyze) -> None:
    for n in (4, 16, 64):
        gap = analyze.saturation_gap(n)
        estimate = math.log(n) - math.log(1 + (n - 1) * math.exp(-gap))
        assert estimate == pytest.approx(0.9 * math.log(n))
    assert analyze.saturation_gap(4) == pytest.approx(-math.log((4**0.1 - 1) / 3))  # 3.00 nats
    assert analyze.beta_of("none_b0.03") == 0.03 and analyze.beta_of("none_b0.1_p00.9") == 0.1


def test_a_proxy_sees_a_halving_only_where_it_halves_too(analyze) -> None:
    exact = {0: 4.0, 10: 3.0, 20: 2.0, 30: 1.0}
    assert analyze._halved(exact, {0: 2.0, 10: 1.9, 20: 1.0, 30: 1.1}) == [True, False]
    assert analyze._halved(exact, {10: 2.0}) == []  # one common pass: the first, never half of itself
    assert analyze.pearson([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx(1.0)


def _o(analyze, mi_end: float, h_end: float = 2.5, success: float = 0.5, mi0: float = 3.0):
    return analyze.Outcome(mi0, mi_end, 2.0, h_end, 990, success, 0.5, 1.0)


def test_claim_a_counts_template_collapses_against_the_registered_bounds(analyze) -> None:
    tc, held = _o(analyze, 1.0), _o(analyze, 2.9)
    supported = analyze.claim_a([tc] * 15 + [held] * 5, [held] * 18 + [tc] * 2)
    assert supported["verdict"] == "supported"
    low, high = supported["rate_interval"][1:]
    assert 0.5 < low < 0.51 and 0.91 < high < 0.92  # Clopper–Pearson for 15 of 20
    assert analyze.claim_a([tc] * 15 + [held] * 5, [held] * 17 + [tc] * 3)["verdict"] == "inconclusive"
    assert analyze.claim_a([tc] * 5 + [held] * 15, [held] * 20)["verdict"] == "refuted"
    assert analyze.claim_a([tc] * 10 + [held] * 10, [held] * 20)["verdict"] == "inconclusive"
    assert analyze.claim_a([tc] * 6, [held] * 6)["verdict"] == "partial"
    assert analyze.filter_of("random_drop_b0.1") == "random_drop" and analyze.filter_of("top_p_b0") == "top_p"


def test_claim_c_needs_both_paired_tests_the_margin_and_the_success_bound(analyze) -> None:
    seeds = range(20)
    none = {s: _o(analyze, 0.5) for s in seeds}  # collapsed: MI 0.5 of 3.0
    drop = {s: _o(analyze, 0.6) for s in seeds}
    top = {s: _o(analyze, 2.0 + 0.01 * s) for s in seeds}  # every difference positive: p = 2^-20
    result = analyze.claim_c({"none": none, "random_drop": drop, "top_p": top})
    assert result["verdict"] == "supported"
    assert result["top_p_vs_none"]["p"] == pytest.approx(2.0**-20)
    assert result["top_p_vs_none"]["margin"] == pytest.approx(0.75)  # ¼ of MI₀ = 3.0
    # the same MI gain with success lower by 0.1 on average: the success bound fails
    worse = {s: _o(analyze, 2.0 + 0.01 * s, success=0.4) for s in seeds}
    assert analyze.claim_c({"none": none, "random_drop": drop, "top_p": worse})["verdict"] == "inconclusive"
    # a gain under the margin (0.5 < 0.75): inconclusive; a loss: refuted
    small = {s: _o(analyze, 1.0 + 0.001 * s) for s in seeds}
    assert analyze.claim_c({"none": none, "random_drop": drop, "top_p": small})["verdict"] == "inconclusive"
    lower = {s: _o(analyze, 0.4) for s in seeds}
    assert analyze.claim_c({"none": none, "random_drop": drop, "top_p": lower})["verdict"] == "refuted"
    assert analyze.claim_c({"none": dict(list(none.items())[:5]), "top_p": top})["verdict"] == "partial"


def _pass(rv: dict[str, float], task: dict[str, float], entropy: dict[str, float]) -> dict[str, float]:
    row = {f"grad/{b}/groups": 0.0 for b in ("q1", "q2", "q3", "q4", "q5", "q6")}
    for b in rv:
        row |= {f"grad/{b}/groups": 2.0, f"grad/{b}/rv_mean": rv[b], f"grad/{b}/task": task[b]}
        row[f"grad/{b}/entropy"] = entropy[b]
    return row


def test_gradient_slopes_read_the_buckets_that_hold_groups(analyze) -> None:
    # task norms 1, 2, 3 over rv 0.1, 0.2, 0.3: slope 10, mean 2, scaled 5; entropy 1, 1, 1: slope 0
    full = _pass(
        {"q4": 0.1, "q5": 0.2, "q6": 0.3},
        {"q4": 1.0, "q5": 2.0, "q6": 3.0},
        dict.fromkeys(("q4", "q5", "q6"), 1.0),
    )
    lone = _pass({"q6": 0.3}, {"q6": 9.0}, {"q6": 9.0})  # one bucket: no slope, the pass left out
    found = analyze.gradient_slopes([full, lone, {"train/iteration": 5.0}])
    assert found["passes"] == 1
    assert found["task"] == pytest.approx(10.0) and found["task_scaled"] == pytest.approx(5.0)
    assert found["entropy"] == pytest.approx(0.0) and found["entropy_scaled"] == pytest.approx(0.0)
    assert analyze.claim_b1([found] * 5)["verdict"] == "partial"  # 5 of the 40 none runs
    b1 = analyze.claim_b1([found] * 5, expected=5)
    assert b1["verdict"] == "supported" and b1["task_slope"][1] == pytest.approx(10.0)
    flat = dict(found, task=-1.0, task_scaled=-0.5)
    assert analyze.claim_b1([flat] * 5, expected=5)["verdict"] == "refuted"
    assert analyze.claim_b1([])["verdict"] == "partial"


def test_claim_b2_fits_collapse_on_the_regulariser_to_task_ratio(analyze) -> None:
    # at β 0.1: p₀ 0.5 → x = log 0.2, p₀ 0.9 → x = log 1; collapses 2 of 8 and 6 of 8: a 2×2 table whose
    # slope is the log odds ratio log 9 over the x step log 5, its SE √(4 · (1/6 + 1/2)) / log 5
    points = [(0.1, 0.5, i < 2) for i in range(8)] + [(0.1, 0.9, i < 6) for i in range(8)]
    b2 = analyze.claim_b2(points)
    assert b2["slope"] == pytest.approx(math.log(9) / math.log(5))
    assert b2["slope_se"] == pytest.approx(math.sqrt(1 / 2 + 1 / 6 + 1 / 6 + 1 / 2) / math.log(5))
    assert b2["verdict"] == "inconclusive"  # z = log 9 / √(4/3) = 1.90: p = 0.057
    assert analyze.claim_b2([(0.1, 0.5, False)] * 3)["verdict"] == "partial"


def test_the_exact_trend_test_counts_every_choice_of_the_collapsed_runs(analyze) -> None:
    # two runs at each of two levels, both collapses at the higher: 1 of the C(4, 2) = 6 choices sums as high
    assert analyze.trend_exact([(0.1, 0.5, False)] * 2 + [(0.1, 0.9, True)] * 2) == pytest.approx(1 / 6)
    # one collapse at each level: the 4 choices with one at the higher level or both there, of 6 (5/6)
    mixed = [(0.1, 0.5, True), (0.1, 0.5, False), (0.1, 0.9, True), (0.1, 0.9, False)]
    assert analyze.trend_exact(mixed) == pytest.approx(5 / 6)
    # 10 at each of four levels, none collapsed at the two lowest, 9 and 10 at the others: only the
    # observed choice (C(10, 9) ways) reaches its sum, of C(40, 19)
    dose = [(0.1, p0, i < k) for p0, k in ((0.25, 0), (0.5, 0), (0.75, 9), (0.9, 10)) for i in range(10)]
    assert analyze.trend_exact(dose) == pytest.approx(10 / math.comb(40, 19))


def test_the_dose_axis_reads_p0_from_the_cell_and_b2_waits_for_its_runs(analyze) -> None:
    assert analyze.p0_of("none_b0.1_p00.25") == 0.25 and analyze.p0_of("top_p_b0.1_p00.9") == 0.9
    assert analyze.p0_of("none_b0.1") == analyze.MAIN_P0 == 0.75  # the main stage's level
    points = [(0.1, 0.5, i < 2) for i in range(8)] + [(0.1, 0.9, i < 6) for i in range(8)]
    waiting = analyze.claim_b2(points, expected=40)  # 16 of the 40 runs: the fit shown, no verdict
    assert waiting["verdict"] == "partial" and waiting["slope"] == pytest.approx(math.log(9) / math.log(5))
    held = [(0.1, p0, False) for p0 in (0.5, 0.9)]
    assert analyze.claim_b2(held, expected=40)["verdict"] == "partial"
    assert analyze.claim_b2(held)["verdict"] == "inconclusive"  # every run held: no slope to estimate


def test_the_negative_control_compares_collapse_rates_and_the_success_ranks(analyze) -> None:
    def arms(collapsed_at_star: int, success_if_collapsed: float) -> dict[float, dict[int, object]]:
        # at β* (0.1) the first seeds collapse (MI 3 → 1); at β 0 none does (MI 3 → 2.9)
        held, fallen = (
            _o(analyze, 2.9, success=1 - success_if_collapsed),
            _o(analyze, 1.0, success=success_if_collapsed),
        )
        return {
            0.1: {s: fallen if s < collapsed_at_star else held for s in range(10)},
            0.0: {s: held for s in range(10)},
        }

    # one hop: 8 of 10 collapse, and a collapsed run succeeds more (ρ = −1); two hops: 7 of 10, succeeding less (ρ = +1)
    found = analyze.negative_predictions(arms(8, 0.9), arms(7, 0.1), 0.1)
    assert found["status"] == "complete"
    assert (
        found["n1"]["one_hop"]["rate_at_beta_star"] == 0.8
        and found["n1"]["two_hop"]["rate_at_beta_star"] == 0.7
    )
    assert found["n1"]["holds"] and found["n2"]["holds"]
    assert found["n2"]["one_hop"]["rho"] == pytest.approx(-1.0) and found["n2"]["two_hop"][
        "rho"
    ] == pytest.approx(1.0)
    # the other way round, neither holds; a side short of its 10 seeds per β is partial
    swapped = analyze.negative_predictions(arms(7, 0.1), arms(8, 0.9), 0.1)
    assert not swapped["n1"]["holds"] and not swapped["n2"]["holds"]
    short = arms(8, 0.9)
    del short[0.0][9]
    assert analyze.negative_predictions(short, arms(7, 0.1), 0.1)["status"] == "partial"
    assert analyze.beta_of("none_b0.1_hops1") == 0.1 and analyze.filter_of("none_b0_hops1") == "none"
