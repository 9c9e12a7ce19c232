"""A grid's runs read back: each job folder's overrides, config, metrics series and checkpoint, the submitit
jobs that left no folder, and whether each run is complete (else why it is left out of the numbers)."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from ragen2.grids.forensics import job_problem, submitit_folders

Series = dict[str, list[tuple[float, float]]]  # metrics.csv column -> [(iteration, value), …]


class AggregateError(ValueError):
    """Input the aggregator cannot use, named with its path or key and the fix."""


#: keys that say how a job was started, not what it studies: a run resumed with ``ckpt_path=last`` (a staged
#: study's later stages) is in the same cell and pair as the run it continues
RUN_CONTROL = frozenset({"ckpt_path"})


def parse_overrides(lines: Sequence[str]) -> dict[str, str]:
    """overrides.yaml's lines -> {key: value}; ``+key``/``++key`` count as ``key``, a deletion stays ``~key``;
    ``RUN_CONTROL`` keys are left out."""
    out: dict[str, str] = {}
    for line in lines:
        key, _, value = str(line).partition("=")
        out[key.lstrip("+")] = value
    return {k: v for k, v in out.items() if k not in RUN_CONTROL}


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
    unreadable: dict[str, str] = field(default_factory=dict)  # file -> why it could not be read
    skipped: dict[str, Skipped] = field(default_factory=dict)  # column -> its cells that are not numbers


@dataclass
class Skipped:
    """A column's cells that are not numbers (text a foreign writer left, a line cut short): left out."""

    count: int
    example: str

    def __str__(self) -> str:
        return f"{self.count} non-numeric value{'s' * (self.count != 1)} (e.g. {self.example[:40]!r})"


class SeriesRead(NamedTuple):
    series: Series  # {column: [(iteration, value), …]}
    iterations: int  # the number of iterations logged
    skipped: dict[str, Skipped]  # column -> its cells that are not numbers, left out of ``series``


def read_series(path: Path, upto: int | None = None) -> SeriesRead:
    """csv/metrics.csv -> its columns' values by iteration, the number of iterations, the cells left out.

    Iteration rows carry ``train/iteration``; validation rows only ``epoch`` (the iteration they follow).
    ``upto``: only iterations 0 … upto − 1 and the validations after them (a common horizon).
    """
    series: Series = {}
    skipped: dict[str, Skipped] = {}
    iterations: set[float] = set()
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            x = _float(row.get("train/iteration") or row.get("epoch"))
            if x is None or (upto is not None and x >= upto):
                continue
            if row.get("train/iteration"):
                iterations.add(x)
            for key, value in row.items():
                if key in ("step", "epoch") or value in ("", None):
                    continue
                number = _float(value)
                if number is not None:
                    series.setdefault(key, []).append((float(x), number))
                elif key is not None:  # (None: the cells of a row longer than the header)
                    seen = skipped.setdefault(key, Skipped(0, str(value)))
                    seen.count += 1
    return SeriesRead(series, len(iterations), skipped)


def _float(text: str | None) -> float | None:
    try:
        return None if text in ("", None) else float(text)
    except (ValueError, TypeError):  # a cell a foreign writer left (text, a truncated line): not a metric
        return None


def run_problem(run: Run) -> str | None:
    """Why a run is left out of the numbers (None: complete): no metrics, too few iterations, a failed job."""
    reasons = [f"{name} unreadable: {why}" for name, why in run.unreadable.items()]
    if not run.has_folder:
        reasons.append("no run folder")
    elif not run.has_csv:
        reasons.append("no csv/metrics.csv")
    elif METRICS_FILE in run.unreadable:
        pass
    elif run.iterations == 0:
        reasons.append("no iteration in csv/metrics.csv (ended before the first one finished)")
    elif run.expected is not None and run.iterations < run.expected:
        reasons.append(f"{run.iterations} of {run.expected} iterations")
    if run.has_folder and run.overrides is None and OVERRIDES_FILE not in run.unreadable:
        reasons.append("no .hydra/overrides.yaml")
    if run.job_error is not None:
        reasons.append(f"submitit: {run.job_error}")
    # last.ckpt alone decides nothing (grids are often cleaned of their checkpoints); it backs a verdict
    if reasons and run.has_csv and not run.has_checkpoint:
        reasons.append("no checkpoints/last.ckpt")
    return "; ".join(reasons) or None


#: a run folder's files the aggregate reads, relative to it
METRICS_FILE, OVERRIDES_FILE, CONFIG_FILE, HYDRA_FILE = (
    "csv/metrics.csv",
    ".hydra/overrides.yaml",
    ".hydra/config.yaml",
    ".hydra/hydra.yaml",
)


def _yaml(folder: Path, name: str, unreadable: dict[str, str], kind: type = dict) -> Any:
    """``folder/name`` parsed, or None when it is not there; why it could not be read, or what it holds
    instead of a ``kind``, goes into ``unreadable``."""
    path = folder / name
    if not path.is_file():
        return None
    try:
        value = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        unreadable[name] = str(err).splitlines()[0] if str(err) else type(err).__name__
        return None
    if not isinstance(value, kind):
        unreadable[name] = f"it holds {type(value).__name__}, not a YAML {kind.__name__}"
        return None
    return value


def read_run(
    folder: Path, submitit: Mapping[str, Path], upto: int | None = None, *, trust_pickles: bool = False
) -> Run:
    """One job folder; ``submitit`` maps submitit job ids to their log folders; ``upto``: read_series';
    ``trust_pickles``: job_problem's."""
    unreadable: dict[str, str] = {}
    overrides = _yaml(folder, OVERRIDES_FILE, unreadable, list)
    config = _yaml(folder, CONFIG_FILE, unreadable) or {}
    expected = upto or config.get("iterations")
    hydra = _yaml(folder, HYDRA_FILE, unreadable) or {}
    job = (hydra.get("hydra") or {}).get("job") or {}
    job_id = None if job.get("id") is None else str(job["id"])
    metrics = folder / METRICS_FILE
    read = SeriesRead({}, 0, {})
    try:
        read = read_series(metrics, upto) if metrics.is_file() else read
    except (csv.Error, UnicodeDecodeError, ValueError) as err:  # binary, or a row past csv's field limit
        unreadable[METRICS_FILE] = str(err)
    return Run(
        name=f"job {folder.name}",
        folder=folder,
        overrides=parse_overrides(overrides) if overrides is not None else None,
        job_id=job_id,
        series=read.series,
        iterations=read.iterations,
        unreadable=unreadable,
        skipped=read.skipped,
        expected=expected if isinstance(expected, int) else None,
        has_csv=metrics.is_file(),
        has_checkpoint=(folder / "checkpoints" / "last.ckpt").is_file(),
        # past a horizon the run reached, how its job ended (still running, cancelled, crashed) is moot
        job_error=None
        if job_id is None or job_id not in submitit or (upto and read.iterations >= upto)
        else job_problem(submitit[job_id], trust_pickles),
    )


def _job_folders(grid: Path) -> list[Path]:
    return sorted((p for p in grid.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def read_grid(grid: Path, upto: int | None = None, *, trust_pickles: bool = False) -> list[Run]:
    """Every job of a sweep folder: its run folders, and submitit jobs that left none; with their verdicts.

    ``upto``: every run read up to that many iterations, and complete only if it logged them all.
    ``trust_pickles``: submitit's result files unpickled in full (runs the code they name), not as records.
    """
    submitit = submitit_folders(grid)
    runs = [read_run(folder, submitit, upto, trust_pickles=trust_pickles) for folder in _job_folders(grid)]
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
                    job_error=job_problem(folder, trust_pickles),
                )
            )
    longest = max((r.iterations for r in runs), default=0)
    for run in runs:
        if run.expected is None and run.has_csv:  # no config to say: the grid's longest run sets the bar
            run.expected = longest
        run.problem = run_problem(run)
    return runs


def is_grid(folder: Path) -> bool:
    return bool(submitit_folders(folder)) or any((p / ".hydra").is_dir() for p in _job_folders(folder))


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
