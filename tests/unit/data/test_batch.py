"""Episodes -> tensors: masks come from the sampled spans, rewards sit on the right tokens."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from helpers import turn

from ragen2.agent.episode import Episode
from ragen2.data.batch import by_group, collate_episodes


def _episode(group: int) -> Episode:
    # turn 1: prompt [1 2 3], sampled [4 5]; then closer+user [6 7]; turn 2 sampled [8]
    t1 = turn([1, 2, 3], [4, 5], reward=1.0)
    t2 = turn([1, 2, 3, 4, 5, 6, 7], [8], reward=0.5, penalty=-0.1)
    return Episode(env_id="x", seed=group, group=group, sample=0, system_prompt="", turns=[t1, t2])


def test_collate_masks_rewards_and_padding() -> None:
    short = Episode(
        env_id="x", seed=1, group=1, sample=0, system_prompt="", turns=[turn([1, 2], [9], reward=2.0)]
    )
    batch = collate_episodes([_episode(0), short], num_groups=2, pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 9, 0, 0, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1] * 8, [1, 1, 1, 0, 0, 0, 0, 0]]
    # sampled positions only: 4 5 (turn 1) and 8 (turn 2); nothing of the prompt, closer or user text
    assert batch.loss_mask[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 1]
    assert batch.turn_index[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 2]
    # episode return 1.0 + 0.5 − 0.1 = 1.4 on the last sampled token (index 7)
    assert batch.token_rewards[0].tolist() == pytest.approx([0, 0, 0, 0, 0, 0, 0, 1.4])
    # turn rewards on each turn's last sampled token: 1.0 at index 4, 0.4 at index 7
    assert batch.turn_rewards[0].tolist() == pytest.approx([0, 0, 0, 0, 1.0, 0, 0, 0.4])
    assert batch.returns.tolist() == pytest.approx([1.4, 2.0])
    assert math.isnan(float(batch.sampler_logprobs[0, 0])) and float(batch.sampler_logprobs[0, 3]) == -0.5


def test_select_trims_to_longest_row() -> None:
    short = Episode(
        env_id="x", seed=1, group=1, sample=0, system_prompt="", turns=[turn([1, 2], [9], reward=2.0)]
    )
    batch = collate_episodes([_episode(0), short], num_groups=2, pad_id=0)
    sub = batch.select(torch.tensor([1]))
    assert sub.input_ids.tolist() == [[1, 2, 9]]
    assert sub.returns.tolist() == [2.0] and sub.episodes[0] is short


def test_kept_rows_follow_group_mask() -> None:
    batch = collate_episodes([_episode(0), _episode(1), _episode(0)], num_groups=2, pad_id=0)
    batch = dataclasses.replace(batch, keep=torch.tensor([False, True]))
    assert batch.kept_rows.tolist() == [1]


def test_by_group_requires_equal_groups() -> None:
    g = torch.tensor([1, 0, 1, 0])
    r = torch.tensor([10.0, 1.0, 20.0, 2.0])
    assert by_group(r, g, 2).tolist() == [[1.0, 2.0], [10.0, 20.0]]
    with pytest.raises(ValueError, match="unequal"):
        by_group(r[:3], g[:3], 2)
