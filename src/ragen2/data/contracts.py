"""What the layers above the data layer promise it: the attributes the DataModule and the callbacks read
of the LightningModule. Structural types: a module satisfies them by having the attributes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class HoldsPolicy(Protocol):
    """What the DataModule needs of the module: the causal LM to sample from (synced every iteration)
    and that callbacks score with."""

    policy: Any


@runtime_checkable
class ReportsMetrics(Protocol):
    """What callbacks read after each iteration: every metric the iteration logged (``rollout/``,
    ``filter/``, ``diag/``, ``train/``, ``time/``), as plain floats."""

    last_metrics: Mapping[str, float]
