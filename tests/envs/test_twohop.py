"""TwoHop, the organism's env: its kinds and their shares, the rewards, the grammar, the negative control."""

from __future__ import annotations

import pytest
import ragen2_envs
from gymnasium.utils.env_checker import check_env
from ragen2_envs.twohop.env import MAX_GRAMMAR, STYLES, TwoHopEnv, grammar

from ragen2.agent.parsing import parse_turn


def make(**kwargs: object) -> TwoHopEnv:
    env = ragen2_envs.make("ragen2/TwoHop-v0", **kwargs)
    assert isinstance(env, TwoHopEnv)
    return env


def tables(obs: str) -> dict[str, str]:
    """Each line of the observation, ``name: rest``."""
    return dict(line.split(": ", 1) for line in obs.splitlines())


def pairs(row: str) -> dict[str, str]:
    """A table's ``a=b`` rows as a mapping."""
    return dict(cell.split("=") for cell in row.split())


def test_check_env_passes() -> None:
    check_env(make(), skip_render_check=False)


def test_the_answer_is_two_lookups_away_and_earns_one() -> None:
    env = make(zero_variance_share=0.0)
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        t = tables(obs)
        middle = pairs(t["keys"])[t["query"]]
        answer = pairs(t["links"])[middle]
        expected = {"kind": "learnable", "middle": middle, "solvable": True}
        assert info == {**expected, "action_is_valid": True, "success": False}
        assert env.oracle_action() == answer
        # the solver's reasoning: a style word, the middle and the answer, a sentence of the grammar
        reasoning = env.oracle_reasoning([answer])
        assert reasoning is not None and reasoning.split()[1:] == [middle, answer]
        assert reasoning in env.reasoning_grammar()
        wrong = next(v for v in pairs(t["links"]).values() if v != answer)
        assert env.step(wrong)[1:4] == (0.0, True, False)
        env.reset(seed=seed)
        _, reward, terminated, _, step_info = env.step(answer)
        assert (reward, terminated, step_info["success"]) == (1.0, True, True)


def test_the_links_table_is_shuffled_apart_from_the_keys() -> None:
    # the second table's row order is its own: the answer's place cannot be read off the query's place
    env = make(zero_variance_share=0.0)
    same = 0
    for seed in range(40):
        t = tables(env.reset(seed=seed)[0])
        keys, links = pairs(t["keys"]), list(pairs(t["links"]))
        same += links == list(keys.values())
    assert same < 10  # 4 rows in the same order by chance: 1 in 24


def test_kinds_come_in_the_shares_asked_for() -> None:
    # p0 = 0.75, easy half of it: learnable 0.25, easy 0.375, impossible 0.375 (binomial sd over 2,000 ≈ 0.011)
    env = make(zero_variance_share=0.75, easy_share=0.5)
    kinds = [env.reset(seed=s)[1]["kind"] for s in range(2000)]
    assert kinds.count("learnable") / 2000 == pytest.approx(0.25, abs=0.04)
    assert kinds.count("easy") / 2000 == pytest.approx(0.375, abs=0.04)
    assert kinds.count("impossible") / 2000 == pytest.approx(0.375, abs=0.04)


def test_easy_shows_the_answer_and_impossible_has_no_query_nor_reward() -> None:
    env = make(zero_variance_share=0.99, easy_share=0.5)
    seen = set()
    for seed in range(60):
        obs, info = env.reset(seed=seed)
        query = tables(obs)["query"]
        if info["kind"] == "easy":
            key, _, shown = query.partition(" = ")
            assert (
                shown == env.oracle_action() == pairs(tables(obs)["links"])[pairs(tables(obs)["keys"])[key]]
            )
        elif info["kind"] == "impossible":
            assert query == "?" and env.oracle_action() is None and env.oracle_reasoning(["v0"]) is None
            # no value earns anything: every answer is 0, so the group's reward has no variance
            for v in range(16):
                env.reset(seed=seed)
                assert env.step(f"v{v}")[1] == 0.0
        seen.add(info["kind"])
    assert seen == {"easy", "impossible"}


def test_a_word_that_is_no_value_is_an_invalid_action() -> None:
    env = make(zero_variance_share=0.0, num_values=16)
    for action in ["v16", "m3", "", "v", "v01", "V3", "answer"]:
        env.reset(seed=0)
        _, reward, terminated, _, info = env.step(action)
        assert (reward, terminated, info["action_is_valid"]) == (0.0, False, False)


def test_reward_noise_flips_rewards_from_the_dynamics() -> None:
    env = make(zero_variance_share=0.0, reward_noise=0.5)
    env.reset(seed=3)
    answer = env.oracle_action()
    rewards = []
    for k in range(400):
        env.reset(seed=3, options={"sample": k})
        rewards.append(env.step(answer)[1])
    assert sum(rewards) / 400 == pytest.approx(0.5, abs=0.08)  # right answers, flipped half the time
    env.reset(seed=3, options={"sample": 7})
    again = env.step(answer)[1]
    assert again == rewards[7]  # the same sample draws the same flip


def test_the_dynamics_are_seeded_by_seed_and_sample_and_made_only_when_drawn_from() -> None:
    import numpy as np

    env = make(zero_variance_share=0.0)
    env.reset(seed=3, options={"sample": 7})
    env.step(env.oracle_action())
    assert env._dynamics_rng is None  # no reward noise: no draw, no generator made
    assert env.dynamics_rng.random() == np.random.default_rng([3, 7]).random()
    env.reset(seed=3, options={"sample": 7})  # a new episode starts its stream again
    assert env.dynamics_rng.random() == np.random.default_rng([3, 7]).random()


def test_the_negative_control_needs_no_middle() -> None:
    env = make(zero_variance_share=0.0, hops=1)
    obs, info = env.reset(seed=5)
    t = tables(obs)
    # the second table maps keys straight to values; the reasoning still names the query's middle
    assert env.oracle_action() == pairs(t["values"])[t["query"]]
    assert info["middle"] == pairs(t["keys"])[t["query"]]
    assert "values maps each key to a value" in env.instructions


def test_the_grammar_is_a_style_a_middle_and_a_value() -> None:
    g = make(num_styles=3, num_middles=5, num_values=4).reasoning_grammar()
    assert len(g) == 3 * 5 * 4 and len(set(g)) == len(g)
    assert g[0] == "so m0 v0" and g[1] == "so m0 v1" and g[-1] == "then m4 v3"
    assert all(w.split()[0] in STYLES[:3] for w in g)
    assert grammar(3, 5, 4) is grammar(3, 5, 4)  # built once per shape


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"zero_variance_share": 1.0}, "zero_variance_share"),
        ({"zero_variance_share": -0.1}, "zero_variance_share"),
        ({"reward_noise": 0.6}, "reward_noise"),
        ({"hops": 3}, "hops"),
        ({"num_styles": 2, "num_middles": 32, "num_values": 32}, "num_styles"),
        ({"num_pairs": 6, "num_middles": 4}, "num_pairs"),
        ({"num_pairs": 6, "num_keys": 4}, "num_pairs"),
    ],
)
def test_bad_knobs_are_refused_naming_the_key(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        make(**kwargs)


def test_the_largest_grammar_fits_the_limit() -> None:
    # the limit refuses 2 styles with 32 middles and 32 values, and takes that shape with one style
    assert 2 * 32 * 32 > MAX_GRAMMAR >= 1 * 32 * 32
    assert len(make(num_styles=1, num_middles=32, num_values=32).reasoning_grammar()) == MAX_GRAMMAR


def test_the_agent_holds_the_reasoning_to_the_grammar() -> None:
    g = frozenset(make().reasoning_grammar())
    reply = " so m3 v4 </think> <answer> v4 </answer> <|im_end|>"
    ok = parse_turn(reply, 1, ("<|im_end|>",), g)
    assert ok.format_ok and ok.actions == ["v4"]
    for bad in [
        "so m3 </think><answer>v4</answer>",
        "so m3 v4 v4</think><answer>v4</answer>",
        "so m99 v4</think><answer>v4</answer>",
        "I think m3</think><answer>v4</answer>",
    ]:
        parsed = parse_turn(bad, 1, (), g)
        assert not parsed.format_ok and parsed.actions == []
    # without a grammar (every other env) any reasoning passes
    assert parse_turn("I think m3</think><answer>v4</answer>", 1).format_ok
