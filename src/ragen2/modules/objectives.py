"""Policy objectives as config objects (``algo.policy_loss``), and the loss terms of one micro-batch.

The module calls ``policy_loss(logp, old_logp, advantages, mask, turn_index)`` on every micro-batch;
these adapters hand the pure functions of ``ragen2.algos.losses`` what each needs: a token-level ratio
ignores the turn structure, GSPO's sequence-level ratio is taken per turn. Each adapter runs its
function once on a one-token batch at construction, so a bad keyword (a clip range, an aggregation
mode) fails when the config is instantiated, naming ``algo.policy_loss.fn``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ragen2.errors import ConfigError

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
        one = torch.ones(1, 1)
        try:
            self(torch.zeros(1, 1), torch.zeros(1, 1), one, one, one.long())
        except (TypeError, ValueError) as err:
            raise ConfigError(f"algo.policy_loss.fn: {err}") from err

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


@dataclass
class LossTerms:
    """One micro-batch's loss, term by term, as the optimizer sees them (coefficients applied).

    Each term is a scalar with its own graph, so a diagnostic can back-propagate one alone; a term the
    configuration does not have (no critic, no KL in the loss, the policy's terms during a critic
    warm-up) is None and is neither summed nor logged.
    """

    policy: torch.Tensor | None = None  # the task term: the policy objective (train/pg_loss)
    entropy: torch.Tensor | None = None  # −entropy_coef · entropy (train/entropy_loss)
    kl: torch.Tensor | None = None  # kl_coef · KL to the reference (train/kl_loss)
    value: torch.Tensor | None = None  # vf_coef · clipped value loss (train/value_loss)
    stats: dict[str, float] = field(default_factory=dict)  # detached numbers: entropy, kl, clip fractions, …

    def _present(self) -> dict[str, torch.Tensor]:
        # the order of the sum is fixed: value, policy, entropy, KL
        named = {
            "value_loss": self.value,
            "pg_loss": self.policy,
            "entropy_loss": self.entropy,
            "kl_loss": self.kl,
        }
        return {k: v for k, v in named.items() if v is not None}

    @property
    def total(self) -> torch.Tensor:
        """The loss to back-propagate (train/loss)."""
        terms = list(self._present().values())
        if not terms:
            raise ValueError("LossTerms has no term: nothing to back-propagate")
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total

    def logged(self) -> dict[str, float]:
        """The total and each present term (``train/`` suffixes), plus the stats."""
        values = {"loss": self.total, **self._present()}
        return {**{k: float(v.detach()) for k, v in values.items()}, **self.stats}
