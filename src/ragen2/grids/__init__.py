"""Grids of runs (a Hydra multirun folder) read back as tables: ``ragen2-aggregate``'s library."""

from ragen2.grids.stats import Interval, ci95, t_quantile
from ragen2.grids.table import (
    METRICS,
    OUTPUTS,
    AggregateError,
    Cell,
    Metric,
    Report,
    Run,
    aggregate,
    aggregate_folder,
    aggregate_grid,
    cell_keys,
    find_grids,
    read_grid,
    summary,
)

__all__ = [
    "METRICS",
    "OUTPUTS",
    "AggregateError",
    "Cell",
    "Interval",
    "Metric",
    "Report",
    "Run",
    "aggregate",
    "aggregate_folder",
    "aggregate_grid",
    "cell_keys",
    "ci95",
    "find_grids",
    "read_grid",
    "summary",
    "t_quantile",
]
