"""Paired-seed differences between two arms of a grid (``--pair filter=top_p,none``), and MI compared at
matched optimizer steps.

Arms: ``--pair KEY=A,B`` names them, the runs that override KEY with A and with B (by default
``filter=top_p,none`` when the grid has both). A pair is one complete run of each arm whose overrides are
equal but KEY: the same seed and every other setting alike. Its difference is A's value minus B's, and a
metric's paired difference over n pairs is the mean difference with the two-sided 95 % Student t interval
over the pairs, d̄ ± t₀.₉₇₅,ₙ₋₁ · s_d/√n (s_d the sample standard deviation of the differences;
``ragen2.grids.stats.ci95`` of them). Both runs of a pair read the same column (``pick_key`` over every
run of the comparison, so validation success is never set against rollout success); a pair in which either
value is NaN or ±inf is counted as non-finite, never averaged.

Comparisons: the pairs grouped by the cell keys other than KEY (e.g. env, algo), one per setting. A complete
run of an arm without exactly one complete partner is listed as unpaired, with why, and left out: it is
never set against another seed.

MI at matched optimizer steps (``ragen2.grids.steps``): each MI quantity of every curve logged, read in
each run at the same optimizer step counts and differenced per pair, a pair counting at a step count both
its runs reach with MI passes; by default at 6 step counts from 0 to the furthest any pair reaches
(``--steps`` names them).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ragen2.grids.mi import mi_curves
from ragen2.grids.runs import AggregateError, Run
from ragen2.grids.stats import Interval, ci95, wilcoxon_greater
from ragen2.grids.steps import MATCHED, at_step, by_steps, default_steps
from ragen2.grids.table import METRICS, SEED_KEY, cell_of, fmt, label, md_cell, number, pick_key, run_value


@dataclass(frozen=True)
class Arms:
    """Two values of one override key: the difference is ``a`` minus ``b``."""

    key: str
    a: str
    b: str

    @classmethod
    def parse(cls, text: str) -> Arms:
        key, _, values = text.partition("=")
        a, _, b = values.partition(",")
        if not key.strip() or not a.strip() or not b.strip() or "," in b or a.strip() == b.strip():
            raise AggregateError(
                f"--pair {text!r}: not KEY=A,B with two different values. Fix: e.g. --pair filter=top_p,none"
            )
        return cls(key.strip().lstrip("+"), a.strip(), b.strip())

    def __str__(self) -> str:
        return f"{self.key}={self.a},{self.b}"

    def arm(self, run: Run) -> str | None:
        value = (run.overrides or {}).get(self.key)
        return value if value in (self.a, self.b) else None


DEFAULT_ARMS = Arms("filter", "top_p", "none")


def find_arms(runs: Sequence[Run], pair: str | None) -> Arms | None:
    """The arms of ``--pair`` (each value some job's), else ``DEFAULT_ARMS`` where the grid has both."""
    arms = DEFAULT_ARMS if pair is None else Arms.parse(pair)
    found = {(r.overrides or {}).get(arms.key) for r in runs}
    missing = [v for v in (arms.a, arms.b) if v not in found]
    if not missing:
        return arms
    if pair is None:
        return None
    have = sorted(v for v in found if v is not None)
    raise AggregateError(
        f"--pair {pair}: no job of the grid overrides {arms.key}={missing[0]}. Fix: --pair with two of "
        f"{arms.key}'s values {have or '(no job overrides it)'}, e.g. --pair {arms.key}=A,B"
    )


@dataclass(frozen=True)
class Pair:
    a: Run
    b: Run

    @property
    def seed(self) -> str:
        return (self.a.overrides or {}).get(SEED_KEY, "default")


class Difference(NamedTuple):
    """One quantity over a comparison's pairs: each pair's (seed, a, b), and a − b's mean and interval."""

    key: str | None  # the metrics.csv column read (None: no run logged it)
    pairs: list[tuple[str, float, float]]  # the pairs whose both values are finite
    nonfinite: int  # pairs with a NaN or ±inf value
    interval: Interval  # of the differences a − b

    @property
    def means(self) -> tuple[float, float]:
        """Each arm's mean over the same pairs."""
        return ci95([a for _, a, _ in self.pairs]).mean, ci95([b for _, _, b in self.pairs]).mean

    @property
    def signs(self) -> tuple[int, int]:
        """(pairs with a > b, pairs with a < b)."""
        return sum(a > b for _, a, b in self.pairs), sum(a < b for _, a, b in self.pairs)

    @property
    def wilcoxon(self) -> tuple[float, float]:
        """The paired one-sided Wilcoxon signed-rank p-values of a > b and of a < b (a study pre-registers one
        direction; zero differences dropped; NaN without a nonzero one)."""
        diffs = [a - b for _, a, b in self.pairs]
        return wilcoxon_greater(diffs)[1], wilcoxon_greater([-d for d in diffs])[1]


def difference(pairs: Sequence[Pair], key: str | None, read: Callable[[Run], float | None]) -> Difference:
    """``read`` of each run of each pair, differenced; pairs where either run lacks a value are left out."""
    both = [(p.seed, read(p.a), read(p.b)) for p in pairs]
    logged = [(s, a, b) for s, a, b in both if a is not None and b is not None]
    finite = [(s, a, b) for s, a, b in logged if math.isfinite(a) and math.isfinite(b)]
    return Difference(key, finite, len(logged) - len(finite), ci95([a - b for _, a, b in finite]))


@dataclass
class Comparison:
    """The pairs of one setting of the cell keys other than the arms' key."""

    values: tuple[str, ...]
    pairs: list[Pair] = field(default_factory=list)
    unpaired: list[tuple[Run, str]] = field(default_factory=list)
    metrics: dict[str, Difference] = field(default_factory=dict)  # METRICS' name -> its difference
    steps: list[float] = field(default_factory=list)  # the step counts MI is matched at
    matched: dict[str, list[Difference]] = field(default_factory=dict)  # diag key -> one per step count


def _others(run: Run, arms: Arms) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in (run.overrides or {}).items() if k != arms.key))


def pair_runs(runs: Sequence[Run], arms: Arms) -> tuple[list[Pair], list[tuple[Run, str]]]:
    """The pairs among the runs (in arm A's job order), and each complete run of an arm left unpaired, with why."""
    by: dict[tuple[str, tuple[tuple[str, str], ...]], list[Run]] = {}
    for run in runs:
        if (arm := arms.arm(run)) is not None:
            by.setdefault((arm, _others(run, arms)), []).append(run)
    pairs: list[Pair] = []
    unpaired: list[tuple[Run, str]] = []
    for run in runs:
        arm = arms.arm(run)
        if arm is None or run.problem is not None:
            continue
        other = arms.b if arm == arms.a else arms.a
        mine = [r for r in by[(arm, _others(run, arms))] if r.problem is None]
        theirs = by.get((other, _others(run, arms)), [])
        complete = [r for r in theirs if r.problem is None]
        if len(mine) > 1:
            why = f"{len(mine)} complete {arms.key}={arm} runs with these overrides: which to pair is unclear"
        elif len(complete) == 1:
            if arm == arms.a:
                pairs.append(Pair(run, complete[0]))
            continue
        elif len(complete) > 1:
            why = f"{len(complete)} complete {arms.key}={other} runs with these overrides: which to pair is unclear"
        elif theirs:
            why = f"its {arms.key}={other} partner ({theirs[0].name}) is left out: {theirs[0].problem}"
        else:
            why = f"no {arms.key}={other} run with the same other overrides"
        unpaired.append((run, why))
    return pairs, unpaired


def _matched(comparison: Comparison, steps: Sequence[float] | None) -> None:
    """Each MI quantity of each curve at matched step counts, differenced per pair."""
    runs = [r for p in comparison.pairs for r in (p.a, p.b)]
    keys = [f"diag/{c}/{q}" for c in mi_curves([r.series for r in runs]) for q in MATCHED]
    if not keys:
        return
    if steps is None:
        last = {r.name: max((x for x, _ in by_steps(r.series, keys[0])), default=0.0) for r in runs}
        steps = default_steps(max(min(last[p.a.name], last[p.b.name]) for p in comparison.pairs))
    comparison.steps = list(steps)
    for key in keys:
        points = {r.name: by_steps(r.series, key) for r in runs}
        comparison.matched[key] = [difference(comparison.pairs, key, _at(points, s)) for s in steps]


def _at(points: dict[str, list[tuple[float, float]]], step: float) -> Callable[[Run], float | None]:
    return lambda run: at_step(points[run.name], step)


def _reader(key: str | None, read: str) -> Callable[[Run], float | None]:
    return lambda run: None if key is None else run_value(run.series, key, read)


def compare(
    runs: Sequence[Run], keys: Sequence[str], arms: Arms, steps: Sequence[float] | None = None
) -> list[Comparison]:
    """The grid's comparisons (by the cell keys but the arms' key), in first-job order, with every METRICS
    difference and MI at matched steps (``steps``, else 6 from 0 to the furthest step count a pair reaches)."""
    others = [k for k in keys if k != arms.key]
    pairs, unpaired = pair_runs(runs, arms)
    comparisons: dict[tuple[str, ...], Comparison] = {}
    for run in runs:
        if arms.arm(run) is not None and run.overrides is not None:
            values = cell_of(run.overrides, others)
            comparisons.setdefault(values, Comparison(values))
    for pair in pairs:
        comparisons[cell_of(pair.a.overrides or {}, others)].pairs.append(pair)
    for run, why in unpaired:
        comparisons[cell_of(run.overrides or {}, others)].unpaired.append((run, why))
    for comparison in comparisons.values():
        both = [r.series for p in comparison.pairs for r in (p.a, p.b)]
        for name, metric in METRICS.items():
            key = pick_key(both, metric)
            comparison.metrics[name] = difference(comparison.pairs, key, _reader(key, metric.read))
        if comparison.pairs:
            _matched(comparison, steps)
    return list(comparisons.values())


#: the paired columns' last header: the one-sided Wilcoxon signed-rank p-values of a > b and of a < b
WILCOXON = "Wilcoxon p: > / <"


def _cells(diff: Difference) -> list[str]:
    """pairs, each arm's mean, a − b (mean ± half-width, non-finite pairs), the signs, the Wilcoxon p-values."""
    a, b = diff.means
    up, down = diff.signs
    count = f" (+{diff.nonfinite} non-finite)" if diff.nonfinite else ""
    means = [f"{a:.3g}", f"{b:.3g}"] if diff.pairs else ["—", "—"]
    p_up, p_down = (f"{p:.3g}" if math.isfinite(p) else "—" for p in diff.wilcoxon)
    return [
        str(len(diff.pairs)),
        *means,
        f"{fmt(diff.interval)}{count}",
        f"{up} / {down}",
        f"{p_up} / {p_down}",
    ]


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(md_cell(c) for c in cells) + " |"


def _per_seed(values: tuple[float, float] | None) -> str:
    """'+0.1 (0.6 vs 0.5)': the difference, then each arm's value; '—' where the pair has none (or non-finite)."""
    return "—" if values is None else f"{values[0] - values[1]:+.3g} ({values[0]:.3g} vs {values[1]:.3g})"


def comparison_markdown(comparison: Comparison, arms: Arms, others: Sequence[str]) -> list[str]:
    """One comparison's section of aggregate_paired.md."""
    seeds = ", ".join(p.seed for p in comparison.pairs) or "none"
    lines = [f"## {label(others, comparison.values)}: {len(comparison.pairs)} pairs (seeds {seeds})", ""]
    header = ["metric", "column", "pairs", arms.a, arms.b, f"{arms.a} − {arms.b}", "> 0 / < 0", WILCOXON]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [
        _line([name, f"`{d.key}`" if d.key else "—", *_cells(d)]) for name, d in comparison.metrics.items()
    ]
    if comparison.pairs:
        lines += ["", "Per seed, each metric's difference (" + f"{arms.a} vs {arms.b}):", ""]
        names = [n for n, d in comparison.metrics.items() if d.key is not None]
        lines += [_line(["seed", *names]), "|" + "---|" * (len(names) + 1)]
        for pair in comparison.pairs:
            values = [
                {s: (a, b) for s, a, b in comparison.metrics[name].pairs}.get(pair.seed) for name in names
            ]
            lines.append(_line([pair.seed, *(_per_seed(v) for v in values)]))
    if comparison.unpaired:
        lines += [
            "",
            "Unpaired, left out of the differences:",
            "",
            "| job | overrides | why |",
            "|---|---|---|",
        ]
        for run, why in comparison.unpaired:
            shown = (arms.key, *others, SEED_KEY)
            settings = " ".join(f"{k}={v}" for k, v in (run.overrides or {}).items() if k in shown)
            lines.append(_line([run.name, settings, why]))
    if comparison.matched:
        lines += [
            "",
            f"### MI at matched optimizer steps ({arms.a} − {arms.b})",
            "",
            "Each run read at the same count of optimizer steps taken (linear between its MI passes; a pass "
            "counts the steps before its iteration's update).",
        ]
        for key, diffs in comparison.matched.items():
            header = ["steps", "pairs", arms.a, arms.b, f"{arms.a} − {arms.b}", "> 0 / < 0", WILCOXON]
            lines += ["", f"`{key}`:", "", _line(header), "|" + "---|" * len(header)]
            lines += [_line([f"{step:g}", *_cells(d)]) for step, d in zip(comparison.steps, diffs)]
    return lines


def write_csv(
    comparisons: Sequence[Comparison], others: Sequence[str], arms: Arms | None, path: Path
) -> Path:
    """aggregate_paired.csv: a row per comparison and quantity (a metric, or an MI column at a step count);
    the header alone without arms."""
    a, b = (arms.a, arms.b) if arms is not None else ("a", "b")
    columns = [*others, "quantity", "steps", "column", "pairs", "nonfinite", "seeds"]
    columns += [f"mean_{a}", f"mean_{b}", "mean_diff", "ci_low", "ci_high", "positive", "negative"]
    columns += ["wilcoxon_p_greater", "wilcoxon_p_less"]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for c in comparisons:
            rows = [(name, "", d) for name, d in c.metrics.items()]
            rows += [(key, f"{s:g}", d) for key, diffs in c.matched.items() for s, d in zip(c.steps, diffs)]
            for quantity, steps, d in rows:
                seeds = ", ".join(s for s, _, _ in d.pairs)
                writer.writerow(
                    [*c.values, quantity, steps, d.key or "", len(d.pairs), d.nonfinite, seeds]
                    + [number(v) for v in (*d.means, *d.interval)]
                    + list(d.signs)
                    + [number(v) for v in d.wilcoxon]
                )
    return path
