"""How one iteration's kept rows become optimizer steps: mini-batches, token-budget micro-batches, weights.

The mini-batch size is fixed in episodes, so fewer kept groups mean fewer optimizer steps (as in the
reference). A mini-batch is split into micro-batches under a padded-token budget and its loss is the
sum of the micro-batches' losses weighted by ``micro_batch_share``, which makes the gradient equal to
the whole mini-batch's in one forward for every aggregation mode (tested to 1e-4).
"""

from __future__ import annotations

import torch

__all__ = ["local_rows", "micro_batch_share", "micro_batches", "minibatch_order", "row_weights"]


def minibatch_order(n: int, size: int, epochs: int, seed: int, block: int = 1) -> list[list[torch.Tensor]]:
    """Per epoch, a seeded shuffle of rows 0..n−1 split into mini-batches of ``size`` (the last may be short).

    ``block`` > 1 shuffles runs of ``block`` consecutive rows (a group's rollouts, ``algo.minibatch=groups``)
    instead of rows, so a mini-batch holds whole groups and a group's prompt runs once in its forward."""
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.arange(n).split(block)
    return [
        list(torch.cat([blocks[int(i)] for i in torch.randperm(len(blocks), generator=gen)]).split(size))
        for _ in range(epochs)
    ]


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


def row_weights(loss_mask: torch.Tensor, token_level: bool) -> torch.Tensor:
    """[B] each row's weight in a mini-batch's loss: its loss tokens (a token-level mean) or 1 per
    non-empty row (sequence-level means)."""
    counts = loss_mask.sum(-1)
    return counts if token_level else (counts > 0).to(loss_mask.dtype)


def micro_batch_share(
    loss_mask: torch.Tensor,  # [B, T]
    rows: torch.Tensor,  # [b] the micro-batch's rows
    minibatch: torch.Tensor,  # [m] its mini-batch's rows
    token_level: bool,
) -> float:
    """The micro-batch's weight in its mini-batch's loss: its share of the ``row_weights``."""
    weights = row_weights(loss_mask, token_level)
    return float(weights[rows].sum()) / max(float(weights[minibatch].sum()), 1.0)


def local_rows(minibatch: torch.Tensor, first: int, count: int) -> torch.Tensor:
    """The rows of a mini-batch of global row ids that this rank holds (global ids first … first +
    count − 1, ranks in order), as local ids, in the mini-batch's order."""
    mine = (minibatch >= first) & (minibatch < first + count)
    return minibatch[mine] - first
