"""A grid of ``ragen2-train --multirun`` runs as one table: cells, failed runs, CSV, Markdown and plots.

A cell is one setting of the swept override keys (those whose value differs between the grid's jobs) but
``seed``; its runs are the seeds. Each metric in ``METRICS`` is one number per run (its last value, or its
best), then the mean and the two-sided 95 % Student t interval over the cell's complete runs
(``ragen2.grids.stats``). Runs that failed or stopped short are left out of the numbers and listed.
"""

from __future__ import annotations

import csv
import math
import pickle
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from ragen2.grids.stats import Interval, ci95

SEED_KEY = "seed"
# validation first: greedy success on held-out seeds is the number a paper reports; the training
# rollouts' success (sampled, on training seeds) stands in for runs that never validated
SUCCESS_KEYS = ("val/success", "rollout/success")


@dataclass(frozen=True)
class Metric:
    """One number per run, read from its csv/metrics.csv."""

    keys: tuple[str, ...]  # columns by preference: a cell reads the first one all its complete runs logged
    best: bool = False  # the run's largest value instead of its last


#: table column -> the metrics.csv columns it reads (the README lists these)
METRICS: dict[str, Metric] = {
    "final_success": Metric(SUCCESS_KEYS),
    "best_success": Metric(SUCCESS_KEYS, best=True),
    "final_mi_zscore_ema": Metric(("diag/first_turn/mi_zscore_ema",)),
    "final_retrieval_above_chance": Metric(("diag/first_turn/retrieval_above_chance",)),
    "final_cond_entropy": Metric(("diag/first_turn/cond_entropy",)),
    "final_reasoning_length": Metric(("rollout/reasoning_length",)),
}
CURVES = ("final_success", "final_mi_zscore_ema")  # drawn over iterations, from the column each cell read
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
}
OUTPUTS = (
    "aggregate.csv",
    "aggregate.md",
    "aggregate_metrics.png",
    "aggregate_curves.png",
    "aggregate_trajectories.md",
)

Series = dict[str, list[tuple[float, float]]]  # metrics.csv column -> [(iteration, value), …]


class AggregateError(ValueError):
    """Input the aggregator cannot use, named with its path or key and the fix."""


def run_value(series: Series, key: str, best: bool = False) -> float | None:
    """The run's last finite value of ``key`` (by iteration), or its largest; None if it never logged one."""
    points = sorted(((x, y) for x, y in series.get(key, []) if math.isfinite(y)), key=lambda p: p[0])
    if not points:
        return None
    return max(y for _, y in points) if best else points[-1][1]


def pick_key(runs_series: Sequence[Series], metric: Metric) -> str | None:
    """The first of the metric's columns every run logged; else the first any run logged; else None."""
    logged = [[run_value(s, key) is not None for s in runs_series] for key in metric.keys]
    for key, has in zip(metric.keys, logged):
        if has and all(has):
            return key
    return next((key for key, has in zip(metric.keys, logged) if any(has)), None)


# ------------------------------------------------------------------------------------ overrides and cells


def parse_overrides(lines: Sequence[str]) -> dict[str, str]:
    """overrides.yaml's lines -> {key: value}; ``+key``/``++key`` count as ``key``, a deletion stays ``~key``."""
    out: dict[str, str] = {}
    for line in lines:
        key, _, value = str(line).partition("=")
        out[key.lstrip("+")] = value
    return out


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


# ----------------------------------------------------------------------------------------- reading runs


@dataclass
class Run:
    """One job of a grid: what its folder and its submitit log hold."""

    name: str  # "job 3" (its folder's number), or "submitit job <id>" for a job that left no run folder
    folder: Path  # the run folder, or the submitit log folder of a job that left none
    overrides: dict[str, str] | None  # None: no .hydra/overrides.yaml
    job_id: str | None = None  # the submitit job id (hydra.job.id) that ran it
    has_folder: bool = True
    series: Series = field(default_factory=dict)
    iterations: int = 0  # distinct train/iteration values in csv/metrics.csv
    expected: int | None = None  # the run's own `iterations` setting (None: unknown)
    has_csv: bool = False
    has_checkpoint: bool = False
    job_error: str | None = (
        None  # what submitit kept of its failure (result or log); None: none, or no submitit
    )
    problem: str | None = None  # why it is left out of the numbers; None: a complete run


def read_series(path: Path, upto: int | None = None) -> tuple[Series, int]:
    """csv/metrics.csv -> ({column: [(iteration, value), …]}, the number of iterations logged).

    Iteration rows carry ``train/iteration``; validation rows only ``epoch`` (the iteration they follow).
    ``upto``: only iterations 0 … upto − 1 and the validations after them (a common horizon).
    """
    series: Series = {}
    iterations: set[float] = set()
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            x = _float(row.get("train/iteration") or row.get("epoch"))
            if x is None or (upto is not None and x >= upto):
                continue
            if row.get("train/iteration"):
                iterations.add(x)
            for key, value in row.items():
                number = _float(value)
                if key not in ("step", "epoch") and number is not None:
                    series.setdefault(key, []).append((float(x), number))
    return series, len(iterations)


def _float(text: str | None) -> float | None:
    try:
        return None if text in ("", None) else float(text)
    except ValueError:  # a cell a foreign writer left (text, a truncated line): not a metric
        return None


_EXCEPTION = re.compile(r"^[\w.]*(?:Error|Exception|Interrupt|Exit)(?::.*)?$", re.MULTILINE)
_SLURM_END = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED.*\*\*\*")


def log_problem(text: str) -> str | None:
    """What a submitit job log says went wrong; None when its last verdict is 'Job completed successfully'."""
    ok = text.rfind("Job completed successfully")
    raised = text.rfind("Submitted job triggered an exception")
    if ok > raised:
        return None
    if raised >= 0:
        lines = _EXCEPTION.findall(text)
        return _short(lines[-1] if lines else "the job raised an exception (see its log)")
    slurm = _SLURM_END.findall(text)
    return (
        slurm[-1] if slurm else "the job's log ends without a verdict (still running, killed, out of memory?)"
    )


def result_problem(outcome: Any) -> str | None:
    """What a submitit result says went wrong: submitit's own ("error", traceback), or a failure Hydra caught.

    Hydra's ``run_job`` catches the task's exception into its ``JobReturn`` (status FAILED), so submitit
    logs "Job completed successfully" for a job that raised: only the result holds the error.
    """
    status, value = outcome
    if status == "error":
        lines = _EXCEPTION.findall(str(value))
        return lines[-1] if lines else "the job raised an exception (see its log)"
    if getattr(getattr(value, "status", None), "name", None) == "FAILED":
        error = value._return_value  # its return_value property would raise it (and print to stderr)
        return f"{type(error).__name__}: {error}"
    return None


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _unpickle(path: Path) -> Any:
    with path.open("rb") as f:
        return pickle.load(f)  # submitit's own result format; its launching process reads it the same way


def job_problem(folder: Path) -> str | None:
    """What a submitit job folder says went wrong: its results when it wrote them, else its log."""
    results = sorted(folder.glob("*_result.pkl"))  # one per task
    try:
        problems = [result_problem(_unpickle(path)) for path in results]
    except Exception:  # unreadable (truncated, a class that no longer imports): the log still tells
        problems = []
    if problems:
        return next((_short(p) for p in problems if p is not None), None)
    text = _log_text(folder)
    return None if text is None else log_problem(text)


def run_problem(run: Run) -> str | None:
    """Why a run is left out of the numbers (None: complete): no metrics, too few iterations, a failed job."""
    reasons = []
    if not run.has_folder:
        reasons.append("no run folder")
    elif not run.has_csv:
        reasons.append("no csv/metrics.csv")
    elif run.iterations == 0:
        reasons.append("no iteration in csv/metrics.csv (ended before the first one finished)")
    elif run.expected is not None and run.iterations < run.expected:
        reasons.append(f"{run.iterations} of {run.expected} iterations")
    if run.has_folder and run.overrides is None:
        reasons.append("no .hydra/overrides.yaml")
    if run.job_error is not None:
        reasons.append(f"submitit: {run.job_error}")
    # last.ckpt alone decides nothing (grids are often cleaned of their checkpoints); it backs a verdict
    if reasons and run.has_csv and not run.has_checkpoint:
        reasons.append("no checkpoints/last.ckpt")
    return "; ".join(reasons) or None


def _yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return None


def _log_text(folder: Path) -> str | None:
    logs = sorted(folder.glob("*_log.out")) + sorted(folder.glob("*_log.err"))
    return "\n".join(p.read_text(errors="replace") for p in logs) if logs else None


def read_run(folder: Path, submitit: Mapping[str, Path], upto: int | None = None) -> Run:
    """One job folder; ``submitit`` maps submitit job ids to their log folders; ``upto``: read_series'."""
    overrides = _yaml(folder / ".hydra" / "overrides.yaml")
    config = _yaml(folder / ".hydra" / "config.yaml") or {}
    expected = upto or (config.get("iterations") if isinstance(config, dict) else None)
    hydra = _yaml(folder / ".hydra" / "hydra.yaml")
    job = ((hydra.get("hydra") or {}).get("job") or {}) if isinstance(hydra, dict) else {}
    job_id = None if job.get("id") is None else str(job["id"])
    metrics = folder / "csv" / "metrics.csv"
    try:
        series, iterations = read_series(metrics, upto) if metrics.is_file() else ({}, 0)
    except (csv.Error, UnicodeDecodeError, ValueError):  # a damaged file counts as one without iterations
        series, iterations = {}, 0
    return Run(
        name=f"job {folder.name}",
        folder=folder,
        overrides=parse_overrides(overrides) if isinstance(overrides, list) else None,
        job_id=job_id,
        series=series,
        iterations=iterations,
        expected=expected if isinstance(expected, int) else None,
        has_csv=metrics.is_file(),
        has_checkpoint=(folder / "checkpoints" / "last.ckpt").is_file(),
        # past a horizon the run reached, how its job ended (still running, cancelled, crashed) is moot
        job_error=None
        if job_id not in submitit or (upto and iterations >= upto)
        else job_problem(submitit[job_id]),
    )


def _job_folders(grid: Path) -> list[Path]:
    return sorted((p for p in grid.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def _submitit_folders(grid: Path) -> dict[str, Path]:
    """Job id -> its folder (``.submitit/<id>/``, with a pickle or a log; an array's own folder has neither)."""
    root = grid / ".submitit"
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    return {p.name: p for p in folders if any(p.glob("*_submitted.pkl")) or any(p.glob("*_log.*"))}


def read_grid(grid: Path, upto: int | None = None) -> list[Run]:
    """Every job of a sweep folder: its run folders, and submitit jobs that left none; with their verdicts.

    ``upto``: every run read up to that many iterations, and complete only if it logged them all.
    """
    submitit = _submitit_folders(grid)
    runs = [read_run(folder, submitit, upto) for folder in _job_folders(grid)]
    claimed = {r.job_id for r in runs}
    for job_id, folder in submitit.items():
        if job_id not in claimed:
            runs.append(
                Run(
                    f"submitit job {job_id}",
                    folder,
                    None,
                    job_id,
                    has_folder=False,
                    job_error=job_problem(folder),
                )
            )
    longest = max((r.iterations for r in runs), default=0)
    for run in runs:
        if run.expected is None and run.has_csv:  # no config to say: the grid's longest run sets the bar
            run.expected = longest
        run.problem = run_problem(run)
    return runs


def is_grid(folder: Path) -> bool:
    return bool(_submitit_folders(folder)) or any((p / ".hydra").is_dir() for p in _job_folders(folder))


def find_grids(path: Path, depth: int = 3) -> list[Path]:
    """``path`` if it is a sweep folder, else the sweep folders below it (``multirun/<date>/<time>``)."""
    if not path.is_dir():
        raise AggregateError(
            f"{path}: no such folder. Fix: pass a sweep folder of `ragen2-train --multirun` "
            "(multirun/<date>/<time>, holding 0/, 1/, …) or a folder above several"
        )
    if is_grid(path):
        return [path]
    found: list[Path] = []
    if depth > 0:
        for child in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
            found += find_grids(child, depth - 1)
    return found


# ------------------------------------------------------------------------------------------- aggregating


class Stat(NamedTuple):
    key: str | None  # the metrics.csv column read (None: no run logged any)
    values: list[float]  # one per complete run that logged it
    interval: Interval


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
            found = [] if key is None else [run_value(r.series, key, metric.best) for r in cell.runs]
            values = [v for v in found if v is not None]
            cell.stats[name] = Stat(key, values, ci95(values))
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


def _number(value: float) -> str:
    return "" if math.isnan(value) else repr(value)


def write_csv(cells: Sequence[Cell], keys: Sequence[str], path: Path) -> Path:
    columns = [*keys, "n", "seeds", "failed"]
    for name in METRICS:
        columns += [f"{name}_key", f"{name}_mean", f"{name}_ci_low", f"{name}_ci_high", f"{name}_n"]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for cell in cells:
            row: list[str | int] = [*cell.values, len(cell.runs), seeds(cell), len(cell.failed)]
            for stat in cell.stats.values():
                mean, low, high = stat.interval
                row += [stat.key or "", _number(mean), _number(low), _number(high), len(stat.values)]
            writer.writerow(row)
    return path


def _md_cell(text: str) -> str:
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
        "(mean ± t₀.₉₇₅,ₙ₋₁ · s/√n); `± —`: one run, no interval; `—`: no run logged it.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for cell in cells:
        row = [*cell.values, str(len(cell.runs)), seeds(cell) or "—", cell.stats["final_success"].key or "—"]
        row += [fmt(stat.interval) for stat in cell.stats.values()]
        lines.append("| " + " | ".join(_md_cell(v) for v in row) + " |")
    lines += [
        "",
        "Columns read from each run's `csv/metrics.csv` (final: its last value; best: its largest):",
        "",
    ]
    for name, metric in METRICS.items():
        lines.append(f"- {name}: " + " or ".join(f"`{k}`" for k in metric.keys))
    lines += ["", "## Failed or incomplete", ""]
    if failed:
        lines += ["| job | overrides | why |", "|---|---|---|"]
        lines += [f"| {_md_cell(a)} | {_md_cell(b)} | {_md_cell(c)} |" for a, b, c in failed]
    else:
        lines.append("none")
    lines += ["", "![metrics](aggregate_metrics.png)", "", "![curves](aggregate_curves.png)", ""]
    return "\n".join(lines)


def values_by_iteration(series: Sequence[Sequence[tuple[float, float]]]) -> dict[float, list[float]]:
    """{iteration: the finite values the runs logged at it}, from one column of several runs."""
    by_x: dict[float, list[float]] = {}
    for points in series:
        for x, y in points:
            if math.isfinite(y):
                by_x.setdefault(x, []).append(y)
    return by_x


def trajectory_cell(runs: Sequence[Run], iterations: Sequence[int]) -> list[str]:
    """Markdown rows: per iteration, each TRAJECTORY column's mean over the runs that logged it, with the
    sample standard deviation over them where there are several; `—` where none did (no MI pass then)."""
    columns = [values_by_iteration([r.series.get(key, []) for r in runs]) for key in TRAJECTORY.values()]
    lines = ["| iteration | " + " | ".join(TRAJECTORY) + " |", "|" + "---|" * (len(TRAJECTORY) + 1)]
    for it in iterations:
        row = [str(it)]
        for by_x in columns:
            ys = by_x.get(it, [])
            spread = f" ± {statistics.stdev(ys):.2g}" if len(ys) > 1 else ""
            row.append(f"{statistics.fmean(ys):.3g}{spread}" if ys else "—")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def trajectories(grid: Path, cells: Sequence[Cell], keys: Sequence[str], every: int = 1) -> str:
    """aggregate_trajectories.md: one table per cell, every ``every``-th iteration its complete runs logged."""
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
    return "\n".join([*lines, ""])


# ----------------------------------------------------------------------------------------------- figures


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_metrics(cells: Sequence[Cell], keys: Sequence[str], path: Path) -> Path:
    """One panel per metric: each cell's mean with its 95 % interval, and each run's value as a dot."""
    plt = _pyplot()
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
        used = sorted({c.stats[name].key for c in cells if c.stats[name].key})
        ax.set_title(f"{name}\n{' / '.join(used) or 'not logged'}", fontsize=8)
        ax.set_xticks(list(xs), [label(keys, c.values) for c in cells], rotation=30, ha="right", fontsize=7)
    for ax in list(axes.flat)[len(METRICS) :]:
        ax.axis("off")
    fig.suptitle("mean and 95 % t interval over seeds (grey: each run)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def seed_band(series: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float, float, float]]:
    """[(iteration, mean, min, max)] over the runs that logged each iteration."""
    by_x = values_by_iteration(series)
    return [(x, statistics.fmean(ys), min(ys), max(ys)) for x, ys in sorted(by_x.items())]


def plot_curves(cells: Sequence[Cell], keys: Sequence[str], path: Path) -> Path:
    """Success and MI z-score EMA over iterations: each cell's mean over seeds, its band min–max."""
    plt = _pyplot()
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
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------ entry point


@dataclass
class Report:
    grid: Path
    keys: list[str]
    cells: list[Cell]
    runs: list[Run]
    files: list[Path]
    markdown: str


def aggregate_grid(
    grid: Path,
    out: Path | None = None,
    keys: Sequence[str] | None = None,
    upto: int | None = None,
    every: int = 1,
) -> Report:
    """Read one sweep folder (up to ``upto`` iterations per run), aggregate it, write OUTPUTS into ``out``
    (default: the sweep folder); the trajectories show every ``every``-th iteration."""
    runs = read_grid(grid, upto)
    keys = cell_keys([r.overrides for r in runs if r.overrides is not None], keys)
    cells = aggregate(runs, keys)
    out = grid if out is None else out
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path, metrics_png, curves_png, trajectories_md = (out / name for name in OUTPUTS)
    text = markdown(grid, cells, runs, keys, upto)
    md_path.write_text(text)
    files = [
        write_csv(cells, keys, csv_path),
        md_path,
        plot_metrics(cells, keys, metrics_png),
        plot_curves(cells, keys, curves_png),
    ]
    trajectories_md.write_text(trajectories(grid, cells, keys, every))
    files.append(trajectories_md)
    return Report(grid, list(keys), cells, runs, files, text)


def aggregate_folder(
    path: Path,
    out: Path | None = None,
    keys: Sequence[str] | None = None,
    upto: int | None = None,
    every: int = 1,
) -> list[Report]:
    """Every grid at or below ``path``, each on its own (several grids with ``out``: one subfolder each)."""
    grids = find_grids(path)
    if not grids:
        raise AggregateError(
            f"{path}: no runs found (no job folder 0/, 1/, … with .hydra/, no .submitit/ jobs, here or up to "
            "3 levels below). Fix: pass the sweep folder a `ragen2-train --multirun` printed "
            "(multirun/<date>/<time>), or a folder above it"
        )
    reports = []
    for grid in grids:
        target = out if out is None or grid == path else out / grid.relative_to(path)
        reports.append(aggregate_grid(grid, target, keys, upto, every))
    return reports


def summary(report: Report) -> str:
    failed = failed_lines(report.runs, report.keys)
    complete = sum(len(c.runs) for c in report.cells)
    table = [line for line in report.markdown.splitlines() if line.startswith("|")]
    first = table[: len(report.cells) + 2]  # the results table (the failed table follows it)
    lines = [
        f"grid {report.grid}: {complete} complete runs in {len(report.cells)} cells; "
        f"{len(failed)} failed or incomplete" + (":" if failed else ""),
        *(f"  {job} ({settings}): {why}" for job, settings, why in failed),
        *first,
        f"wrote {', '.join(str(p) for p in report.files)}",
    ]
    return "\n".join(lines)
