"""Mean and 95 % confidence interval over a cell's seeds (Student t): the numbers a grid table reports; Spearman's
rank correlation across cells; and what a pre-registered study reports: the exact (Clopper–Pearson) interval of a
success rate, the one-sided Wilcoxon signed-rank test of paired differences, the percentile bootstrap of a mean and
a one-predictor logistic regression with its Wald test."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import NamedTuple, cast

import numpy as np
from scipy import special, stats


class Interval(NamedTuple):
    mean: float
    low: float  # NaN when there is no interval (ci95: n < 2)
    high: float


class LogisticFit(NamedTuple):
    intercept: float
    slope: float
    # slope_se and p_value are NaN where there is no finite MLE (separation) or Newton did not converge
    slope_se: float
    p_value: float


def t_quantile(p: float, df: int) -> float:
    """The ``p``-quantile of Student's t with ``df`` degrees of freedom."""
    return float(stats.t.ppf(p, df))


def ci95(values: Sequence[float]) -> Interval:
    """mean ± t_{0.975, n−1} · s/√n, s the sample standard deviation; n = 1 has no interval, n = 0 no mean."""
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan)
    mean = statistics.fmean(values)
    if n == 1:
        return Interval(mean, math.nan, math.nan)
    half = t_quantile(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half)


def spearman(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Spearman's ρ, Pearson's r of the average ranks (tied values share theirs), and its two-sided p-value
    from t = ρ·√((n − 2)/(1 − ρ²)) on Student's t with n − 2 degrees of freedom (scipy's ``spearmanr``);
    NaN for fewer than 3 points or a constant side."""
    n = len(xs)
    if n < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return math.nan, math.nan
    rx, ry = (list(map(float, stats.rankdata(v))) for v in (xs, ys))
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    rho = cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    if abs(rho) >= 1.0:
        return rho, 0.0
    t = rho * math.sqrt((n - 2) / (1 - rho**2))
    return rho, float(2 * stats.t.sf(abs(t), n - 2))


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(
            f"level={level} must lie strictly between 0 and 1. Fix: level=0.95 for a 95 % interval"
        )


def clopper_pearson(successes: int, n: int, level: float = 0.95) -> Interval:
    """The exact binomial interval of k = ``successes`` in ``n`` trials around k/n, α = 1 − level: low =
    Beta⁻¹(α/2; k, n − k + 1) (the p at which P(X ≥ k) = α/2), high = Beta⁻¹(1 − α/2; k + 1, n − k) (the p at which
    P(X ≤ k) = α/2); low = 0 at k = 0 and high = 1 at k = n. Exact, not asymptotic, so it keeps its coverage at
    the small n and the rates near 0 or 1 of a study's cells."""
    if n < 1:
        raise ValueError(f"n={n} must be ≥ 1. Fix: pass the number of trials, at least one")
    if not 0 <= successes <= n:
        raise ValueError(
            f"successes={successes} must lie in 0..n={n}. Fix: count the successes among the n trials"
        )
    _check_level(level)
    alpha = 1.0 - level
    low = float(stats.beta.ppf(alpha / 2, successes, n - successes + 1)) if successes > 0 else 0.0
    high = float(stats.beta.ppf(1 - alpha / 2, successes + 1, n - successes)) if successes < n else 1.0
    return Interval(successes / n, low, high)


def wilcoxon_greater(differences: Sequence[float]) -> tuple[float, float]:
    """The one-sided paired Wilcoxon signed-rank test that the differences' location is > 0: W+ = the sum of the
    ranks of |d| (ties averaged) over the positive d, and p = P(W+ ≥ observed) under the symmetric null (scipy's
    ``wilcoxon(..., alternative="greater")``). Zeros are dropped before ranking (scipy's default zero_method
    "wilcox"). scipy picks the null: the exact distribution for n ≤ 50 without ties or zeros, an exact sign-flip
    permutation for n ≤ 13 with them, else the normal approximation with continuity correction. No nonzero
    difference: W+ = 0 and a NaN p (no test)."""
    if not any(d != 0 for d in differences):
        return 0.0, math.nan
    # scipy's result class is opaque to the type checker: it is the tuple (statistic, pvalue)
    w_plus, p = cast("tuple[float, float]", stats.wilcoxon(differences, alternative="greater"))
    return float(w_plus), float(p)


def bootstrap_mean_interval(
    values: Sequence[float], level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> Interval:
    """The percentile bootstrap of the mean: ``resamples`` means of n values drawn with replacement by a numpy
    Generator seeded with ``seed`` (the same call gives the same interval), the interval their α/2 and 1 − α/2
    quantiles (linear interpolation), α = 1 − level. No normality assumed, for skewed per-seed values; n = 0 has
    no mean (NaN)."""
    _check_level(level)
    if resamples < 1:
        raise ValueError(f"resamples={resamples} must be ≥ 1. Fix: resamples=10_000")
    data = np.asarray(values, dtype=float)
    n = len(data)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    block = max(1, 2**20 // n)  # resamples a draw, so that memory stays ~8 MiB at any n
    means = np.concatenate(
        [
            data[rng.integers(0, n, size=(min(block, resamples - i), n))].mean(axis=1)
            for i in range(0, resamples, block)
        ]
    )
    alpha = 1.0 - level
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return Interval(float(data.mean()), float(low), float(high))


def logistic_fit(xs: Sequence[float], ys: Sequence[int]) -> LogisticFit:
    """P(y = 1) = 1/(1 + e^−(a + b·x)) fit by maximum likelihood with Newton–Raphson (IRLS): β ← β + I⁻¹·Xᵀ(y − p),
    I = Xᵀ diag(p(1 − p)) X, from β = 0, at most 50 steps, until a step is < 1e-10·(1 + |β|). The Wald test of the
    slope: se = √(I⁻¹)_bb at the MLE, z = b/se, two-sided p = 2·(1 − Φ(|z|)). Where there is no finite MLE — the
    0s and 1s (quasi-)separated by x (every x of one outcome ≤ every x of the other, which covers a single outcome
    and a constant x) — or Newton does not converge, the intercept and slope are the last iterate (finite, not
    an estimate) and slope_se and p_value are NaN."""
    if len(xs) != len(ys):
        raise ValueError(f"len(xs)={len(xs)} and len(ys)={len(ys)} differ. Fix: pass one outcome per x")
    not_binary = [y for y in ys if y not in (0, 1)]
    if not_binary:
        raise ValueError(
            f"ys holds {not_binary[0]!r}, not 0/1. Fix: code each outcome as 0 (failure) or 1 (success)"
        )
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    design = np.column_stack([np.ones_like(x), x])
    beta = np.zeros(2)
    converged = False
    for _ in range(50):
        p = special.expit(design @ beta)
        information = design.T @ ((p * (1 - p))[:, None] * design)
        try:
            step = np.linalg.solve(information, design.T @ (y - p))
        except np.linalg.LinAlgError:
            break
        if not np.all(np.isfinite(beta + step)):
            break
        beta = beta + step
        if np.max(np.abs(step)) < 1e-10 * (1 + np.max(np.abs(beta))):
            converged = True
            break
    intercept, slope = float(beta[0]), float(beta[1])
    x0, x1 = x[y == 0], x[y == 1]
    separated = len(x0) == 0 or len(x1) == 0 or x0.max() <= x1.min() or x1.max() <= x0.min()
    if separated or not converged:
        return LogisticFit(intercept, slope, math.nan, math.nan)
    p = special.expit(design @ beta)
    information = design.T @ ((p * (1 - p))[:, None] * design)
    se = float(math.sqrt(np.linalg.inv(information)[1, 1]))
    return LogisticFit(intercept, slope, se, float(2 * stats.norm.sf(abs(slope / se))))
