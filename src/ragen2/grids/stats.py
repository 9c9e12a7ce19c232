"""Mean and 95 % confidence interval over a cell's seeds (Student t): the numbers a grid table reports; Spearman's
rank correlation across cells."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import NamedTuple

from scipy import stats


class Interval(NamedTuple):
    mean: float
    low: float  # NaN when there is no interval (n < 2)
    high: float


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
