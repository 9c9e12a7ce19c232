"""The SNR filter as a config object: each score type ranks groups by its own per-rollout quantity."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch
from helpers import episode, turn

from ragen2 import plugins
from ragen2.algos import filters
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
    assert dataclasses.replace(batch, keep=keep).kept_rows.tolist() == [2, 3]  # group 1's rollouts


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
    for bad in (0.0, -0.2):
        with pytest.raises(ConfigError, match=rf"^filter.value={bad}: top_p .*> 0 .*Fix: filter.value=0.9$"):
            GroupFilter(value=bad)
    with pytest.warns(UserWarning, match="depends on the scale"):
        GroupFilter(mode="softmax")
    torch.testing.assert_close(GroupFilter(value=1.0)(_batch(**BATCH))[0], torch.tensor([True, False, False]))


def test_top_p_at_or_above_one_keeps_every_candidate() -> None:
    # one place decides (the strategy): value ≥ 1 is the reference's "keep every candidate", not an error
    batch = _batch([[1.0, 1.0], [0.0, 2.0], [0.0, 0.2]], [[1, 1]] * 3, [[0.0, 0.0]] * 3)
    for value in (1.0, 1.5):
        assert GroupFilter(value=value)(batch)[0].tolist() == [
            False,
            True,
            True,
        ]  # the zero-score group drops


def _sokoban_like() -> object:
    """Three groups of four rollouts with Sokoban's shaped returns (−0.1 a move, ±1 a box on or off a target,
    +10 solved) and their outcomes: group 0 never solves but pushes boxes about, group 1 solves half the
    time, group 2 always solves."""
    returns = [[-0.5, 0.6, -1.2, 0.3], [10.4, -0.8, 10.2, -0.5], [10.3, 10.5, 10.1, 10.6]]
    solved = [[False] * 4, [True, False, True, False], [True] * 4]
    episodes = [
        dataclasses.replace(episode(g, [turn([1, 2], [3], reward=r)], sample=k), success=ok)
        for g, (rs, oks) in enumerate(zip(returns, solved))
        for k, (r, ok) in enumerate(zip(rs, oks))
    ]
    return collate_episodes(episodes, num_groups=3, pad_id=0)


def test_success_std_drops_an_all_fail_group_that_reward_std_keeps() -> None:
    batch = _sokoban_like()
    keep, scores, _ = GroupFilter(score="reward_std", value=1.0)(batch)
    assert scores[0] > 0.5 and keep.tolist() == [True, True, True]  # the failures' shaped returns vary
    keep, scores, stats = GroupFilter(score="success_std", value=1.0)(batch)
    assert scores.tolist() == pytest.approx([0.0, (1 / 3) ** 0.5, 0.0])  # std of [1, 0, 1, 0], Bessel
    assert keep.tolist() == [False, True, False] and stats["zero_score"] == 2
    # the default top_p 0.9 as well: by returns the all-fail group holds score enough to be kept
    assert GroupFilter(score="reward_std")(batch)[0][0]
    assert not GroupFilter(score="success_std")(batch)[0][0]


def test_monitor_reports_the_selection_and_keeps_every_group() -> None:
    batch = _batch([[1.0, 1.0], [0.0, 2.0], [0.0, 0.2]], [[1, 1]] * 3, [[0.0, 0.0]] * 3)
    keep, scores, stats = GroupFilter()(batch)
    watched, watched_scores, watched_stats = GroupFilter(monitor=True)(batch)
    assert keep.tolist() == [False, True, False] and watched.tolist() == [True, True, True]
    assert torch.equal(scores, watched_scores)
    assert watched_stats == stats and watched_stats["kept"] == 1  # filter/* describe what would be kept


@pytest.fixture
def registered() -> Iterator[None]:
    """What the test registers is removed after it."""
    tables = (plugins.STRATEGIES, plugins.SCORES)
    before = [set(table) for table in tables]
    yield
    for table, names in zip(tables, before):
        for name in set(table) - names:
            del table[name]


def test_a_new_strategy_and_score_are_one_function_each(registered: None) -> None:
    @plugins.strategy("lowest")
    def lowest(c: filters.Candidates, value: float) -> torch.Tensor:
        if value != 1:
            raise ValueError(f"filter.value={value}: lowest keeps one group. Fix: filter.value=1")
        return c.mask(c.order[-1:])

    @plugins.score("return_range", reads=lambda batch: batch.returns)
    def return_range(values: torch.Tensor) -> torch.Tensor:
        return values.amax(dim=1) - values.amin(dim=1)

    batch = _batch([[1.0, 1.0], [0.0, 2.0], [0.0, 0.2]], [[1, 1]] * 3, [[0.0, 0.0]] * 3)
    keep, scores, _ = GroupFilter(score="return_range", strategy="lowest", value=1)(batch)
    assert scores.tolist() == pytest.approx([0.0, 2.0, 0.2]) and keep.tolist() == [False, False, True]
    with pytest.raises(ConfigError, match=r"^filter.value=2: lowest keeps one group"):
        GroupFilter(strategy="lowest", value=2)
    with pytest.raises(ValueError, match=r"^filter.strategy='lowest' is registered twice"):
        plugins.strategy("lowest")(filters.select_groups)
