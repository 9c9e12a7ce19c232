"""Overlong shaping per turn: hand-derived penalties on the right tokens, truncated turns out of the loss."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from helpers import turn as make_turn

from ragen2.agent.episode import Episode, Turn
from ragen2.algos.advantages import bilevel_gae, reinforce_pp
from ragen2.data import (
    DynamicSampling,
    GroupFilter,
    OverlongShaping,
    RolloutBatch,
    RolloutDataModule,
    collate_episodes,
)
from ragen2.rollout.scripted import ScriptedSampler

ENV = {"id": "ragen2/FrozenLake-v0", "max_turns": 3, "max_actions_per_turn": 3}


def _turn(prompt_len: int, n: int, reward: float, penalty: float = 0.0, finish: str = "stop") -> Turn:
    return make_turn(range(1, prompt_len + 1), [7] * n, reward, penalty, finish_reason=finish)


def _episodes() -> list[Episode]:
    # max_len 8, cache_len 4, penalty 1: 0 up to L = 4, then −(L − 4)/4, −1 from L = 8 on.
    # A: turn 1 sampled [3, 7) L=4 → 0; turn 2 [9, 15) L=6 → −0.5; turn 3 [17, 25) L=8, truncated → −1
    a = Episode(
        env_id="x",
        seed=0,
        group=0,
        sample=0,
        system_prompt="",
        turns=[
            _turn(3, 4, reward=0.0),
            _turn(9, 6, reward=0.0, penalty=-0.1),
            _turn(17, 8, reward=2.0, finish="length"),
        ],
    )
    # B: one turn [2, 12) L=10 beyond max_len (possible when max_len < max_new_tokens) → −1
    b = Episode(env_id="x", seed=0, group=0, sample=1, system_prompt="", turns=[_turn(2, 10, reward=0.5)])
    # C: its only turn [2, 10) L=8 is truncated → −1; with filtering nothing of C is left in the loss
    c = Episode(
        env_id="x",
        seed=1,
        group=1,
        sample=0,
        system_prompt="",
        turns=[_turn(2, 8, reward=0.0, penalty=-0.1, finish="length")],
    )
    return [a, b, c]


def _batch(shaping: OverlongShaping | None = None) -> RolloutBatch:
    terms = shaping.turn_terms(_episodes()) if shaping is not None else None
    return collate_episodes(_episodes(), num_groups=2, pad_id=0, turn_terms=terms)


def test_penalties_at_the_boundaries() -> None:
    pens = OverlongShaping(cache_len=4, max_len=8).turn_penalties(_episodes())
    assert pens == [pytest.approx([0.0, -0.5, -1.0]), pytest.approx([-1.0]), pytest.approx([-1.0])]
    assert OverlongShaping(cache_len=4, max_len=8, penalty=0.5).turn_penalties(_episodes())[
        0
    ] == pytest.approx([0.0, -0.25, -0.5])


def test_shaping_without_filtering_adds_the_penalty_on_each_turns_last_token() -> None:
    batch = _batch()
    out = _batch(OverlongShaping(cache_len=4, max_len=8, filter=False))
    a = out.turn_rewards[0]
    # A: turn 1 at index 6: 0; turn 2 at 14: −0.1 − 0.5 = −0.6; turn 3 at 24: 2 − 1 = 1
    assert {i: a[i].item() for i in a.nonzero().squeeze(-1).tolist()} == {
        14: pytest.approx(-0.6),
        24: pytest.approx(1.0),
    }
    # returns = sum of shaped turn rewards: A 0.4, B 0.5 − 1 = −0.5, C −0.1 − 1 = −1.1
    assert out.returns.tolist() == pytest.approx([0.4, -0.5, -1.1])
    assert out.turn_rewards.sum(-1).tolist() == pytest.approx([0.4, -0.5, -1.1])
    assert out.token_rewards[0, 24].item() == pytest.approx(0.4) and out.token_rewards[0].count_nonzero() == 1
    assert out.token_rewards[1, 11].item() == pytest.approx(-0.5)
    assert torch.equal(out.loss_mask, batch.loss_mask) and torch.equal(out.turn_index, batch.turn_index)


def test_filtering_clears_truncated_turns_and_moves_their_reward_back() -> None:
    batch = _batch()
    out = _batch(OverlongShaping(cache_len=4, max_len=8))
    # A: only turn 3 (finish "length") leaves the loss; turns 1 and 2 stay
    assert out.loss_mask[0].nonzero().squeeze(-1).tolist() == [*range(3, 7), *range(9, 15)]
    assert out.turn_index[0, 17:25].eq(0).all() and out.turn_index[0, 9:15].eq(2).all()
    assert out.loss_mask[1].sum() == 10  # B was not truncated (finish "stop")
    assert out.loss_mask[2].sum() == 0  # C's only turn was
    # A: turn 3's shaped reward (1.0) moves onto turn 2's last token: −0.6 + 1 = 0.4; the return too
    assert out.turn_rewards[0, 14].item() == pytest.approx(0.4) and out.turn_rewards[0].count_nonzero() == 1
    assert out.token_rewards[0, 14].item() == pytest.approx(0.4) and out.token_rewards[0].count_nonzero() == 1
    # C: nothing left to hold its rewards; they reach the update through returns only
    assert out.turn_rewards[2].count_nonzero() == 0 and out.token_rewards[2].count_nonzero() == 0
    assert out.returns.tolist() == pytest.approx([0.4, -0.5, -1.1])
    # rewards sit only on loss tokens, so token-level estimators accept the batch
    off = out.loss_mask == 0
    assert out.turn_rewards[off].eq(0).all() and out.token_rewards[off].eq(0).all()
    reinforce_pp(out.token_rewards, out.loss_mask)
    nxt = torch.nn.functional.pad(out.turn_index[:, 1:], (0, 1))
    turn_end = (out.turn_index > 0) & (nxt != out.turn_index)  # turn ends as the modules derive them
    bilevel_gae(out.turn_rewards, torch.zeros_like(out.turn_rewards), out.loss_mask, turn_end)
    # the unshaped collation of the same episodes keeps every turn and the raw returns
    assert batch.loss_mask[0, 17:25].eq(1).all() and batch.returns.tolist() == pytest.approx([1.9, 0.5, -0.1])


def test_shaping_metrics_are_fractions_of_turns() -> None:
    # 5 turns, penalties 0, −0.5, −1, −1, −1: mean −0.7, 4 penalised; 2 truncated (A's turn 3 and C)
    m = OverlongShaping(cache_len=4, max_len=8).stats(_episodes())
    assert (m.penalty_mean, m.turns, m.filtered_turns) == pytest.approx((-0.7, 0.8, 0.4))
    assert m.as_metrics() == {
        "rollout/overlong_penalty_mean": m.penalty_mean,
        "rollout/overlong_turns": 0.8,
        "rollout/overlong_filtered_turns": 0.4,
    }
    assert OverlongShaping(cache_len=4, max_len=8, filter=False).stats(_episodes()).filtered_turns == 0


def test_shaping_validates_its_knobs() -> None:
    with pytest.raises(ValueError, match=r"algo\.shaping\.cache_len=-1"):
        OverlongShaping(cache_len=-1)
    with pytest.raises(ValueError, match=r"algo\.shaping\.cache_len=9 exceeds algo\.shaping\.max_len=8"):
        OverlongShaping(cache_len=9, max_len=8)
    with pytest.raises(ValueError, match=r"algo\.shaping\.penalty"):
        OverlongShaping(cache_len=1, penalty=-1.0)
    with pytest.raises(ValueError, match=r"rollout\.max_new_tokens=8"):
        OverlongShaping(cache_len=9).resolve(8)
    with pytest.raises(ValueError, match="resolve"):
        OverlongShaping(cache_len=4).turn_terms(_episodes())


# ---- in the DataModule: scripted responses, the real env and tokenizer -----------------------------
CLOSED = "Go.</think><answer>{oracle}</answer>"  # well-formed, at most 16 tokens
UNCLOSED = "I am not sure what to do here"  # 8 tokens, never stops: finish "length", no penalty
LONG = "hmm " * 40  # cut at max_new_tokens = 24: finish "length", L = max_len → −1


def _dm(responses: list[str], **kw: Any) -> RolloutDataModule:
    sampler = functools.partial(ScriptedSampler, responses=responses)
    return RolloutDataModule(
        env=ENV,
        rollout={"sampler": sampler, "groups": 4, "group_size": 4, "max_new_tokens": 24},
        tokenizer="tiny",
        filter=GroupFilter(strategy="none"),
        **kw,
    )


def test_datamodule_shapes_each_turn() -> None:
    dm = _dm([CLOSED, UNCLOSED, LONG], shaping=OverlongShaping(cache_len=8))
    assert dm.shaping is not None and dm.shaping.max_len == 24  # defaults to rollout.max_new_tokens
    batch = dm.rollout(0)
    for i, ep in enumerate(batch.episodes):
        shaped = ep.episode_return
        for turn in ep.turns:
            n = len(turn.sampled_ids)
            assert n <= 16 or n == 24, f"a response of {n} tokens: the hand values below assume ≤ 16 or 24"
            shaped += -1.0 if n == 24 else 0.0  # penalty-free up to max_len − cache_len = 16
            in_loss = batch.loss_mask[i, turn.start : turn.end]
            assert in_loss.eq(0.0 if turn.finish_reason == "length" else 1.0).all()
        assert batch.returns[i].item() == pytest.approx(shaped)
    turns = [t for ep in batch.episodes for t in ep.turns]
    m = batch.record.as_metrics()
    assert m["rollout/overlong_turns"] == pytest.approx(
        sum(len(t.sampled_ids) == 24 for t in turns) / len(turns)
    )
    assert m["rollout/overlong_penalty_mean"] == pytest.approx(-m["rollout/overlong_turns"])
    assert m["rollout/overlong_filtered_turns"] == pytest.approx(
        sum(t.finish_reason == "length" for t in turns) / len(turns)
    )
    assert 0 < m["rollout/overlong_turns"] < m["rollout/overlong_filtered_turns"] < 1


def test_dynamic_sampling_decides_on_shaped_returns() -> None:
    # Both responses are format errors (return −0.3 whatever is picked): every group is all-equal ...
    plain = _dm([UNCLOSED, LONG], sampling=DynamicSampling(max_rounds=2)).rollout(0)
    assert plain.record.dynamic is not None and plain.record.dynamic.shortfall == 4
    # ... until the overlong penalty tells the long answers apart
    shaped = _dm(
        [UNCLOSED, LONG], sampling=DynamicSampling(max_rounds=2), shaping=OverlongShaping(cache_len=8)
    )
    batch = shaped.rollout(0)
    assert batch.record.as_metrics()["filter/dynamic_groups_kept"] > 0 and batch.kept_rows.numel() > 0
