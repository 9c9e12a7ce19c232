"""``Findings``: what the diagnostic callbacks found, as objects, held by the LightningModule.

Each callback writes its own field: ``MIDiagnostics`` the ``MIPass`` and ``GradientBuckets`` the
``GradientPass``, both before the update; ``CollapseMonitor`` the ``RegimeReading``, after it. The module
puts ``before_update(iteration)`` in its ``Iteration`` (``ragen2.modules.record``) with its own numbers; the
collapse monitor reads ``mi`` and the summary line ``regime``. Nothing is parsed back from logged names.

The store is on the module because the module is the one object every callback is handed in every hook:
callbacks that Hydra builds one by one need no wiring between them, and Lightning's hook order (batch
start, training step, batch end, epoch end), not the order of ``trainer.callbacks``, orders writers and
readers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ragen2.diagnostics.gradients import GradientPass
from ragen2.diagnostics.mi_pass import MIPass
from ragen2.diagnostics.regimes import RegimeReading


@dataclass
class Findings:
    """The latest result of each diagnostic; each knows its iteration."""

    mi: MIPass | None = None
    gradients: GradientPass | None = None
    regime: RegimeReading | None = None  # the latest reading in this process (none before the first pass)

    def before_update(self, iteration: int) -> tuple[MIPass | None, GradientPass | None]:
        """``iteration``'s MI and gradient passes, which ran before its update (None where none did)."""
        mi, gradients = self.mi, self.gradients
        return (
            mi if mi is not None and mi.iteration == iteration else None,
            gradients if gradients is not None and gradients.iteration == iteration else None,
        )


class HoldsFindings(Protocol):
    """What the diagnostic callbacks need of the module: the store they write and read."""

    findings: Findings


def held_findings(module: Any) -> Findings | None:
    """``module.findings`` (``HoldsFindings``), or None for a module without one (read through getattr,
    as ``ragen2.data.contracts.held_policy`` explains)."""
    found = getattr(module, "findings", None)
    return found if isinstance(found, Findings) else None
