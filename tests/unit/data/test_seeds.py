"""An iteration's seeds (``ragen2.data.seeds``): hand-derived values, and distinct across rounds, iterations
and ranks."""

from __future__ import annotations

import pytest

from ragen2.data.seeds import RESAMPLE_SEED_OFFSET, instance_seeds, local_groups, sampler_seed
from ragen2.errors import ConfigError


def test_round_zero_seeds_by_hand() -> None:
    # seed 2, iteration 3, 4 groups over 2 ranks: base 2·1_000_003 = 2_000_006, + 3·4 = 2_000_018; rank 1
    # holds global groups 2 and 3
    assert instance_seeds(2, 3, 4, world=2) == [2_000_018, 2_000_019]
    assert instance_seeds(2, 3, 4, rank=1, world=2) == [2_000_020, 2_000_021]
    assert instance_seeds(0, 3, 4) == [12, 13, 14, 15]
    # sampler: 2·7919 + 3·104_729 + rank = 15_838 + 314_187 + 1
    assert sampler_seed(2, 3, rank=1, world=2) == 330_026
    assert sampler_seed(0, 3) == 314_187


def test_later_rounds_by_hand() -> None:
    # max_rounds 3: two later rounds per iteration; iteration 3's round 1 is slot 3·2 + 0 = 6
    # instance: 2_000_006 + 2_000_000_011 + 6·4 + rank 1·2 = 2_002_000_043
    assert instance_seeds(2, 3, 4, 1, max_rounds=3, rank=1, world=2) == [2_002_000_043, 2_002_000_044]
    # sampler, round 2 (slot 7): 2_000_000_011 + 2·7919 + 7·2 + 1
    assert sampler_seed(2, 3, 2, max_rounds=3, rank=1, world=2) == RESAMPLE_SEED_OFFSET + 15_838 + 15
    assert RESAMPLE_SEED_OFFSET + 15_838 + 15 == 2_000_015_864


def test_seeds_are_distinct_across_rounds_iterations_and_ranks() -> None:
    one_rank = {(it, r): instance_seeds(0, it, 4, r, max_rounds=3) for it in range(5) for r in range(3)}
    instance, sampler = [], []
    by_rank: dict[tuple[int, int], list[int]] = {}
    for rank in range(2):
        where = {"max_rounds": 3, "rank": rank, "world": 2}
        for it in range(5):
            for r in range(3):
                seeds = instance_seeds(0, it, 4, r, **where)
                assert len(seeds) == 2  # each rank rolls out its share of the global groups
                instance += seeds
                by_rank.setdefault((it, r), []).extend(seeds)
                sampler.append(sampler_seed(0, it, r, **where))
    assert len(instance) == len(set(instance)) == 5 * 3 * 4
    assert len(sampler) == len(set(sampler)) == 2 * 5 * 3
    # global group g has the same instance seed whatever the number of ranks
    assert by_rank == one_rank


def test_a_round_past_max_rounds_or_an_uneven_share_is_refused() -> None:
    with pytest.raises(ValueError, match="max_rounds > 3"):
        instance_seeds(0, 0, 4, 3, max_rounds=3)
    with pytest.raises(ValueError, match="max_rounds > 1"):
        sampler_seed(0, 0, 1)  # no dynamic sampling: round 0 only
    with pytest.raises(ConfigError, match=r"rollout\.groups=4 does not divide among 3 ranks.*Fix"):
        instance_seeds(0, 0, 4, world=3)
    assert local_groups(6, 3) == 2
