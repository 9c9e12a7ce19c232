"""Mean and 95 % confidence interval over a cell's seeds (Student t): the numbers a grid table reports."""

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
