"""How one iteration's kept rows become optimizer steps: mini-batches, token-budget micro-batches, weights.

The mini-batch size is fixed in episodes, so fewer kept groups mean fewer optimizer steps (as in the
reference). A mini-batch is split into micro-batches under a padded-token budget and its loss is the
sum of the micro-batches' losses weighted by ``micro_batch_share``, which makes the gradient equal to
the whole mini-batch's in one forward for every aggregation mode (tested to 1e-4).
"""

from __future__ import annotations

import torch

__all__ = ["micro_batch_share", "micro_batches", "minibatch_order"]


def minibatch_order(n: int, size: int, epochs: int, seed: int) -> list[list[torch.Tensor]]:
    """Per epoch, a seeded shuffle of rows 0..n−1 split into mini-batches of ``size`` (the last may be short)."""
    gen = torch.Generator().manual_seed(seed)
    return [list(torch.randperm(n, generator=gen).split(size)) for _ in range(epochs)]


def micro_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Split rows (in order) into groups whose padded size (rows × longest) fits ``max_tokens``.

    A row longer than the budget gets a micro-batch of its own rather than being dropped.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if current and max(longest, n) * (len(current) + 1) > max_tokens:
            groups.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        groups.append(current)
    return groups


def micro_batch_share(
    loss_mask: torch.Tensor,  # [B, T]
    rows: torch.Tensor,  # [b] the micro-batch's rows
    minibatch: torch.Tensor,  # [m] its mini-batch's rows
    token_level: bool,
) -> float:
    """The micro-batch's weight in its mini-batch's loss: its share of the tokens (a token-level mean)
    or of the non-empty rows (sequence-level means)."""
    if token_level:
        return float(loss_mask[rows].sum()) / max(float(loss_mask[minibatch].sum()), 1.0)
    non_empty = (loss_mask.sum(-1) > 0).float()
    return float(non_empty[rows].sum()) / max(float(non_empty[minibatch].sum()), 1.0)
