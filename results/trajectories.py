"""Per-iteration means over seeds, one table per cell, of the metrics the study's questions read.

python results/trajectories.py results/frozenlake_filter_gpu/runs --iterations 40 --every 2

Reads a grid with ragen2-aggregate's own reader (same cells, same complete runs, same horizon) and prints
Markdown: for each cell, a row per iteration with the mean over its complete runs (± the sample standard
deviation over seeds where there are several). Iterations without an MI pass show `—` in the diag columns.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

from ragen2.grids.table import aggregate, cell_keys, label, read_grid

COLUMNS = {
    "success": "rollout/success",
    "format valid": "rollout/format_valid_rate",
    "H(Z|X)": "diag/first_turn/cond_entropy",
    "MI z-score EMA": "diag/first_turn/mi_zscore_ema",
    "retrieval above chance": "diag/first_turn/retrieval_above_chance",
    "reasoning length": "rollout/reasoning_length",
    "filter/score_cv": "filter/score_cv",
    "kept groups": "filter/kept_ratio",
}


def cell_table(runs: list, every: int, upto: int) -> list[str]:
    head = ["iteration", *COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for it in range(0, upto, every):
        row = [str(it)]
        for key in COLUMNS.values():
            values = [y for r in runs for x, y in r.series.get(key, []) if x == it and math.isfinite(y)]
            if not values:
                row.append("—")
            elif len(values) == 1:
                row.append(f"{values[0]:.3g}")
            else:
                row.append(f"{statistics.fmean(values):.3g} ± {statistics.stdev(values):.2g}")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid")
    parser.add_argument("--iterations", type=int, required=True, help="the horizon (as ragen2-aggregate's)")
    parser.add_argument("--every", type=int, default=1)
    args = parser.parse_args()
    runs = read_grid(Path(args.grid), args.iterations)
    keys = cell_keys([r.overrides for r in runs if r.overrides is not None])
    for cell in aggregate(runs, keys):
        seeds = ", ".join((r.overrides or {}).get("seed", "?") for r in cell.runs)
        print(f"\n**{label(keys, cell.values)}** (seeds {seeds}; mean ± sd over seeds)\n")
        print("\n".join(cell_table(cell.runs, args.every, args.iterations)))


if __name__ == "__main__":
    main()
