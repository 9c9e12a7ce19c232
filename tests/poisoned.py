"""A policy objective that turns non-finite on chosen calls: the NaN guard's test input, composed like any
objective (``algo.policy_loss._target_=poisoned.PoisonedLoss``, ``+algo.policy_loss.calls=[0]``).

``kind=gradient`` multiplies the loss by NaN (its gradient is NaN too, so is every rank's after DDP's
all-reduce); ``kind=loss`` adds a NaN constant (the loss is NaN, the gradient untouched: only the
finiteness flag can tell the other ranks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ragen2.distributed import Ranks
from ragen2.modules.objectives import LossOut, TokenRatioLoss

KINDS = ("gradient", "loss")


class PoisonedLoss(TokenRatioLoss):
    """``fn``'s loss, non-finite on the ``calls``-th calls (counted from 0) on rank ``rank``."""

    def __init__(
        self, fn: Callable[..., LossOut], calls: Sequence[int], rank: int = 0, kind: str = "gradient"
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"algo.policy_loss.kind={kind!r}: choose one of {KINDS}")
        self.calls, self.rank, self.kind = set(calls), rank, kind
        self.made = 0
        super().__init__(fn)
        self.made = 0  # the construction's check call is not counted

    def __call__(self, *tensors: torch.Tensor) -> LossOut:
        """``PolicyObjective``'s (logp, old_logp, advantages, mask, turn_index)."""
        loss, stats = super().__call__(*tensors)
        call, self.made = self.made, self.made + 1
        if call in self.calls and Ranks.current().rank == self.rank:
            nan = torch.tensor(float("nan"))
            loss = loss * nan if self.kind == "gradient" else loss + nan
        return loss, stats
