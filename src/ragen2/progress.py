"""Progress bars for an iteration's long phases: rollout (by turn, with episodes done), sampling (by token),
the update (by mini-batch), the MI pass (by prompt column) and validation.

They show only in an interactive terminal (stderr is a TTY) and disappear when the phase ends, leaving the
one summary line per iteration; under SLURM, with output redirected, or in the test suite they are off.
``RAGEN2_PROGRESS=1`` forces them on, ``=0`` off.
"""

from __future__ import annotations

import os
import sys

from tqdm import tqdm


def enabled() -> bool:
    forced = os.environ.get("RAGEN2_PROGRESS")
    if forced is not None:
        return forced == "1"
    return sys.stderr.isatty()


def bar(total: int, desc: str, unit: str) -> tqdm:
    """A transient bar on stderr (a no-op object when bars are off)."""
    return tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True, disable=not enabled())
