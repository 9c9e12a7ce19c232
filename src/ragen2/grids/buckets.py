"""Gradient norms by reward-variance bucket pooled over a cell's runs: the paper's SNR figure across runs
(docs/method.md §5).

A run with ``callbacks.gradient_buckets`` on logs, at each measured iteration, ``grad/<b>/<term>`` for its
buckets ``q1`` (lowest RV) … ``qn`` and ``all``, and the terms task, entropy and KL (KL only with a KL term),
with each bucket's mean RV ``grad/<b>/rv_mean`` (docs/diagnostics.md). Per run, per bucket and column, the
mean over the iterations it measured (NaN or ±inf if any one is); per cell, the mean and the two-sided 95 %
Student t interval over its runs, the runs being the independent units (one run's passes are not). The
paper's reading: the task norm grows with RV and is near 0 in the zero-RV buckets, while the entropy and KL
norms stay flat across buckets.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Sequence
from pathlib import Path

from ragen2.grids.plots import pyplot, save
from ragen2.grids.table import Cell, Stat, entry, label, number, run_value, stat_of

TERMS = ("task", "entropy", "kl")  # in the order the figure draws them
_COLUMN = re.compile(r"^grad/(q\d+|all)/(task|entropy|kl|rv_mean)$")


def layout(cells: Sequence[Cell]) -> tuple[list[str], list[str]]:
    """(the buckets some run logged, q1 … qn then all; the terms some run logged, in TERMS' order)."""
    found = [m.groups() for c in cells for r in c.runs for key in r.series if (m := _COLUMN.match(key))]
    quantiles = sorted({b for b, _ in found if b != "all"}, key=lambda b: int(b[1:]))
    buckets = quantiles + (["all"] if any(b == "all" for b, _ in found) else [])
    return buckets, [t for t in TERMS if any(term == t for _, term in found)]


def bucket_stat(cell: Cell, bucket: str, column: str) -> Stat:
    """``grad/<bucket>/<column>``: each run's mean over its measured iterations, then over the runs."""
    key = f"grad/{bucket}/{column}"
    return stat_of(key, [run_value(r.series, key, "mean") for r in cell.runs])


def markdown(cells: Sequence[Cell], keys: Sequence[str]) -> list[str]:
    """aggregate.md's section: per cell, a row per bucket with each term's norm and the bucket's RV."""
    buckets, terms = layout(cells)
    lines = ["## Gradient norms by reward-variance bucket (each run's mean over its measured iterations)", ""]
    if not buckets:
        return [
            *lines,
            "no run logged `grad/*` (gradient buckets off: `callbacks.gradient_buckets.every_n_iterations=5` "
            "turns them on)",
        ]
    header = [*keys, "bucket", "n", *(f"{t} ‖∇‖" for t in terms), "RV (variance)"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cell in cells:
        for bucket in buckets:
            stats = [bucket_stat(cell, bucket, column) for column in (*terms, "rv_mean")]
            n = str(len(cell.runs))
            lines.append(
                "| "
                + " | ".join([*cell.values, bucket, n, *(entry(s, len(cell.runs)) for s in stats)])
                + " |"
            )
    return [
        *lines,
        "",
        "Each entry: mean ± half-width of the 95 % t interval over the cell's runs; `q1` holds the lowest "
        "within-group reward variance, `all` every group. Expected (the paper): the task norm grows with RV, "
        "entropy and KL stay flat. Figure: [aggregate_gradients.png](aggregate_gradients.png).",
    ]


def write_csv(cells: Sequence[Cell], keys: Sequence[str], path: Path) -> Path:
    """aggregate_gradients.csv: a row per cell, bucket and column (a term, or rv_mean)."""
    buckets, terms = layout(cells)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*keys, "bucket", "column", "n", "nonfinite", "mean", "ci_low", "ci_high"])
        for cell in cells:
            for bucket in buckets:
                for column in (*terms, "rv_mean"):
                    stat = bucket_stat(cell, bucket, column)
                    counts = [len(stat.values), stat.nonfinite]
                    writer.writerow(
                        [*cell.values, bucket, column, *counts, *(number(v) for v in stat.interval)]
                    )
    return path


def plot(cells: Sequence[Cell], keys: Sequence[str], path: Path) -> Path:
    """aggregate_gradients.png: a panel per term and one of RV, x the buckets, a line per cell with its 95 %
    interval over runs (each panel on its own scale: the regularisers are orders of magnitude smaller)."""
    plt = pyplot()
    buckets, terms = layout(cells)
    panels = [*terms, "rv_mean"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, column in zip(axes[0], panels):
        for i, cell in enumerate(cells):
            stats = [bucket_stat(cell, b, column) for b in buckets]
            mean = [s.interval.mean for s in stats]
            low = [m - s.interval.low if not math.isnan(s.interval.low) else 0.0 for m, s in zip(mean, stats)]
            high = [
                s.interval.high - m if not math.isnan(s.interval.high) else 0.0 for m, s in zip(mean, stats)
            ]
            name = f"{label(keys, cell.values)} (n = {len(cell.runs)})"
            ax.errorbar(
                range(len(buckets)),
                mean,
                yerr=[low, high],
                marker="o",
                capsize=3,
                color=f"C{i % 10}",
                label=name,
            )
        ax.set_xticks(range(len(buckets)), buckets, fontsize=8)
        ax.set_xlabel("reward-variance bucket (low to high)", fontsize=8)
        ax.set_title(
            "mean within-group reward variance" if column == "rv_mean" else f"{column} gradient norm",
            fontsize=9,
        )
        ax.set_ylim(bottom=0.0)
    if not buckets:
        axes[0][0].text(
            0.5, 0.5, "no run logged grad/*", ha="center", va="center", transform=axes[0][0].transAxes
        )
    elif cells:
        axes[0][0].legend(fontsize=7)
    fig.suptitle("gradient norms by RV bucket: mean and 95 % t interval over runs", fontsize=9)
    return save(fig, path)
