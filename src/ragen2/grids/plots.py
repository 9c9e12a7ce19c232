"""The figures of a grid: each metric per cell (mean, 95 % interval, each run), the curves over iterations, and MI
over optimizer steps."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragen2.grids.mi import mi_curves
from ragen2.grids.steps import MATCHED, by_steps
from ragen2.grids.table import METRICS, Cell, label, values_by_iteration

CURVES = ("final_success", "final_mi_zscore_ema")  # drawn over iterations, from the column each cell read


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path) -> Path:
    """Lay the figure out, write it to ``path`` and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot().close(fig)
    return path


def plot_metrics(cells: Sequence[Cell], keys: Sequence[str], path: Path) -> Path:
    """One panel per metric: each cell's mean with its 95 % interval, and each run's value as a dot."""
    plt = pyplot()
    cols = 3
    rows = math.ceil(len(METRICS) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.4 * rows), squeeze=False)
    xs = range(len(cells))
    for ax, name in zip(axes.flat, METRICS):
        for x, cell in zip(xs, cells):
            stat = cell.stats[name]
            ax.plot([x] * len(stat.values), stat.values, "o", color="0.6", markersize=3)
            mean, low, high = stat.interval
            if not math.isnan(low):
                ax.errorbar([x], [mean], yerr=[[mean - low], [high - mean]], fmt="o", color="C0", capsize=4)
            elif not math.isnan(mean):
                ax.plot([x], [mean], "o", color="C0")
        used = sorted({key for c in cells if (key := c.stats[name].key)})
        ax.set_title(f"{name}\n{' / '.join(used) or 'not logged'}", fontsize=8)
        ax.set_xticks(list(xs), [label(keys, c.values) for c in cells], rotation=30, ha="right", fontsize=7)
    for ax in list(axes.flat)[len(METRICS) :]:
        ax.axis("off")
    fig.suptitle("mean and 95 % t interval over seeds (grey: each run)", fontsize=9)
    return save(fig, path)


def seed_band(series: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float, float, float]]:
    """[(iteration, mean, min, max)] over the runs that logged a finite value at each iteration."""
    by_x = {x: [y for y in ys if math.isfinite(y)] for x, ys in values_by_iteration(series).items()}
    return [(x, statistics.fmean(ys), min(ys), max(ys)) for x, ys in sorted(by_x.items()) if ys]


def plot_curves(cells: Sequence[Cell], keys: Sequence[str], path: Path) -> Path:
    """Success and MI z-score EMA over iterations: each cell's mean over seeds, its band min–max."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(CURVES), figsize=(5.5 * len(CURVES), 3.6), squeeze=False)
    for ax, name in zip(axes.flat, CURVES):
        for i, cell in enumerate(cells):
            key = cell.stats[name].key
            band = seed_band([r.series.get(key, []) for r in cell.runs]) if key else []
            if not band:
                continue
            x, mean, low, high = zip(*band)
            ax.plot(x, mean, marker="o", color=f"C{i % 10}", label=f"{label(keys, cell.values)} ({key})")
            ax.fill_between(x, low, high, color=f"C{i % 10}", alpha=0.2)
        ax.set_title(f"{name.removeprefix('final_')}: mean over seeds, band min–max", fontsize=9)
        ax.set_xlabel("iteration")
        ax.xaxis.get_major_locator().set_params(integer=True)
        if ax.has_data():
            ax.legend(fontsize=7)
    return save(fig, path)


def plot_mi_steps(cells: Sequence[Cell], keys: Sequence[str], path: Path) -> Path:
    """MI against the optimizer steps taken (``ragen2.grids.steps``): a panel per quantity of the first curve
    logged, a line per run, one colour per cell; arms that step at different rates line up at equal x."""
    plt = pyplot()
    curves = mi_curves([r.series for c in cells for r in c.runs])
    fig, axes = plt.subplots(1, len(MATCHED), figsize=(5.5 * len(MATCHED), 3.6), squeeze=False)
    for ax, quantity in zip(axes.flat, MATCHED):
        key = f"diag/{curves[0]}/{quantity}" if curves else None
        for i, cell in enumerate(cells):
            for j, run in enumerate(cell.runs):
                points = by_steps(run.series, key) if key else []
                if points:
                    x, y = zip(*points)
                    name = label(keys, cell.values) if j == 0 else None
                    ax.plot(x, y, marker="o", markersize=3, lw=1, color=f"C{i % 10}", label=name)
        ax.set_title(f"{key or 'no MI pass logged'}, one line per run", fontsize=9)
        ax.set_xlabel("optimizer steps taken before the pass")
        if ax.has_data():
            ax.legend(fontsize=7)
    return save(fig, path)
