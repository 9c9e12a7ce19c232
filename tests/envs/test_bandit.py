"""Bandit: group-identical prompts, independent payouts, exact name actions, hand-derived payouts."""

from __future__ import annotations

import numpy as np
import pytest
import ragen2_envs
from gymnasium.utils.env_checker import check_env
from helpers import env_conf
from omegaconf import OmegaConf
from ragen2_envs.bandit.env import BanditEnv
from ragen2_envs.bandit.names import ARM_NAME_PAIRS


def make(**kwargs: object) -> BanditEnv:
    env = ragen2_envs.make("ragen2/Bandit-v0", **kwargs)
    assert isinstance(env, BanditEnv)
    return env


def fuzz_strings(rng: np.random.Generator, count: int) -> list[str]:
    """Garbage of every kind: printable, arbitrary unicode, blank, huge."""
    printable = [chr(c) for c in range(32, 127)]
    out: list[str] = []
    for k in range(count):
        kind = k % 4
        if kind == 0:
            out.append("".join(rng.choice(printable, size=int(rng.integers(0, 40)))))
        elif kind == 1:
            out.append("".join(chr(int(c)) for c in rng.integers(1, 0x2FFFF, size=int(rng.integers(1, 20)))))
        elif kind == 2:
            out.append(" \t\n"[k % 3] * int(rng.integers(0, 5)))
        else:
            out.append("x" * int(rng.integers(1_000, 70_000)))
    return out


def test_check_env_passes() -> None:
    check_env(make(), skip_render_check=False)


def test_one_seed_is_one_prompt_across_samples() -> None:
    # a group = K rollouts of one seed with sample = 0..K-1: identical first observation
    env = make()
    first = [env.reset(seed=7, options={"sample": k})[0] for k in range(8)]
    assert len(set(first)) == 1
    # and the pool is really used: 60 seeds show several pairs and both orders
    shown = {tuple(make().reset(seed=s)[1]["arms"]) for s in range(60)}
    assert len({frozenset(pair) for pair in shown}) >= 6
    assert any(pair[0] in {low for low, _ in ARM_NAME_PAIRS["train"]} for pair in shown)
    assert any(pair[0] in {high for _, high in ARM_NAME_PAIRS["train"]} for pair in shown)


def test_same_seed_and_sample_repeat_the_payout() -> None:
    env = make()
    payouts = []
    for _ in range(2):
        env.reset(seed=11, options={"sample": 3})
        payouts.append(env.step(env.high_name)[1])
    assert payouts[0] == payouts[1]


def test_high_arm_payouts_are_independent_across_a_group() -> None:
    # high arm: 1.0 w.p. 0.25 else 0.0, so mean 0.25; 400 samples: sd = sqrt(.25*.75/400) ~ 0.022,
    # 0.25 +- 0.09 is a 4-sigma band
    env = make()
    payouts = []
    for k in range(400):
        env.reset(seed=5, options={"sample": k})
        _, reward, terminated, truncated, info = env.step(env.high_name)
        assert terminated and not truncated and info["arm"] == "high" and info["action_is_valid"]
        assert reward in (0.0, 1.0)
        assert info["success"]  # the high arm has the larger expectation (0.25 > 0.1)
        payouts.append(reward)
    assert abs(np.mean(payouts) - 0.25) < 0.09


def test_low_arm_pays_exactly_low_payout() -> None:
    env = make()
    env.reset(seed=2)
    obs, reward, terminated, _, info = env.step(env.low_name.upper())  # case does not matter
    assert reward == pytest.approx(0.1)
    assert terminated and info == {"action_is_valid": True, "success": False, "arm": "low"}
    assert obs == f"{env.low_name}: 0.1 points"


def test_knobs_change_payouts_and_the_better_arm() -> None:
    # high_prob 1 -> the gamble always pays high_payout
    env = make(high_prob=1.0, high_payout=2.0)
    env.reset(seed=0)
    assert env.step(env.high_name)[1] == 2.0
    # low arm 0.5 beats the gamble's 0.25 * 1.0 + 0.75 * 0.0 = 0.25: oracle and success follow
    env = make(low_payout=0.5)
    env.reset(seed=0)
    assert env.oracle_action() == env.low_name
    _, reward, _, _, info = env.step(env.oracle_action() or "")
    assert reward == 0.5 and info["success"] and info["arm"] == "low"


def test_oracle_action_succeeds_on_many_seeds() -> None:
    env = make()
    for seed in range(30):
        env.reset(seed=seed)
        action = env.oracle_action()
        assert action is not None
        _, _, terminated, _, info = env.step(action)
        assert terminated and info["success"] and info["arm"] == "high"
        assert env.oracle_action() is None


def test_fuzzed_and_near_miss_actions_are_invalid_and_change_nothing() -> None:
    env = make()
    obs0, _ = env.reset(seed=4)
    low, high = env.low_name, env.high_name
    near_misses = [
        low[:-1],
        high + ".",
        f"{low} {high}",
        f"{low}||{high}",
        f"<answer>{low}</answer>",
        f'"{high}"',
        "1",
        "2",
        "arm 1",
        "left",
        low + low,
        " ".join(high),
    ]
    garbage = fuzz_strings(np.random.default_rng(0), 1000 - len(near_misses))
    for action in near_misses + garbage:
        obs, reward, terminated, truncated, info = env.step(action)
        assert not info["action_is_valid"], action[:50]
        assert (obs, reward, terminated, truncated, info["success"]) == (obs0, 0.0, False, False, False)
    # surrounding whitespace is the agent's to strip, and harmless here
    assert env.step(f"  {low}\n")[4]["action_is_valid"]


def test_steps_after_the_pull_do_nothing() -> None:
    env = make()
    env.reset(seed=1)
    env.step(env.low_name)
    _, reward, terminated, _, info = env.step(env.high_name)
    assert (reward, terminated, info["action_is_valid"]) == (0.0, True, False)


def test_test_split_uses_unseen_names() -> None:
    train = {name for pair in ARM_NAME_PAIRS["train"] for name in pair}
    test = {name for pair in ARM_NAME_PAIRS["test"] for name in pair}
    assert not train & test
    env = make(split="test")
    for seed in range(20):
        assert set(env.reset(seed=seed)[1]["arms"]) <= test


@pytest.mark.parametrize(("kwargs", "key"), [({"high_prob": 1.5}, "high_prob"), ({"split": "val"}, "split")])
def test_bad_knobs_raise_naming_the_key(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        BanditEnv(**kwargs)  # type: ignore[arg-type]


def test_conf_matches_the_class() -> None:
    conf = OmegaConf.to_container(env_conf("bandit"), resolve=True)
    assert isinstance(conf, dict)
    assert conf["id"] == "ragen2/Bandit-v0"
    assert conf["max_turns"] == BanditEnv.default_max_turns == 1
    assert conf["max_actions_per_turn"] == BanditEnv.default_max_actions_per_turn == 1
    env = make(**conf["kwargs"])
    assert (env.low_payout, env.high_payout, env.high_prob) == (0.1, 1.0, 0.25)
