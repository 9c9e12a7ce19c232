"""A run's MI read against the optimizer steps it had taken, so that arms that step at different rates compare
at the same step count.

The filter drops groups, and with a fixed mini-batch size fewer groups mean fewer optimizer steps per
iteration (docs/method.md §4): at iteration i, ``filter=top_p`` has taken fewer steps than ``filter=none``.
An MI pass runs before its iteration's update (docs/diagnostics.md), so the pass logged at iteration i
reads the policy after the steps of iterations 0 … i − 1: the running sum of ``train/optimizer_steps``
(an iteration that logged none, skipped by the filter, took 0). Between two passes MI is read by linear
interpolation in the step count (exact at a pass; passes at the same step count, with no step between
them, keep the later one); before a run's first pass or past its last it is not read.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from ragen2.grids.runs import Series

STEPS_KEY = "train/optimizer_steps"
MATCHED = ("mi_est_seq", "mi_zscore_ema")  # the quantities of each diag/<curve>/ read at matched steps


def steps_before(series: Series) -> dict[float, float]:
    """{iteration: the optimizer steps taken before its update} over the iterations the run logged."""
    taken = dict(series.get(STEPS_KEY, []))
    out: dict[float, float] = {}
    total = 0.0
    for x in sorted({x for x, _ in series.get("train/iteration", [])}):
        out[x] = total
        total += taken.get(x, 0.0)
    return out


def by_steps(series: Series, key: str) -> list[tuple[float, float]]:
    """[(optimizer steps taken before the pass, value)] of each pass that logged ``key``, by step count."""
    before = steps_before(series)
    points: dict[float, float] = {}
    for x, y in sorted(series.get(key, []), key=lambda p: p[0]):
        if x in before:
            points[before[x]] = y  # a later pass at the same step count replaces an earlier one
    return sorted(points.items())


def at_step(points: Sequence[tuple[float, float]], step: float) -> float | None:
    """The value at ``step``: linear between the passes either side, exact at one; None outside the passes."""
    xs = [x for x, _ in points]
    if not xs or not xs[0] <= step <= xs[-1]:
        return None
    i = bisect.bisect_left(xs, step)
    (x1, y1) = points[i]
    if x1 == step:
        return y1
    (x0, y0) = points[i - 1]
    return y0 + (y1 - y0) * (step - x0) / (x1 - x0)


def default_steps(horizon: float, count: int = 6) -> list[float]:
    """``count`` step counts evenly spaced from 0 to ``horizon`` (whole steps, no repeats)."""
    return sorted({float(round(horizon * k / (count - 1))) for k in range(count)})
