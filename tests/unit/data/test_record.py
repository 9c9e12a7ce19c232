"""The typed records of what rollouts did (``ragen2.data.record``): the iteration's groups by outcome and the spread
of their reward variance (``GroupStats``), success per kind of instance (``RolloutStats``), and the logged keys
``as_metrics`` makes of them."""

from __future__ import annotations

import math

import pytest
from helpers import episode, turn

from ragen2.agent.episode import Episode
from ragen2.data.record import GroupStats, RolloutStats


def _episode(group: int, sample: int, reward: float, success: bool, penalty: float = 0.0) -> Episode:
    ep = episode(group, [turn([1, 2], [3], reward=reward, penalty=penalty)], sample=sample)
    ep.success = success
    return ep


def test_groups_by_outcome_and_the_cv_of_their_reward_std() -> None:
    rank0 = [
        _episode(0, 0, 1.0, True),  # group 0: both succeed, returns (1, 1): RV 0
        _episode(1, 0, 0.0, False),  # group 1: both fail, returns (0, -0.1): RV = 0.1/√2
        _episode(0, 1, 1.0, True),
        _episode(1, 1, 0.0, False, penalty=-0.1),
    ]
    # another rank's (or round's) group 0 is a group of its own: one success, returns (1, 0): RV = 1/√2
    rank1 = [_episode(0, 0, 1.0, True), _episode(0, 1, 0.0, False)]
    out = GroupStats.of([rank0, rank1])
    assert out is not None and out.groups == 3
    assert out.all_success == out.all_fail == out.mixed == pytest.approx(1 / 3)
    # RV = (0, a/10, a), a = 1/√2: mean 1.1a/3; population variance (0.01a² + a²)/3 − (1.1a/3)² = 1.82a²/9,
    # so Std/Mean = (a√1.82/3)/(1.1a/3) = √1.82/1.1 = 1.226431
    a = 1 / math.sqrt(2)
    assert out.rv_mean == pytest.approx(1.1 * a / 3)
    assert out.rv_cv == pytest.approx(math.sqrt(1.82) / 1.1)
    assert out.rv_cv == pytest.approx(1.226431, abs=1e-6)


def test_a_batch_without_reward_variance_and_one_without_groups() -> None:
    # every group fails alike (a format penalty in each rollout does not make a variance): cv 0, not NaN
    same = [[_episode(g, k, 0.0, False, penalty=-0.1) for g in range(2) for k in range(3)]]
    out = GroupStats.of(same)
    assert out is not None and (out.groups, out.all_fail, out.mixed) == (2, 1.0, 0.0)
    assert (out.rv_mean, out.rv_cv) == (0.0, 0.0)
    # a group of one rollout: all-success or all-fail, never mixed, RV 0
    one = GroupStats.of([[_episode(0, 0, 1.0, True)]])
    assert one is not None and one.all_success == 1.0
    assert GroupStats.of([]) is None


def test_success_is_counted_per_kind_of_instance() -> None:
    # 2 learnable episodes (one wins), 3 easy (all win), 1 without a kind: success_learnable 1/2,
    # success_easy 1; an episode without a kind (an env that names none) counts only in success
    eps = []
    for kind, won in [
        ("learnable", True),
        ("learnable", False),
        ("easy", True),
        ("easy", True),
        ("easy", True),
        ("", False),
    ]:
        ep = episode(len(eps), [turn([1, 2], [3])])
        ep.kind, ep.success = kind, won
        eps.append(ep)
    out = RolloutStats.of(eps)
    assert out.success_by_kind == {"easy": 1.0, "learnable": 0.5}
    assert out.success == pytest.approx(4 / 6)
    assert eps[0].to_record()["kind"] == "learnable" and "kind" not in eps[5].to_record()


def test_the_logged_keys_are_made_in_one_place() -> None:
    # rollout/* as every run has logged them, in this order; token_entropy only where the sampler recorded it
    ep = _episode(0, 0, 1.0, True)
    ep.kind = "easy"
    rollout = RolloutStats.of([ep]).as_metrics("rollout/")
    assert list(rollout) == [
        f"rollout/{k}"
        for k in (
            "success", "return", "return_std", "turns", "format_valid_rate", "action_valid_rate",
            "actions_per_turn", "valid_reasoning_rate", "reasoning_length", "response_length",
            "response_clip_rate", "truncation_rate", "context_truncation_rate", "env_timeouts", "env_errors",
            "tool_calls", "tool_errors", "format_penalty", "sequence_length", "success_easy",
        )
    ]  # fmt: skip
    assert rollout["rollout/return"] == 1.0 and all(isinstance(v, float) for v in rollout.values())
    groups = GroupStats.of([[ep]])
    assert groups is not None and groups.as_metrics("sampled/") == {
        "sampled/groups": 1.0,
        "sampled/groups_all_success": 1.0,
        "sampled/groups_all_fail": 0.0,
        "sampled/groups_mixed": 0.0,
        "sampled/rv_mean": 0.0,
        "sampled/rv_cv": 0.0,
    }
