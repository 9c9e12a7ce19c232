"""Cells and their tables: a grid's complete runs grouped by the swept override keys, each metric's mean and
95 % interval over a cell's seeds, and the CSV and Markdown written of them.

A cell is one setting of the swept override keys (those whose value differs between the grid's jobs) but
``seed``; its runs are the seeds. Each metric in ``METRICS`` is one number per run (its last value, or its
best), then the mean and the two-sided 95 % Student t interval over the cell's complete runs
(``ragen2.grids.stats``). Runs that failed or stopped short are left out of the numbers and listed.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ragen2.grids.runs import AggregateError, Run, Series
from ragen2.grids.stats import Interval, ci95

SEED_KEY = "seed"
# validation first: greedy success on held-out seeds is the number a paper reports; the training
# rollouts' success (sampled, on training seeds) stands in for runs that never validated
SUCCESS_KEYS = ("val/success", "rollout/success")


#: how a run's logged values (by iteration) become its one number; a value is NaN or ±inf when the run's is
READS: dict[str, Callable[[Sequence[float]], float]] = {
    "last": lambda ys: ys[-1],
    "first": lambda ys: ys[0],
    "best": lambda ys: max((y for y in ys if math.isfinite(y)), default=math.nan),  # the largest finite
    "mean": statistics.fmean,  # over the iterations that logged it: non-finite if any one is
}


@dataclass(frozen=True)
class Metric:
    """One number per run, read from its csv/metrics.csv."""

    keys: tuple[str, ...]  # columns by preference: a cell reads the first one all its complete runs logged
    read: str = "last"  # a key of READS


#: table column -> the metrics.csv columns it reads (docs/studies.md lists these)
METRICS: dict[str, Metric] = {
    "final_success": Metric(SUCCESS_KEYS),
    "best_success": Metric(SUCCESS_KEYS, read="best"),
    "final_mi_zscore_ema": Metric(("diag/first_turn/mi_zscore_ema",)),
    "final_retrieval_above_chance": Metric(("diag/first_turn/retrieval_above_chance",)),
    "final_cond_entropy": Metric(("diag/first_turn/cond_entropy",)),
    "final_reasoning_length": Metric(("rollout/reasoning_length",)),
    "mean_mixed_groups": Metric(("rollout/groups_mixed",), read="mean"),
    "mean_effective_reward": Metric(("train/effective_reward",), read="mean"),
}
#: aggregate_trajectories.md's columns: what the paper's questions read, iteration by iteration
TRAJECTORY: dict[str, str] = {
    "success": "rollout/success",
    "format valid": "rollout/format_valid_rate",
    "H(Z\\|X)": "diag/first_turn/cond_entropy",
    "MI z-score EMA": "diag/first_turn/mi_zscore_ema",
    "retrieval above chance": "diag/first_turn/retrieval_above_chance",
    "reasoning length": "rollout/reasoning_length",
    "score cv": "filter/score_cv",
    "kept ratio": "filter/kept_ratio",
    "all-success groups": "rollout/groups_all_success",
    "all-fail groups": "rollout/groups_all_fail",
    "mixed groups": "rollout/groups_mixed",
    "effective reward": "train/effective_reward",
}


def run_value(series: Series, key: str, read: str = "last") -> float | None:
    """The run's values of ``key`` by iteration read as ``READS[read]`` says (NaN or ±inf when the run's
    value is: a run that ends on NaN is counted, not read at an earlier pass); None if it never logged one."""
    ys = [y for _, y in sorted(series.get(key, []), key=lambda p: p[0])]
    return READS[read](ys) if ys else None


def pick_key(runs_series: Sequence[Series], metric: Metric) -> str | None:
    """The first of the metric's columns every run logged; else the first any run logged; else None."""
    logged = [[run_value(s, key) is not None for s in runs_series] for key in metric.keys]
    for key, has in zip(metric.keys, logged):
        if has and all(has):
            return key
    return next((key for key, has in zip(metric.keys, logged) if any(has)), None)


def swept_keys(overrides: Sequence[Mapping[str, str]]) -> list[str]:
    """Keys whose value differs between jobs (a job without the key differs too), in first-seen order."""
    keys = dict.fromkeys(key for o in overrides for key in o)
    return [key for key in keys if len({o.get(key) for o in overrides}) > 1]


def cell_keys(overrides: Sequence[Mapping[str, str]], keys: Sequence[str] | None = None) -> list[str]:
    """The keys that define a cell: ``keys`` as given (each one some job overrides), else swept but seed."""
    if keys is None:
        return [key for key in swept_keys(overrides) if key != SEED_KEY]
    known = list(dict.fromkeys(key for o in overrides for key in o))
    for key in keys:
        if key not in known:
            raise AggregateError(
                f"--keys {key}: no job of the grid overrides {key!r}. Fix: --keys with some of "
                f"{','.join(known) or '(no job has overrides)'}"
            )
    return list(keys)


def cell_of(overrides: Mapping[str, str], keys: Sequence[str]) -> tuple[str, ...]:
    return tuple(overrides.get(key, "default") for key in keys)  # not overridden: the config's own value


class Stat(NamedTuple):
    key: str | None  # the metrics.csv column read (None: no run logged any)
    values: list[float]  # the finite ones, one per complete run that logged it
    interval: Interval
    nonfinite: int = 0  # runs whose value is NaN or ±inf: counted and reported, never averaged


def stat_of(key: str | None, found: Sequence[float | None]) -> Stat:
    """The Stat of one value per run (None: the run did not log it): mean and interval of the finite ones; no
    key when no run logged one."""
    logged = [v for v in found if v is not None]
    values = [v for v in logged if math.isfinite(v)]
    return Stat(key if logged else None, values, ci95(values), len(logged) - len(values))


@dataclass
class Cell:
    values: tuple[str, ...]  # the cell keys' values
    runs: list[Run]  # complete runs
    failed: list[Run]
    stats: dict[str, Stat] = field(default_factory=dict)


def aggregate(runs: Sequence[Run], keys: Sequence[str]) -> list[Cell]:
    """Runs -> cells in first-job order, each with its METRICS over its complete runs."""
    cells: dict[tuple[str, ...], Cell] = {}
    for run in runs:
        if run.overrides is None:
            continue  # no overrides: no cell (listed among the failed)
        values = cell_of(run.overrides, keys)
        cell = cells.setdefault(values, Cell(values, [], []))
        (cell.runs if run.problem is None else cell.failed).append(run)
    for cell in cells.values():
        for name, metric in METRICS.items():
            key = pick_key([r.series for r in cell.runs], metric)
            found = [] if key is None else [run_value(r.series, key, metric.read) for r in cell.runs]
            cell.stats[name] = stat_of(key, found)
    return list(cells.values())


def seeds(cell: Cell) -> str:
    return ", ".join((r.overrides or {}).get(SEED_KEY, r.name) for r in cell.runs)


def label(keys: Sequence[str], values: Sequence[str]) -> str:
    return " ".join(f"{k}={v}" for k, v in zip(keys, values)) or "all runs"


def fmt(interval: Interval) -> str:
    """'mean ± half-width'; '± —' without an interval (one run), '—' without a value."""
    if math.isnan(interval.mean):
        return "—"
    if math.isnan(interval.low):
        return f"{interval.mean:.3g} ± —"
    return f"{interval.mean:.3g} ± {(interval.high - interval.low) / 2:.2g}"


def entry(stat: Stat, runs: int) -> str:
    """``fmt`` of the stat, and its count where it is not each of the ``runs``: '0.5 ± — (n = 1 +1 non-finite)'."""
    if stat.key is None or (len(stat.values) == runs and not stat.nonfinite):
        return fmt(stat.interval)
    extra = f" +{stat.nonfinite} non-finite" if stat.nonfinite else ""
    return f"{fmt(stat.interval)} (n = {len(stat.values)}{extra})"


def number(value: float) -> str:
    """A CSV field: the value's repr, blank for NaN (no value)."""
    return "" if math.isnan(value) else repr(value)


def write_csv(cells: Sequence[Cell], keys: Sequence[str], path: Path) -> Path:
    columns = [*keys, "n", "seeds", "failed"]
    for name in METRICS:
        columns += [f"{name}_{c}" for c in ("key", "mean", "ci_low", "ci_high", "n", "nonfinite")]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for cell in cells:
            row: list[str | int] = [*cell.values, len(cell.runs), seeds(cell), len(cell.failed)]
            for stat in cell.stats.values():
                mean, low, high = stat.interval
                row += [
                    stat.key or "",
                    number(mean),
                    number(low),
                    number(high),
                    len(stat.values),
                    stat.nonfinite,
                ]
            writer.writerow(row)
    return path


def md_cell(text: str) -> str:
    """Text for one Markdown table cell: pipes escaped, on one line."""
    return text.replace("|", r"\|").replace("\n", " ")


def failed_lines(runs: Sequence[Run], keys: Sequence[str]) -> list[tuple[str, str, str]]:
    """(job, its overrides on the swept keys, why) of every run left out."""
    shown = [*keys, SEED_KEY]
    out = []
    for run in runs:
        if run.problem is not None:
            settings = " ".join(f"{k}={v}" for k, v in (run.overrides or {}).items() if k in shown)
            out.append((run.name, settings or "—", run.problem))
    return out


def skipped_lines(runs: Sequence[Run]) -> list[str]:
    """'job 3: train/foo: 2 non-numeric values (e.g. 'abc')' for each column of a run with cells left out."""
    return [f"{run.name}: {column}: {seen}" for run in runs for column, seen in run.skipped.items()]


def markdown(
    grid: Path, cells: Sequence[Cell], runs: Sequence[Run], keys: Sequence[str], upto: int | None = None
) -> str:
    failed = failed_lines(runs, keys)
    complete = sum(len(c.runs) for c in cells)
    header = [*keys, "n", "seeds", "success from", *(name.replace("_", " ") for name in METRICS)]
    horizon = f" over their first {upto} iterations (--iterations {upto})" if upto else ""
    lines = [
        f"# ragen2-aggregate: `{grid}`",
        "",
        f"{complete} complete runs{horizon} in {len(cells)} cells (by {', '.join(keys) or 'nothing: one cell'}); "
        f"{len(failed)} failed or incomplete, left out of the numbers (listed below).",
        "Each entry is mean ± half-width of the 95 % Student t interval over the cell's runs "
        "(mean ± t₀.₉₇₅,ₙ₋₁ · s/√n); `± —`: one run, no interval; `—`: no run logged it; "
        "`(n = k +j non-finite)`: k of the cell's runs give a finite value and j a NaN or ±inf "
        "(counted, never averaged).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for cell in cells:
        row = [*cell.values, str(len(cell.runs)), seeds(cell) or "—", cell.stats["final_success"].key or "—"]
        row += [entry(stat, len(cell.runs)) for stat in cell.stats.values()]
        lines.append("| " + " | ".join(md_cell(v) for v in row) + " |")
    lines += [
        "",
        "Columns read from each run's `csv/metrics.csv` (final: its last value; best: its largest finite "
        "one; mean: over its iterations):",
        "",
    ]
    for name, metric in METRICS.items():
        lines.append(f"- {name}: " + " or ".join(f"`{k}`" for k in metric.keys))
    lines += ["", "## Failed or incomplete", ""]
    if failed:
        lines += ["| job | overrides | why |", "|---|---|---|"]
        lines += [f"| {md_cell(a)} | {md_cell(b)} | {md_cell(c)} |" for a, b, c in failed]
    else:
        lines.append("none")
    if skipped := skipped_lines(runs):
        lines += ["", "## Values left out (not numbers)", "", *(f"- {md_cell(line)}" for line in skipped)]
    lines += ["", "![metrics](aggregate_metrics.png)", "", "![curves](aggregate_curves.png)", ""]
    return "\n".join(lines)


def values_by_iteration(series: Sequence[Sequence[tuple[float, float]]]) -> dict[float, list[float]]:
    """{iteration: the values the runs logged at it, non-finite ones included}, from one column of several runs."""
    by_x: dict[float, list[float]] = {}
    for points in series:
        for x, y in points:
            by_x.setdefault(x, []).append(y)
    return by_x


def spread(ys: Sequence[float]) -> str:
    """'mean ± sd' of the finite values (sd over several), '+k non-finite' for the others; '—' for none."""
    finite = [y for y in ys if math.isfinite(y)]
    text = f"{statistics.fmean(finite):.3g}" if finite else "—"
    if len(finite) > 1:
        text += f" ± {statistics.stdev(finite):.2g}"
    bad = len(ys) - len(finite)
    return f"{text} (+{bad} non-finite)" if bad else text


def trajectory_cell(runs: Sequence[Run], iterations: Sequence[int]) -> list[str]:
    """Markdown rows: per iteration, each TRAJECTORY column's mean over the runs that logged it, with the
    sample standard deviation over them where there are several and the count of non-finite values
    (``spread``); `—` where none did (no MI pass then)."""
    columns = [values_by_iteration([r.series.get(key, []) for r in runs]) for key in TRAJECTORY.values()]
    lines = ["| iteration | " + " | ".join(TRAJECTORY) + " |", "|" + "---|" * (len(TRAJECTORY) + 1)]
    for it in iterations:
        lines.append("| " + " | ".join([str(it), *(spread(by_x.get(it, [])) for by_x in columns)]) + " |")
    return lines


def trajectories(
    grid: Path,
    cells: Sequence[Cell],
    keys: Sequence[str],
    every: int = 1,
    extra: Callable[[Cell], list[str]] = lambda cell: [],
) -> str:
    """aggregate_trajectories.md: one table per cell, every ``every``-th iteration its complete runs logged,
    then the lines ``extra`` gives of the cell."""
    lines = [
        f"# ragen2-aggregate: `{grid}`, iteration by iteration",
        "",
        "Per cell, the mean over its complete runs (± the standard deviation over seeds) of: "
        + ", ".join(f"{name} `{key}`" for name, key in TRAJECTORY.items())
        + ". Iterations without an MI pass show `—` in the diag columns.",
    ]
    for cell in cells:
        logged = {int(x) for r in cell.runs for x, _ in r.series.get("train/iteration", [])}
        shown = [it for it in sorted(logged) if it % every == 0]
        lines += ["", f"## {label(keys, cell.values)} (seeds {seeds(cell) or '—'})", ""]
        lines += trajectory_cell(cell.runs, shown) if shown else ["no complete run"]
        lines += extra(cell)
    return "\n".join([*lines, ""])
