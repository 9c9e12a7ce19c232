"""Mini-batches, token-budget micro-batches and their loss weights."""

from __future__ import annotations

import pytest
import torch

from ragen2.algos.batching import micro_batch_share, micro_batches, minibatch_order


def test_micro_batches_respect_the_token_budget() -> None:
    # budget 10 padded tokens: [4, 4] → 2×4 = 8 fits, +5 → 3×5 = 15 does not; [5, 2] → 10 fits; [9] alone
    assert micro_batches([4, 4, 5, 2, 9], 10) == [[0, 1], [2, 3], [4]]
    # a row longer than the budget still gets its own micro-batch rather than being dropped
    assert micro_batches([12, 1], 10) == [[0], [1]]


def test_minibatch_order_is_a_seeded_permutation_per_epoch() -> None:
    order = minibatch_order(10, 4, epochs=2, seed=7)
    assert [[len(m) for m in epoch] for epoch in order] == [[4, 4, 2], [4, 4, 2]]
    for epoch in order:
        assert sorted(torch.cat(epoch).tolist()) == list(range(10))
    assert not torch.equal(torch.cat(order[0]), torch.cat(order[1]))  # each epoch reshuffles
    again = minibatch_order(10, 4, epochs=2, seed=7)
    assert all(torch.equal(a, b) for ea, eb in zip(order, again) for a, b in zip(ea, eb))


def test_micro_batch_share_by_tokens_or_by_rows() -> None:
    # rows with 3, 1, 0 and 2 sampled tokens; the mini-batch is rows 0..3 (6 tokens, 3 non-empty rows)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]], dtype=torch.float32)
    mini = torch.tensor([0, 1, 2, 3])
    assert micro_batch_share(mask, torch.tensor([0, 2]), mini, token_level=True) == pytest.approx(3 / 6)
    assert micro_batch_share(mask, torch.tensor([0, 2]), mini, token_level=False) == pytest.approx(1 / 3)
    # shares over a partition of the mini-batch sum to 1 both ways
    parts = [torch.tensor([0]), torch.tensor([1, 2]), torch.tensor([3])]
    for token_level in (True, False):
        assert sum(micro_batch_share(mask, p, mini, token_level) for p in parts) == pytest.approx(1.0)


def test_mini_batches_of_whole_groups_shuffle_the_groups_and_keep_their_rows_together() -> None:
    # 12 rows in groups of 4 (rows 0-3, 4-7, 8-11), mini-batches of 8: each holds two whole groups or the rest
    for seed in range(5):
        (epoch,) = minibatch_order(12, 8, epochs=1, seed=seed, block=4)
        rows = torch.cat(epoch).tolist()
        assert sorted(rows) == list(range(12)) and [len(m) for m in epoch] == [8, 4]
        assert all(rows[i : i + 4] == list(range(rows[i], rows[i] + 4)) for i in (0, 4, 8))
    orders = {tuple(torch.cat(minibatch_order(12, 8, 1, seed, block=4)[0]).tolist()) for seed in range(10)}
    assert len(orders) > 1  # the groups' order is drawn
