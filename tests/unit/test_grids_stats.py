"""grids.stats for a pre-registered study: Clopper–Pearson, the one-sided Wilcoxon test, the bootstrap of a mean and
the logistic fit with its Wald test, against numbers derived by hand or by a second, independent computation."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from ragen2.grids.stats import (
    Interval,
    bootstrap_mean_interval,
    clopper_pearson,
    logistic_fit,
    wilcoxon_greater,
)

# -------------------------------------------------------------------------------------- Clopper–Pearson


def binomial_tail(k: int, n: int, p: float, *, upper: bool) -> float:
    """P(X ≥ k) (upper) or P(X ≤ k) for X ~ Binomial(n, p), summed term by term."""
    terms = range(k, n + 1) if upper else range(k + 1)
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in terms)


def bisect(f: Callable[[float], float], target: float, increasing: bool) -> float:
    """The p in (0, 1) where the monotone f(p) = target, to 1e-12."""
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def test_clopper_pearson_matches_the_binomial_tails() -> None:
    # k = 15, n = 20: low = Beta⁻¹(0.025; 15, 6) ≈ 0.5090, high = Beta⁻¹(0.975; 16, 5) ≈ 0.9134; checked against
    # the p's where P(X ≥ 15) = 0.025 and P(X ≤ 15) = 0.025, found by bisection on the sums of math.comb terms
    mean, low, high = clopper_pearson(15, 20)
    assert mean == 0.75
    assert low == pytest.approx(0.5090, abs=5e-5) and high == pytest.approx(0.9134, abs=5e-5)
    assert low == pytest.approx(bisect(lambda p: binomial_tail(15, 20, p, upper=True), 0.025, True), abs=1e-9)
    assert high == pytest.approx(
        bisect(lambda p: binomial_tail(15, 20, p, upper=False), 0.025, False), abs=1e-9
    )
    # a 90 % interval is narrower, with its bounds at the 5 % tails
    mean90, low90, high90 = clopper_pearson(15, 20, level=0.9)
    assert low < low90 < mean90 < high90 < high
    assert low90 == pytest.approx(
        bisect(lambda p: binomial_tail(15, 20, p, upper=True), 0.05, True), abs=1e-9
    )


def test_clopper_pearson_edges_are_closed_form() -> None:
    # k = 0: P(X ≤ 0) = (1 − p)ⁿ = 0.025 gives high = 1 − 0.025^(1/n); k = n: P(X ≥ n) = pⁿ = 0.025, low = 0.025^(1/n)
    assert clopper_pearson(0, 10) == pytest.approx((0.0, 0.0, 1 - 0.025**0.1), abs=1e-12)
    assert clopper_pearson(0, 10).high == pytest.approx(0.3084971, abs=1e-7)
    assert clopper_pearson(10, 10) == pytest.approx((1.0, 0.025**0.1, 1.0), abs=1e-12)
    assert clopper_pearson(1, 1) == pytest.approx((1.0, 0.025, 1.0), abs=1e-12)
    assert isinstance(clopper_pearson(3, 4), Interval)


@pytest.mark.parametrize(
    ("successes", "n", "level", "named"),
    [
        (-1, 10, 0.95, "successes=-1"),
        (11, 10, 0.95, "successes=11"),
        (0, 0, 0.95, "n=0"),
        (1, 2, 1.0, "level=1.0"),
    ],
)
def test_clopper_pearson_names_a_bad_argument_and_the_fix(
    successes: int, n: int, level: float, named: str
) -> None:
    with pytest.raises(ValueError, match=named) as caught:
        clopper_pearson(successes, n, level)
    assert "Fix:" in str(caught.value)


# -------------------------------------------------------------------------------------- Wilcoxon


def test_wilcoxon_greater_exact_by_counting_sign_patterns() -> None:
    # n = 5 distinct |d|: the 2⁵ = 32 sign patterns are equally likely under the null; all positive is the only
    # pattern with W+ = 15, so p = 1/32; with the rank-1 difference negative W+ = 14, reached by 2 patterns (14, 15)
    assert wilcoxon_greater([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((15.0, 1 / 32))
    assert wilcoxon_greater([-1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((14.0, 2 / 32))
    # all negative: W+ = 0, every pattern has W+ ≥ 0
    assert wilcoxon_greater([-1.0, -2.0, -3.0, -4.0, -5.0]) == pytest.approx((0.0, 1.0))
    # a zero is dropped: the same as the five nonzero differences
    assert wilcoxon_greater([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((15.0, 1 / 32))


def test_wilcoxon_greater_without_a_nonzero_difference_has_no_p() -> None:
    for differences in ([], [0.0], [0.0, 0.0, 0.0]):
        w_plus, p = wilcoxon_greater(differences)
        assert w_plus == 0.0 and math.isnan(p)


# -------------------------------------------------------------------------------------- bootstrap


def test_bootstrap_is_seeded_and_brackets_the_mean() -> None:
    values = [0.1, 0.4, 0.35, 0.8, 0.2, 0.55, 0.9, 0.05]
    first = bootstrap_mean_interval(values, seed=3)
    assert first == bootstrap_mean_interval(values, seed=3)
    assert first != bootstrap_mean_interval(values, seed=4)
    assert first.mean == pytest.approx(sum(values) / len(values))
    assert min(values) < first.low < first.mean < first.high < max(values)


def test_bootstrap_width_follows_the_standard_error() -> None:
    # 0/1 values half and half: sd 0.5, so the mean's 95 % half-width ≈ 1.96 · 0.5/√n: 0.0620 at n = 1000, and the
    # interval narrows as n grows
    wide = bootstrap_mean_interval([0.0, 1.0] * 10)
    narrow = bootstrap_mean_interval([0.0, 1.0] * 500)
    assert narrow.mean == wide.mean == 0.5
    assert narrow.high - narrow.low < wide.high - wide.low
    assert narrow.high - narrow.low == pytest.approx(2 * 1.96 * 0.5 / math.sqrt(1000), rel=0.1)
    # [0, 1]: the resampled means are 0, 0.5, 1 with chances 1/4, 1/2, 1/4, so the 2.5 % and 97.5 % quantiles are 0, 1
    assert bootstrap_mean_interval([0.0, 1.0]) == (0.5, 0.0, 1.0)


def test_bootstrap_edges() -> None:
    assert bootstrap_mean_interval([0.7, 0.7, 0.7]) == pytest.approx((0.7, 0.7, 0.7))
    assert bootstrap_mean_interval([0.7]) == pytest.approx((0.7, 0.7, 0.7))
    assert all(math.isnan(v) for v in bootstrap_mean_interval([]))
    with pytest.raises(ValueError, match="resamples=0"):
        bootstrap_mean_interval([1.0, 2.0], resamples=0)
    with pytest.raises(ValueError, match="level=0"):
        bootstrap_mean_interval([1.0, 2.0], level=0)


# -------------------------------------------------------------------------------------- logistic regression


def table(a: int, b: int, c: int, d: int) -> tuple[list[float], list[int]]:
    """x = 1: a successes, b failures; x = 0: c successes, d failures."""
    xs = [1.0] * (a + b) + [0.0] * (c + d)
    ys = [1] * a + [0] * b + [1] * c + [0] * d
    return xs, ys


def test_logistic_fit_on_a_two_by_two_table_is_the_log_odds_ratio() -> None:
    # binary x: the MLE fits each group's rate, so intercept = log(c/d) = log(3/5), slope = log(ad/(bc)) = log 5,
    # se = √(1/a + 1/b + 1/c + 1/d) = √(1/6 + 1/2 + 1/3 + 1/5) = √1.2, p = erfc(|z|/√2) with z = log 5/√1.2
    fit = logistic_fit(*table(6, 2, 3, 5))
    assert fit.intercept == pytest.approx(math.log(3 / 5), abs=1e-9)
    assert fit.slope == pytest.approx(math.log(5), abs=1e-9)
    assert fit.slope_se == pytest.approx(math.sqrt(1.2), abs=1e-9)
    assert fit.p_value == pytest.approx(math.erfc(math.log(5) / math.sqrt(1.2) / math.sqrt(2)), abs=1e-9)
    assert fit.p_value == pytest.approx(0.1418, abs=1e-4)
    # the reverse association: slope log(1/5), the same se and p
    reverse = logistic_fit(*table(2, 6, 5, 3))
    assert reverse.slope == pytest.approx(-math.log(5), abs=1e-9)
    assert (reverse.slope_se, reverse.p_value) == pytest.approx((fit.slope_se, fit.p_value), abs=1e-9)


def test_logistic_fit_solves_the_score_equations() -> None:
    # a continuous x: at the MLE Σ(y − p) = 0 and Σx(y − p) = 0, and se² = Σw/(Σw·Σwx² − (Σwx)²), w = p(1 − p)
    xs = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0]
    ys = [0, 0, 1, 0, 0, 1, 1, 0, 1, 1]
    fit = logistic_fit(xs, ys)
    ps = [1 / (1 + math.exp(-(fit.intercept + fit.slope * x))) for x in xs]
    assert sum(y - p for y, p in zip(ys, ps)) == pytest.approx(0.0, abs=1e-9)
    assert sum(x * (y - p) for x, y, p in zip(xs, ys, ps)) == pytest.approx(0.0, abs=1e-9)
    ws = [p * (1 - p) for p in ps]
    sw, swx, swxx = sum(ws), sum(w * x for w, x in zip(ws, xs)), sum(w * x * x for w, x in zip(ws, xs))
    assert fit.slope_se == pytest.approx(math.sqrt(sw / (sw * swxx - swx**2)), rel=1e-9)
    assert fit.slope > 0 and 0 < fit.p_value < 1


@pytest.mark.parametrize(
    ("xs", "ys"),
    [
        ([0.0, 1.0, 2.0, 3.0], [0, 0, 1, 1]),  # complete separation
        table(4, 0, 2, 3),  # quasi-complete: a zero cell, an infinite odds ratio
        ([0.0, 1.0, 2.0], [1, 1, 1]),  # one outcome only
        ([2.0, 2.0, 2.0, 2.0], [0, 1, 0, 1]),  # a constant x
    ],
)
def test_logistic_fit_without_a_finite_mle_has_no_test(xs: list[float], ys: list[int]) -> None:
    fit = logistic_fit(xs, ys)
    assert math.isfinite(fit.intercept) and math.isfinite(fit.slope)
    assert math.isnan(fit.slope_se) and math.isnan(fit.p_value)


def test_logistic_fit_names_bad_input() -> None:
    with pytest.raises(ValueError, match=r"len\(xs\)=3 and len\(ys\)=2"):
        logistic_fit([0.0, 1.0, 2.0], [0, 1])
    with pytest.raises(ValueError, match="ys holds 2"):
        logistic_fit([0.0, 1.0, 2.0], [0, 1, 2])
