"""Policy objectives as config objects (``algo.policy_loss``): one call signature for the modules.

The modules call ``policy_loss(logp, old_logp, advantages, mask, turn_index)`` on every micro-batch;
these adapters hand the pure functions of ``ragen2.algos.losses`` what each needs: a token-level
ratio ignores the turn structure, GSPO's sequence-level ratio is taken per turn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

LossOut = tuple[torch.Tensor, dict[str, torch.Tensor]]


class PolicyObjective(Protocol):
    def __call__(
        self,
        logp: torch.Tensor,  # [b, T]
        old_logp: torch.Tensor,  # [b, T]
        advantages: torch.Tensor,  # [b, T]
        mask: torch.Tensor,  # [b, T]
        turn_index: torch.Tensor,  # [b, T] turn number of sampled tokens, 0 elsewhere
    ) -> LossOut: ...


class TokenRatioLoss:
    """Per-token importance ratios (PPO / GRPO / DAPO): ``fn(logp, old_logp, advantages, mask)``."""

    def __init__(self, fn: Callable[..., LossOut]) -> None:
        self.fn = fn

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        turn_index: torch.Tensor,
    ) -> LossOut:
        return self.fn(logp, old_logp, advantages, mask, **self._segments(turn_index))

    def _segments(self, turn_index: torch.Tensor) -> dict[str, torch.Tensor]:
        return {}  # every token is its own ratio


class TurnRatioLoss(TokenRatioLoss):
    """One sequence-level ratio per turn (GSPO on multi-turn rows): ``fn(..., segment_index=turn_index)``."""

    def _segments(self, turn_index: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"segment_index": turn_index}
