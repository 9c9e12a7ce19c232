"""A package outside ragen2 that brings a filter strategy and score, a loss aggregation and an advantage
estimator: the tests install it into a temporary folder, its ``ragen2.plugins`` entry point naming this module
(``test_outside.install_plugins``), and train with them as a user's package would."""

from __future__ import annotations

from collections import Counter

import torch

from ragen2 import plugins
from ragen2.algos.filters import Candidates

#: how often ragen2 called each entry (the tests read it)
CALLS: Counter[str] = Counter()


@plugins.score("return_range", reads=lambda batch: batch.returns)
def return_range(values: torch.Tensor) -> torch.Tensor:
    """[G, K] -> [G]: the spread of each group's returns, best minus worst."""
    CALLS["return_range"] += 1
    return values.amax(dim=1) - values.amin(dim=1)


@plugins.strategy("bottom_k")
def bottom_k(c: Candidates, value: float) -> torch.Tensor:
    """The ``value`` candidates of the lowest scores (a control: the least informative groups)."""
    if value < 1 or value != int(value):
        raise ValueError(
            f"filter.value={value}: bottom_k keeps this many groups, a whole number ≥ 1. Fix: filter.value=2"
        )
    CALLS["bottom_k"] += 1
    return c.mask(c.order[max(c.order.numel() - int(value), 0) :])


@plugins.loss_aggregation("seq-mean-token-sqrt", token_level=False)
def seq_mean_token_sqrt(loss: torch.Tensor, mask: torch.Tensor, norm: float | None) -> torch.Tensor:
    """The mean over sequences of each one's token sum over the square root of its token count."""
    CALLS["seq-mean-token-sqrt"] += 1
    counts = mask.sum(-1)  # [B]
    per_seq = (loss * mask).sum(-1) / counts.clamp(min=1).sqrt()  # [B]
    return (per_seq * (counts > 0)).sum() / (counts > 0).sum().clamp(min=1)


def median_baseline(returns: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """[B] returns and groups -> [B] advantages: each return minus its group's median (``OutcomeAdvantage``'s
    ``fn``, by ``_target_`` in conf/algo/advantage/median.yaml)."""
    CALLS["median_baseline"] += 1
    groups, which = group_index.unique(return_inverse=True)  # the kept groups' ids need not be 0…G-1
    medians = torch.stack([returns[which == i].median() for i in range(groups.numel())])
    return returns - medians[which]
