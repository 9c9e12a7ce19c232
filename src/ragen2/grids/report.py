"""One grid end to end, ``ragen2-aggregate``'s library: read its runs, aggregate its cells, write OUTPUTS,
and the summary printed of it; every grid at or below a folder."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ragen2.grids.plots import plot_curves, plot_metrics
from ragen2.grids.runs import AggregateError, Run, find_grids, read_grid
from ragen2.grids.table import Cell, aggregate, cell_keys, failed_lines, markdown, trajectories, write_csv

OUTPUTS = (
    "aggregate.csv",
    "aggregate.md",
    "aggregate_metrics.png",
    "aggregate_curves.png",
    "aggregate_trajectories.md",
)


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
    *,
    trust_pickles: bool = False,
) -> Report:
    """Read one sweep folder (up to ``upto`` iterations per run), aggregate it, write OUTPUTS into ``out``
    (default: the sweep folder); the trajectories show every ``every``-th iteration; ``trust_pickles``:
    submitit's result files unpickled in full (runs the code they name) rather than read as records."""
    runs = read_grid(grid, upto, trust_pickles=trust_pickles)
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
    *,
    trust_pickles: bool = False,
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
        reports.append(aggregate_grid(grid, target, keys, upto, every, trust_pickles=trust_pickles))
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
