"""The SNR filter as a config object: score each group, select, report (METHOD.md §4)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from ragen2.algos.filters import SCORE_KINDS, filter_stats, group_scores, select_groups


@dataclass(frozen=True)
class GroupFilter:
    """Keeps the groups with the most signal; ``strategy="none"`` keeps every group (the no-filter baseline)."""

    score: str = "reward_std"
    strategy: str = "top_p"
    value: float = 0.9
    mode: str = "linear"
    include_zero: bool = False
    eps: float = 0.01
    largest: bool = True
    loss_scaling: str = "none"  # none | linear | sqrt in the kept ratio
    max_empty_iterations: int = 10  # stop after this many consecutive empty batches; 0 = never stop

    def __post_init__(self) -> None:
        if self.score not in SCORE_KINDS:
            raise ValueError(f"filter.score={self.score!r} is unknown; choose one of {SCORE_KINDS}")
        if self.max_empty_iterations < 0:
            raise ValueError(
                f"filter.max_empty_iterations={self.max_empty_iterations} must be ≥ 0 (0 disables)"
            )
        # validates strategy/value/mode/eps once, at construction (and warns once for softmax mode)
        select_groups(torch.ones(2), self.strategy, self.value, mode=self.mode, eps=self.eps)

    def __call__(self, per_group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """[G, K] per-rollout values -> (keep [G], scores [G], filter/* stats)."""
        scores = group_scores(per_group, self.score)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # already warned at construction
            keep = select_groups(
                scores,
                self.strategy,
                self.value,
                mode=self.mode,
                include_zero=self.include_zero,
                eps=self.eps,
                largest=self.largest,
            )
        return keep, scores, filter_stats(scores, keep)
