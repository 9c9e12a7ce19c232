"""Every MI curve a grid logged, aggregated: first-turn, trajectory and per-turn (``diag/<curve>/*``).

A run logs one curve per mode of ``diagnostics.modes``: ``first_turn``, ``trajectory`` and ``turn_<t>`` for
each turn position t ≥ 2, and ``heldout`` with ``diagnostics.heldout`` (docs/diagnostics.md). Per cell and curve, each quantity of ``CURVE_COLUMNS`` at
the run's last MI pass, as mean and 95 % interval over the cell's runs (``aggregate.md``'s "MI by curve",
``aggregate_mi_curves.csv``); per iteration, each curve's MI z-score EMA (``aggregate_trajectories.md``).
Read each curve against its own chance: its ``columns`` differ (docs/diagnostics.md).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from pathlib import Path

from ragen2.curves import CURVE
from ragen2.grids.runs import Run, Series
from ragen2.grids.table import Cell, Stat, entry, number, run_value, spread, stat_of, values_by_iteration

#: column -> the quantity of diag/<curve>/ it reads, each at the run's last MI pass
CURVE_COLUMNS = {
    "MI (nats/seq)": "mi_est_seq",
    "MI z-score EMA": "mi_zscore_ema",
    "retrieval above chance": "retrieval_above_chance",
    "H(Z\\|X) (nats/token)": "cond_entropy",
    "columns": "columns",
}
_CURVE = re.compile(rf"^diag/({CURVE.pattern})/mi_zscore_ema$")


def _order(curve: str) -> tuple[int, int]:
    match = re.fullmatch(r"turn_(\d+)", curve)
    return (3, int(match.group(1))) if match else ({"first_turn": 0, "heldout": 1}.get(curve, 2), 0)


def mi_curves(series: Sequence[Series]) -> list[str]:
    """The curves some run logged: first_turn, heldout, trajectory, then turn_2, turn_3, … by turn."""
    found = {m.group(1) for s in series for key in s if (m := _CURVE.match(key))}
    return sorted(found, key=_order)


def curve_stats(cell: Cell, curve: str) -> dict[str, Stat]:
    """Each CURVE_COLUMNS quantity of one curve at the last MI pass of each of the cell's runs."""
    stats = {}
    for name, quantity in CURVE_COLUMNS.items():
        key = f"diag/{curve}/{quantity}"
        stats[name] = stat_of(key, [run_value(r.series, key) for r in cell.runs])
    return stats


def markdown(cells: Sequence[Cell], keys: Sequence[str]) -> list[str]:
    """aggregate.md's "MI by curve": a row per cell and curve, each quantity at the runs' last pass."""
    curves = mi_curves([r.series for c in cells for r in c.runs])
    lines = ["## MI by curve (each run's last MI pass)", ""]
    if not curves:
        return [*lines, "no run logged an MI pass (`diag/<curve>/*`)"]
    header = [*keys, "curve", "n", *CURVE_COLUMNS]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cell in cells:
        for curve in curves:
            stats = curve_stats(cell, curve).values()
            row = [*cell.values, curve, str(len(cell.runs)), *(entry(s, len(cell.runs)) for s in stats)]
            lines.append("| " + " | ".join(row) + " |")
    return [
        *lines,
        "",
        "Curves: `first_turn` (turn 1 of each episode), `heldout` (turn 1 of fixed held-out instances), "
        "`trajectory` (one turn of each trajectory drawn), `turn_<t>` (turn t of the episodes that reached "
        "it). Their `columns` (distinct X) differ, and so do their chance levels and MI ceilings (log "
        "columns): compare a curve with itself across cells.",
        "",
        "![MI over optimizer steps](aggregate_mi_steps.png)",
    ]


def write_csv(cells: Sequence[Cell], keys: Sequence[str], path: Path) -> Path:
    """aggregate_mi_curves.csv: a row per cell and curve, per quantity its mean, interval and counts."""
    curves = mi_curves([r.series for c in cells for r in c.runs])
    columns = [*keys, "curve", "n"]
    for quantity in CURVE_COLUMNS.values():
        columns += [f"{quantity}_{c}" for c in ("mean", "ci_low", "ci_high", "n", "nonfinite")]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for cell in cells:
            for curve in curves:
                row: list[str | int] = [*cell.values, curve, len(cell.runs)]
                for stat in curve_stats(cell, curve).values():
                    row += [*(number(v) for v in stat.interval), len(stat.values), stat.nonfinite]
                writer.writerow(row)
    return path


def by_iteration(runs: Sequence[Run]) -> list[str]:
    """aggregate_trajectories.md's per-cell table of every curve's MI z-score EMA at each MI pass (mean ±
    sd over seeds); nothing when the runs logged the first-turn curve alone (the main table has it)."""
    curves = mi_curves([r.series for r in runs])
    if curves in ([], ["first_turn"]):
        return []
    columns = [
        values_by_iteration([r.series.get(f"diag/{c}/mi_zscore_ema", []) for r in runs]) for c in curves
    ]
    passes = sorted({x for by_x in columns for x in by_x})
    lines = [
        "",
        "MI z-score EMA by curve, at each MI pass:",
        "",
        "| iteration | " + " | ".join(curves) + " |",
        "|" + "---|" * (len(curves) + 1),
    ]
    lines += [
        "| " + " | ".join([f"{x:g}", *(spread(by_x.get(x, [])) for by_x in columns)]) + " |" for x in passes
    ]
    return lines
