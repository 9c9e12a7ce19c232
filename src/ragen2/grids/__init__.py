"""Grids of runs (a Hydra multirun folder) read back as tables: ``ragen2-aggregate``'s library.

``runs``: each job's folder read back, and whether it is complete; ``forensics``: why a submitit job failed
(its log, its result file read without running code); ``stats``: mean and 95 % interval; ``table``: cells,
CSV and Markdown; ``plots``: the figures; ``report``: one grid end to end, and the summary printed.
"""

from ragen2.grids.report import OUTPUTS, Report, aggregate_folder, aggregate_grid, summary
from ragen2.grids.runs import AggregateError, Run, find_grids, read_grid, read_series
from ragen2.grids.stats import Interval, ci95, t_quantile
from ragen2.grids.table import METRICS, Cell, Metric, aggregate, cell_keys

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
    "read_series",
    "summary",
    "t_quantile",
]
