"""Optional behaviour, each a Lightning Callback named in conf/callbacks/."""

from ragen2.callbacks.collapse import CollapseMonitor
from ragen2.callbacks.curves import CurvesPNG, plot_curves, read_metrics
from ragen2.callbacks.diagnostics import MIDiagnostics
from ragen2.callbacks.gradients import GradientBuckets
from ragen2.callbacks.rollouts import RolloutTable, render_episode
from ragen2.callbacks.summary import IterationSummary
from ragen2.lifecycle.checkpoint import LastCheckpoint

__all__ = [
    "CollapseMonitor",
    "CurvesPNG",
    "GradientBuckets",
    "IterationSummary",
    "LastCheckpoint",
    "MIDiagnostics",
    "RolloutTable",
    "plot_curves",
    "read_metrics",
    "render_episode",
]
