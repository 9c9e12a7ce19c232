"""``Iteration``: one iteration as the module logs it, typed. The rollouts' record (``IterationRecord``), the
diagnostic passes that ran before the update (``MIPass``, ``GradientPass``), what the update did
(``UpdateStats``, or the filter's empty streak when it kept nothing) and its time and tokens. ``as_metrics`` is the row
the module writes; the summary line and a notebook read the fields (``PolicyModule.last``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ragen2.data.record import IterationRecord
from ragen2.diagnostics.gradients import GradientPass
from ragen2.diagnostics.mi_pass import MIPass
from ragen2.modules.update import UpdateStats
from ragen2.perf import PhasePerf


@dataclass(frozen=True)
class Iteration:
    """What one iteration did, before the callbacks that run after its update (the regime reading is the
    collapse monitor's, ``Findings.regime``)."""

    index: int
    rollouts: IterationRecord = field(default_factory=IterationRecord)
    mi: MIPass | None = None  # the MI pass of this iteration (before its update), if one ran
    gradients: GradientPass | None = None  # the gradient pass of this iteration, if one ran
    update: UpdateStats | None = None  # None: the filter kept no group, no update
    empty_streak: int = 0  # iterations in a row, this one included, whose filter kept no group
    perf: PhasePerf | None = None  # the update's time and tokens (None when there was none)

    @property
    def update_s(self) -> float | None:
        return None if self.perf is None else self.perf.seconds

    def as_metrics(self) -> dict[str, float]:
        """The iteration's row: rollout/*, filter/*, diag/*, train/*, time/* and perf/*; a value that is not
        finite is left out."""
        out = self.rollouts.as_metrics()
        for found in (self.mi, self.gradients):
            out.update({} if found is None else found.as_metrics())
        out["train/iteration"] = float(self.index)
        if self.update is None:
            out |= {"filter/skipped": 1.0, "filter/empty_streak": float(self.empty_streak)}
        else:
            out["filter/skipped"] = 0.0
            out |= self.update.as_metrics()
        out.update({} if self.perf is None else self.perf.as_metrics("update"))
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}


def last_iteration(module: Any) -> Iteration | None:
    """``module.last`` (``PolicyModule``), or None for a module without one or before its first iteration
    (read through getattr, as ``ragen2.data.contracts.held_policy`` explains)."""
    found = getattr(module, "last", None)
    return found if isinstance(found, Iteration) else None
