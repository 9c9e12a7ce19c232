"""What a resumed run needs besides weights, optimizer and callbacks: the checkpoint's ``ragen2`` entry.

``RunState`` holds the empty-batch and non-finite-step streaks and the KL-in-reward coefficient, and
captures the RNG states (torch, numpy, python) of every data-parallel rank when saved (``rng`` is rank
0's, ``rng_by_rank`` all of them); each rank restores its own, and a run resumed on another number of
ranks restores rank 0's everywhere. Everything in it is a plain tensor, number or tuple: Lightning
loads checkpoints with ``torch.load(weights_only=True)``.

Layouts: a checkpoint written before ``layout`` existed (layout 1) kept the MI metric's EMA in the
module's state dict (``mi_first_turn._extra_state``); since layout 2 it is the ``MIDiagnostics``
callback's state. ``migrate`` rewrites a layout-1 checkpoint in place, as it loads.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ragen2.algos.kl import AdaptiveKLController, FixedKLController
from ragen2.distributed import ONE_PROCESS, Ranks

KEY = "ragen2"
LAYOUT = 2
_LEGACY_MI = "mi_first_turn._extra_state"
_MI_CALLBACK = "MIDiagnostics"  # the callback's Lightning state key (its class name)


def rng_state() -> dict[str, Any]:
    """The process's torch, numpy and python RNG states, in weights-only-loadable types."""
    state = np.random.get_state(legacy=True)
    assert isinstance(state, tuple)  # legacy=True: the MT19937 tuple, not the bit generator's dict
    kind, keys, pos, has_gauss, gauss = state
    return {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "python": random.getstate(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(state["python"])


@dataclass
class RunState:
    """The counters and coefficients an iteration changes, saved and restored with the checkpoint."""

    empty_streak: int = 0  # consecutive iterations whose filter kept no group
    nonfinite_streak: int = 0  # consecutive optimizer steps skipped for a non-finite loss or gradient
    kl_controller: FixedKLController | AdaptiveKLController | None = None  # KL in the reward's β

    def state_dict(self, ranks: Ranks = ONE_PROCESS) -> dict[str, Any]:
        """Every rank calls this (a collective when there are several)."""
        rngs = ranks.gather(rng_state())
        return {
            "layout": LAYOUT,
            "empty_streak": self.empty_streak,
            "nonfinite_streak": self.nonfinite_streak,
            "kl_reward_coef": None if self.kl_controller is None else self.kl_controller.value,
            "rng": rngs[0],
            "rng_by_rank": rngs,
        }

    def load_state_dict(self, state: dict[str, Any], ranks: Ranks = ONE_PROCESS) -> None:
        self.empty_streak = int(state.get("empty_streak", 0))
        self.nonfinite_streak = int(state.get("nonfinite_streak", 0))
        if self.kl_controller is not None and state.get("kl_reward_coef") is not None:
            self.kl_controller.value = float(state["kl_reward_coef"])
        by_rank = state.get("rng_by_rank") or []
        rng = by_rank[ranks.rank] if len(by_rank) == ranks.world else state.get("rng")
        if rng is not None:
            set_rng_state(rng)


def migrate(checkpoint: dict[str, Any]) -> list[str]:
    """Bring a checkpoint of an older layout to ``LAYOUT``, in place; returns what moved."""
    state = checkpoint.setdefault(KEY, {})
    moved = []
    if state.get("layout", 1) < 2:
        weights = checkpoint.get("state_dict", {})
        if _LEGACY_MI in weights:
            checkpoint.setdefault("callbacks", {})[_MI_CALLBACK] = {"first_turn": weights.pop(_LEGACY_MI)}
            moved.append(f"state_dict[{_LEGACY_MI!r}] -> callbacks[{_MI_CALLBACK!r}]['first_turn']")
        state["layout"] = 2
    return moved
