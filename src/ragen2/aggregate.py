"""ragen2-aggregate: a grid of ``ragen2-train --multirun`` runs as one table, mean ± 95 % CI over seeds per
cell (the library is ``ragen2.grids``; ``ragen2-aggregate --help`` lists what it writes).

Why a job failed is read from what submitit left in ``.submitit/<job>/``: its result file, else its log.
A result is a pickle, and unpickling runs the code it names, so by default it is read without importing or
calling anything (a failure Hydra caught is still read: its exception's class and arguments); a result
only unpickling could read is reported as "result not readable without --trust-pickles". Pass
``--trust-pickles`` for grids whose ``.submitit`` folder only you could have written.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path

from ragen2.cli import ProgramParser
from ragen2.grids import AggregateError, aggregate_folder, summary

# ragen2-aggregate --help
ABOUT = "ragen2-aggregate: a grid of ragen2-train --multirun runs as one table, mean ± 95 % CI over seeds per cell."
EXAMPLES = (
    "ragen2-aggregate multirun/2026-11-22/15-54-14                 one grid: the sweep folder holding 0/, 1/, …",
    "ragen2-aggregate multirun/2026-11-22 --out results            every grid below it, each on its own",
    "ragen2-aggregate multirun/2026-11-22/15-54-14 --keys filter   cells by these override keys",
    "ragen2-aggregate multirun/2026-11-22/15-54-14 --iterations 8  every run at its first 8 iterations",
    "ragen2-aggregate multirun/2026-11-22/15-54-14 --trust-pickles unpickle submitit's results in full",
    "ragen2-aggregate multirun/2026-11-22/15-54-14 --pair filter=top_p,none --steps 0,20,40",
)
NOTES = """\
A cell is one setting of the swept override keys (those whose value differs between the grid's jobs) but
seed; its runs are the seeds. Each metric of the table (ragen2.grids.METRICS) is one number per run (its
last value, its largest finite one, or its mean over iterations), then the mean and the two-sided 95 %
Student t interval over the cell's complete runs; a run whose value is NaN or ±inf is counted and reported, never averaged.
Runs that failed or stopped short are left out of the numbers and listed.

Written into the grid's folder (or --out, checked writable before anything is read):
  aggregate.csv, aggregate.md       the cells' table; MI by curve (first-turn, trajectory, per-turn) and
                                    gradient norms by reward-variance bucket, pooled over runs
  aggregate_metrics.png             each metric per cell: mean, 95 % interval, each run
  aggregate_curves.png              success and MI over iterations
  aggregate_trajectories.md         per iteration, means over seeds: success, H(Z|X), MI, the groups by
                                    outcome (all-success, all-fail, mixed), the effective reward; every
                                    MI curve
  aggregate_mi_curves.csv           MI by curve at each run's last pass
  aggregate_gradients.csv/.png      grad/<bucket>/{task,entropy,kl} per bucket, mean ± 95 % interval
  aggregate_mi_steps.png            MI against the optimizer steps taken, a line per run
  aggregate_paired.md, .csv         two arms (--pair) paired by seed: per seed and as the mean difference
                                    with a 95 % t interval over pairs; unpaired runs listed; MI at
                                    matched optimizer steps; Spearman's rho of Std(RV)/Mean(RV) and
                                    score_cv against the filter's gain across comparisons"""


def parse_steps(text: str) -> list[float]:
    """--steps "0,20,40" -> [0.0, 20.0, 40.0]: finite step counts ≥ 0, sorted, without repeats."""
    try:
        steps = sorted({float(part) for part in text.split(",") if part.strip()})
    except ValueError:
        steps = []
    if not steps or not all(math.isfinite(s) and s >= 0 for s in steps):
        raise AggregateError(f"--steps {text!r}: not a list of step counts ≥ 0. Fix: e.g. --steps 0,20,40")
    return steps


def main(argv: Sequence[str] | None = None) -> None:
    parser = ProgramParser("ragen2-aggregate", ABOUT, EXAMPLES, NOTES)
    parser.add_argument(
        "folder", help="a sweep folder (multirun/<date>/<time>, holding 0/, 1/, …) or one above"
    )
    parser.add_argument(
        "--out",
        default=None,
        help="write here instead of into the grid's folder (several grids: a subfolder each)",
    )
    parser.add_argument(
        "--keys",
        default=None,
        help="comma-separated override keys that make a cell (default: every swept key but seed)",
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="read each run's first N iterations only, and count a run complete once it has logged them "
        "(a grid still running, or runs that stopped at different points: one common horizon)",
    )
    parser.add_argument(
        "--every",
        type=int,
        default=1,
        help="aggregate_trajectories.md shows every N-th iteration (default: each one)",
    )
    parser.add_argument(
        "--trust-pickles",
        action="store_true",
        help="unpickle submitit's result files in full, which runs any code they name (default: read them "
        "as inert data); only for a .submitit folder no one else could have written",
    )
    parser.add_argument(
        "--pair",
        default=None,
        help="KEY=A,B: two arms paired by seed, A − B (default: filter=top_p,none when the grid has both)",
    )
    parser.add_argument(
        "--steps",
        default=None,
        help="comma-separated optimizer step counts MI is compared at (default: 6 from 0 to the most steps "
        "both runs of some pair had taken at an MI pass)",
    )
    args = parser.parse_args(argv)
    try:
        keys = None
        if args.keys is not None:
            keys = [k.strip() for k in args.keys.split(",") if k.strip()]
            if not keys:
                raise AggregateError(f"--keys {args.keys!r} names no key. Fix: e.g. --keys filter,algo")
        if args.iterations is not None and args.iterations < 1:
            raise AggregateError(f"--iterations {args.iterations}: must be ≥ 1. Fix: e.g. --iterations 8")
        if args.every < 1:
            raise AggregateError(f"--every {args.every}: must be ≥ 1. Fix: e.g. --every 2")
        steps = None if args.steps is None else parse_steps(args.steps)
        out = None if args.out is None else Path(args.out)
        reports = aggregate_folder(
            Path(args.folder),
            out,
            keys,
            args.iterations,
            args.every,
            trust_pickles=args.trust_pickles,
            pair=args.pair,
            steps=steps,
        )
    except AggregateError as err:
        sys.exit(f"ragen2-aggregate: {err}")
    print("\n\n".join(summary(r) for r in reports))


if __name__ == "__main__":
    main()
