"""The SNR filter as a config object: each score type ranks groups by its own per-rollout quantity."""

from __future__ import annotations

import pytest
import torch
from helpers import episode, turn

from ragen2.data.batch import collate_episodes
from ragen2.data.group_filter import GroupFilter
from ragen2.errors import ConfigError


def _batch(returns: list[list[float]], lengths: list[list[int]], entropies: list[list[float]]):
    # one single-turn episode per rollout: its return, its sampled length and a constant per-token entropy
    episodes = [
        episode(g, [turn([1, 2], [3] * n, reward=r, entropies=[h] * n)], sample=k)
        for g, (rs, ns, hs) in enumerate(zip(returns, lengths, entropies))
        for k, (r, n, h) in enumerate(zip(rs, ns, hs))
    ]
    return collate_episodes(episodes, num_groups=len(returns), pad_id=0)


# three groups of two rollouts, built so that every score type has a different winner:
#   returns  [0, 1] [0, 0] [1, 1]  → reward_std: group 0;  reward_mean: group 2
#   lengths  [2, 2] [10, 2] [4, 4] → length (mean 2, 6, 4): group 1
#   entropy  [.1,.1] [1, 3] [2.5, 2.5] → entropy (mean .1, 2, 2.5): group 2; entropy_std (0, √2, 0): group 1
BATCH = dict(
    returns=[[0.0, 1.0], [0.0, 0.0], [1.0, 1.0]],
    lengths=[[2, 2], [10, 2], [4, 4]],
    entropies=[[0.1, 0.1], [1.0, 3.0], [2.5, 2.5]],
)


@pytest.mark.parametrize(
    ("score", "winner", "want_scores"),
    [
        ("reward_std", 0, [2**-0.5, 0.0, 0.0]),
        ("reward_var", 0, [0.5, 0.0, 0.0]),
        ("reward_mean", 2, [0.5, 0.0, 1.0]),
        ("length", 1, [2.0, 6.0, 4.0]),
        ("entropy", 2, [0.1, 2.0, 2.5]),
        ("entropy_std", 1, [0.0, 2**0.5, 0.0]),
    ],
)
def test_each_score_type_ranks_by_its_own_quantity(score: str, winner: int, want_scores: list[float]) -> None:
    keep, scores, stats = GroupFilter(score=score, strategy="top_k_abs", value=1)(_batch(**BATCH))
    assert scores.tolist() == pytest.approx(want_scores, rel=1e-6)
    assert keep.tolist() == [g == winner for g in range(3)]
    assert stats["kept"] == 1


def test_top_p_keeps_high_variance_groups() -> None:
    # returns per group (K = 2): stds (Bessel) = |a − b|/√2 → [0, √2·1, √2·0.1]; sum = 1.1·√2
    # top_p 0.9 linear: target 0.9·1.1√2 − 0.01 = 1.390; sorted cum: √2 = 1.414 ≥ target → keep group 1 only
    batch = _batch([[1.0, 1.0], [0.0, 2.0], [0.0, 0.2]], [[1, 1]] * 3, [[0.0, 0.0]] * 3)
    keep, scores, stats = GroupFilter()(batch)
    assert keep.tolist() == [False, True, False]
    assert scores.tolist() == pytest.approx([0.0, 2**0.5, 0.1 * 2**0.5])
    assert stats["kept"] == 1 and stats["zero_score"] == 1
    keep_all, _, _ = GroupFilter(strategy="none")(batch)
    assert keep_all.tolist() == [True, True, True]
    batch.keep = keep
    assert batch.kept_ratio == pytest.approx(1 / 3)


def test_length_counts_every_sampled_token_and_entropy_needs_records() -> None:
    # two turns of 3 and 2 sampled tokens: length 5, whatever the loss mask later drops
    two_turns = episode(0, [turn([1], [2, 3, 4]), turn([1, 2, 3, 4, 9], [5, 6])])
    batch = collate_episodes([two_turns, episode(0, [turn([1], [2])], sample=1)], num_groups=1, pad_id=0)
    _, scores, _ = GroupFilter(score="length", strategy="none")(batch)
    assert scores.tolist() == [3.0]  # mean of 5 and 1
    with pytest.raises(ValueError, match="entropies"):
        GroupFilter(score="entropy")(batch)  # turns made without entropies


def test_group_filter_validates_at_construction() -> None:
    with pytest.raises(ConfigError, match="filter.score='variance'"):
        GroupFilter(score="variance")
    with pytest.raises(ConfigError, match="filter.strategy"):
        GroupFilter(strategy="top_q")
    for bad in (0.0, 1.5, -0.2):
        with pytest.raises(ConfigError, match=rf"filter.value={bad}.*\(0, 1\]"):
            GroupFilter(value=bad)
    with pytest.warns(UserWarning, match="depends on the scale"):
        GroupFilter(mode="softmax")
    torch.testing.assert_close(GroupFilter(value=1.0)(_batch(**BATCH))[0], torch.tensor([True, False, False]))
