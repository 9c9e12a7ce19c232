"""One grid end to end, ``ragen2-aggregate``'s library: read its runs, aggregate its cells, pair its arms, write
OUTPUTS, and the summary printed of it; every grid at or below a folder."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ragen2.grids import buckets, gain, mi
from ragen2.grids.pairs import Arms, Comparison, compare, comparison_markdown, find_arms
from ragen2.grids.pairs import write_csv as write_paired_csv
from ragen2.grids.plots import plot_curves, plot_metrics, plot_mi_steps
from ragen2.grids.runs import AggregateError, Run, find_grids, read_grid
from ragen2.grids.table import (
    Cell,
    aggregate,
    cell_keys,
    failed_lines,
    fmt,
    label,
    markdown,
    skipped_lines,
    trajectories,
    write_csv,
)

OUTPUTS = (
    "aggregate.csv",
    "aggregate.md",
    "aggregate_metrics.png",
    "aggregate_curves.png",
    "aggregate_trajectories.md",
    "aggregate_mi_curves.csv",
    "aggregate_gradients.csv",
    "aggregate_gradients.png",
    "aggregate_mi_steps.png",
    "aggregate_paired.md",
    "aggregate_paired.csv",
)


@dataclass
class Report:
    grid: Path
    keys: list[str]
    cells: list[Cell]
    runs: list[Run]
    files: list[Path]
    markdown: str
    arms: Arms | None = None  # the paired arms (None: the grid has none)
    comparisons: list[Comparison] = field(default_factory=list)


def paired_markdown(
    grid: Path, comparisons: Sequence[Comparison], arms: Arms | None, keys: Sequence[str]
) -> str:
    """aggregate_paired.md: each comparison's paired differences and MI at matched steps, then the Spearman
    table of the gain's predictors."""
    lines = [f"# ragen2-aggregate: `{grid}`, paired seeds", ""]
    if arms is None:
        lines.append(
            "No pairs: the grid has no `filter=top_p` and `filter=none` runs. `--pair KEY=A,B` names two arms "
            "(runs whose override KEY is A, and B)."
        )
        return "\n".join([*lines, ""])
    others = [k for k in keys if k != arms.key]
    lines += [
        f"Arms `{arms.key}={arms.a}` and `{arms.key}={arms.b}`. A pair: one complete run of each whose "
        f"overrides are equal but `{arms.key}` (the same seed, every other setting alike); runs without "
        "exactly one such partner are listed as unpaired and left out. Each difference is "
        f"{arms.a} − {arms.b} per pair; the entry is its mean ± half-width of the two-sided 95 % Student t "
        "interval over the pairs (d̄ ± t₀.₉₇₅,ₙ₋₁ · s_d/√n); `> 0 / < 0` counts the pairs on each side; "
        "`(+k non-finite)`: pairs with a NaN or ±inf value, never averaged. The arms' columns are their means "
        "over the same pairs.",
    ]
    for comparison in comparisons:
        lines += ["", *comparison_markdown(comparison, arms, others)]
    lines += ["", *gain.markdown(comparisons, arms, others)]
    return "\n".join([*lines, ""])


def aggregate_grid(
    grid: Path,
    out: Path | None = None,
    keys: Sequence[str] | None = None,
    upto: int | None = None,
    every: int = 1,
    *,
    trust_pickles: bool = False,
    pair: str | None = None,
    steps: Sequence[float] | None = None,
) -> Report:
    """Read one sweep folder (up to ``upto`` iterations per run), aggregate it, write OUTPUTS into ``out``
    (default: the sweep folder); the trajectories show every ``every``-th iteration; ``trust_pickles``:
    submitit's result files unpickled in full (runs the code they name) rather than read as records;
    ``pair``: the arms ``KEY=A,B`` (default ``filter=top_p,none`` where the grid has both); ``steps``: the
    optimizer step counts MI is matched at (default: 6 from 0 to the furthest a pair of the comparison
    reaches)."""
    runs = read_grid(grid, upto, trust_pickles=trust_pickles)
    keys = cell_keys([r.overrides for r in runs if r.overrides is not None], keys)
    arms = find_arms(runs, pair)
    cells = aggregate(runs, keys)
    comparisons = [] if arms is None else compare(runs, keys, arms, steps)
    others = [k for k in keys if arms is None or k != arms.key]
    out = grid if out is None else out
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in OUTPUTS}
    text = "\n".join(
        [
            markdown(grid, cells, runs, keys, upto),
            *mi.markdown(cells, keys),
            "",
            *buckets.markdown(cells, keys),
            "",
        ]
    )
    paths["aggregate.md"].write_text(text)
    paths["aggregate_trajectories.md"].write_text(
        trajectories(grid, cells, keys, every, lambda c: mi.by_iteration(c.runs))
    )
    paths["aggregate_paired.md"].write_text(paired_markdown(grid, comparisons, arms, keys))
    write_csv(cells, keys, paths["aggregate.csv"])
    mi.write_csv(cells, keys, paths["aggregate_mi_curves.csv"])
    buckets.write_csv(cells, keys, paths["aggregate_gradients.csv"])
    write_paired_csv(comparisons, others, arms, paths["aggregate_paired.csv"])
    plot_metrics(cells, keys, paths["aggregate_metrics.png"])
    plot_curves(cells, keys, paths["aggregate_curves.png"])
    buckets.plot(cells, keys, paths["aggregate_gradients.png"])
    plot_mi_steps(cells, keys, paths["aggregate_mi_steps.png"])
    return Report(grid, list(keys), cells, runs, list(paths.values()), text, arms, comparisons)


def writable(folder: Path) -> str | None:
    """Why nothing can be written into ``folder`` (created if missing); None when a file can be."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as err:
        return err.strerror or type(err).__name__


def aggregate_folder(
    path: Path,
    out: Path | None = None,
    keys: Sequence[str] | None = None,
    upto: int | None = None,
    every: int = 1,
    *,
    trust_pickles: bool = False,
    pair: str | None = None,
    steps: Sequence[float] | None = None,
) -> list[Report]:
    """Every grid at or below ``path``, each on its own (several grids with ``out``: one subfolder each).
    Every destination is checked writable before any grid is read."""
    if out is not None and (why := writable(out)):
        raise AggregateError(f"--out {out}: cannot write there ({why}). Fix: --out a folder you can write")
    grids = find_grids(path)
    if not grids:
        raise AggregateError(
            f"{path}: no runs found (no job folder 0/, 1/, … with .hydra/, no .submitit/ jobs, here or up to "
            "3 levels below). Fix: pass the sweep folder a `ragen2-train --multirun` printed "
            "(multirun/<date>/<time>), or a folder above it"
        )
    targets = [
        grid if out is None else out if grid == path else out / grid.relative_to(path) for grid in grids
    ]
    for grid, target in zip(grids, targets):
        if why := writable(target):
            where = f"--out {out}" if out is not None else f"{grid} (the tables go into the sweep folder)"
            raise AggregateError(f"{where}: cannot write {target} ({why}). Fix: --out a folder you can write")
    return [
        aggregate_grid(grid, target, keys, upto, every, trust_pickles=trust_pickles, pair=pair, steps=steps)
        for grid, target in zip(grids, targets)
    ]


def summary(report: Report) -> str:
    failed = failed_lines(report.runs, report.keys)
    complete = sum(len(c.runs) for c in report.cells)
    table = [line for line in report.markdown.splitlines() if line.startswith("|")]
    first = table[: len(report.cells) + 2]  # the results table (the failed table follows it)
    lines = [
        f"grid {report.grid}: {complete} complete runs in {len(report.cells)} cells; "
        f"{len(failed)} failed or incomplete" + (":" if failed else ""),
        *(f"  {job} ({settings}): {why}" for job, settings, why in failed),
        *(f"  {line}, left out" for line in skipped_lines(report.runs)),
        *first,
    ]
    if report.arms is not None:
        arms = report.arms
        others = [k for k in report.keys if k != arms.key]
        for c in report.comparisons:
            success = c.metrics["final_success"]
            lines.append(
                f"paired {arms.key}={arms.a} − {arms.b}, {label(others, c.values)}: {len(c.pairs)} pairs, "
                f"{len(c.unpaired)} unpaired; final_success {fmt(success.interval)} ({success.key or 'not logged'})"
            )
    lines.append(f"wrote {', '.join(str(p) for p in report.files)}")
    return "\n".join(lines)
