"""FrozenLake: maps, slippery dynamics, BFS and value-iteration solvers, hand-derived rewards."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import ragen2_envs
from gymnasium.utils.env_checker import check_env
from helpers import env_conf
from omegaconf import OmegaConf
from ragen2_envs.frozenlake import (
    FrozenLakeEnv,
    generate_random_map,
    optimal_policy,
    reach_probabilities,
    shortest_path,
)
from ragen2_envs.frozenlake.generator import has_path
from ragen2_envs.frozenlake.solver import ACTIONS, slip_direction, transition_matrix

from .test_all_envs import fuzz_actions

# the only safe route from S (0,0): Down, Down, Right, Right
LAKE = ("SFH", "FHF", "FFG")


def make(**kwargs: object) -> FrozenLakeEnv:
    env = ragen2_envs.make("ragen2/FrozenLake-v0", **kwargs)
    assert isinstance(env, FrozenLakeEnv)
    return env


def on_map(desc: tuple[str, ...], pos: tuple[int, int] = (0, 0), **kwargs: object) -> FrozenLakeEnv:
    """A real env reset normally, then put on a hand-made map (its dynamics stream is kept)."""
    env = make(**kwargs)
    env.reset(seed=0)
    env.desc, env.pos = desc, pos
    return env


@pytest.mark.parametrize(
    ("success_rate", "observation"), [(1.0, "grid"), (0.8, "coord"), (0.5, "grid_coord")]
)
def test_check_env(success_rate: float, observation: str) -> None:
    check_env(make(success_rate=success_rate, observation=observation), skip_render_check=False)


def test_deterministic_walk_to_goal_by_hand() -> None:
    env = on_map(LAKE, success_rate=1.0)
    assert env.render_state() == "P_O\n_O_\n__G"
    rewards = []
    for action in ["Down", "down", "RIGHT"]:
        _, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        assert not terminated and not truncated and info["action_is_valid"] and info["action_is_effective"]
    obs, reward, terminated, truncated, info = env.step("Right")
    # reward 1 only on the goal, which ends the episode; the player shows as √ there
    assert rewards == [0.0, 0.0, 0.0] and reward == 1.0 and terminated and not truncated and info["success"]
    assert obs == "__O\n_O_\n__√"
    # a finished episode ignores further moves
    assert env.step("Up")[1:4] == (0.0, True, False)


def test_hole_ends_with_zero_and_edge_is_valid_noop() -> None:
    env = on_map(LAKE, success_rate=1.0)
    obs, reward, terminated, _, info = env.step("Up")  # off the map: stay, still a valid action
    assert obs == "P_O\n_O_\n__G" and reward == 0.0 and not terminated
    assert info["action_is_valid"] and not info["action_is_effective"]
    env.step("Right")
    obs, reward, terminated, truncated, info = env.step("Right")
    assert obs == "__X\n_O_\n__G" and reward == 0.0 and terminated and not truncated and not info["success"]


def test_step_budget_truncates() -> None:
    env = on_map(LAKE, success_rate=1.0, max_steps=2)
    assert env.step("Left")[3] is False
    _, reward, terminated, truncated, _ = env.step("Left")
    assert truncated and not terminated and reward == 0.0


def test_invalid_text_changes_nothing() -> None:
    env = on_map(LAKE, success_rate=0.5)
    state = env.dynamics_rng.bit_generator.state
    for text in ["Lefty", "go left", "L", "<answer>Down</answer>", "Down || Down", "2", "", "\ud800"]:
        obs, reward, terminated, truncated, info = env.step(text)
        assert obs == "P_O\n_O_\n__G" and reward == 0.0 and not terminated and not truncated
        assert info["action_is_valid"] is False
    # no slip was drawn for invalid text and no budget spent
    assert env.dynamics_rng.bit_generator.state == state and env.num_env_steps == 0


def test_fuzzed_actions() -> None:
    env = make(success_rate=0.8)
    env.reset(seed=2)
    names = {a.lower() for a in ACTIONS}
    for k, text in enumerate(fuzz_actions(np.random.default_rng(2))):
        before = env.render_state()
        obs, reward, terminated, truncated, info = env.step(text)
        assert info["action_is_valid"] == (text.strip().lower() in names)
        if not info["action_is_valid"]:
            assert obs == before and reward == 0.0
        if terminated or truncated:
            env.reset(seed=k)


def test_slip_direction_by_hand() -> None:
    # success_rate 0.8: u < 0.8 intended; [0.8, 0.9) the (a − 1) perpendicular; [0.9, 1) the (a + 1)
    up = ACTIONS.index("Up")
    assert ACTIONS[slip_direction(up, 0.8, 0.79)] == "Up"
    assert ACTIONS[slip_direction(up, 0.8, 0.85)] == "Right"
    assert ACTIONS[slip_direction(up, 0.8, 0.95)] == "Left"
    assert ACTIONS[slip_direction(ACTIONS.index("Left"), 0.8, 0.85)] == "Up"  # (0 − 1) % 4 = 3
    assert ACTIONS[slip_direction(ACTIONS.index("Left"), 1.0, 0.999)] == "Left"
    assert ACTIONS[slip_direction(ACTIONS.index("Down"), 0.0, 0.0)] == "Left"


def test_slip_frequencies_and_sample_independence() -> None:
    # from the centre of an open 3×3 lake, "Up" lands on (0,1) w.p. 0.8, (1,0) and (1,2) w.p. 0.1
    lake = ("FFF", "FSF", "FFG")
    env = on_map(lake, (1, 1), success_rate=0.8)
    n = 4000
    landed: Counter[tuple[int, int]] = Counter()
    for _ in range(n):
        env.pos, env.num_env_steps = (1, 1), 0
        _, _, _, _, info = env.step("Up")
        landed[env.pos] += 1
        assert info["slipped"] == (env.pos != (0, 1))
    assert set(landed) == {(0, 1), (1, 0), (1, 2)}
    # 4 standard errors: sqrt(0.1 * 0.9 / 4000) ≈ 0.0047
    assert abs(landed[(0, 1)] / n - 0.8) < 0.025
    assert abs(landed[(1, 0)] / n - 0.1) < 0.02 and abs(landed[(1, 2)] / n - 0.1) < 0.02
    # one seed = one map for the whole group; the sample index alone changes the slips
    walks = []
    for sample in [0, 0, 1, 2, 3, 4, 5]:
        env = make(success_rate=0.5)
        obs, _ = env.reset(seed=9, options={"sample": sample})
        walks.append((obs, *[env.step(a)[0] for a in ["Left", "Up", "Right", "Down"] * 2]))
    assert walks[0] == walks[1]
    assert len({w[0] for w in walks}) == 1 and len(set(walks)) >= 3


def test_shortest_path_by_hand() -> None:
    assert shortest_path(LAKE, (0, 0)) == ["Down", "Down", "Right", "Right"]
    assert shortest_path(LAKE, (2, 2)) == []
    assert shortest_path(("SHG",), (0, 0)) is None


def test_value_iteration_by_hand() -> None:
    # ("SG", "HH"), success 0.8. From S, Right reaches G w.p. 0.8, slips Up (stay) or Down (hole).
    # Up never risks the hole: intended Up and the Left slip stay, the Right slip (0.1) reaches G.
    # So V*(S) = 1 via Up, and Q(S, Right) = 0.8·1 + 0.1·V*(S) + 0.1·0 = 0.9.
    desc = ("SG", "HH")
    values = reach_probabilities(desc, 0.8)
    assert values[0, 0] == pytest.approx(1.0, abs=1e-9)
    q_values = transition_matrix(desc, 0.8)[0] @ values.ravel()
    assert q_values[ACTIONS.index("Right")] == pytest.approx(0.9, abs=1e-9)
    policy, _ = optimal_policy(desc, 0.8)
    assert ACTIONS[policy[0, 0]] == "Up"
    # ("HH", "SG", "HH"), success rate r. Right: G w.p. r, both slips fall in, so r.
    # Up: falls in w.p. r, slips Left (stay) or Right (G) w.p. (1 − r)/2 each, so
    # V = (1 − r)/2 / (1 − (1 − r)/2) = (1 − r)/(1 + r). Left and Down do no better.
    # V*(S) = max(r, (1 − r)/(1 + r)): 0.8 at r = 0.8, 0.5 at r = 0.5, 1 at r = 0.
    for rate, expected in ((0.8, 0.8), (0.5, 0.5), (0.0, 1.0), (0.2, 2 / 3)):
        assert reach_probabilities(("HH", "SG", "HH"), rate)[1, 0] == pytest.approx(expected, abs=1e-9)
    # holes are 0, the goal is 1
    assert values[1, 0] == 0.0 and values[0, 1] == 1.0


def test_slippery_oracle_matches_value_iteration() -> None:
    env = make(success_rate=0.8, max_steps=1000)
    # a map where even optimal play can fall in
    seed = next(s for s in range(200) if env.reset(seed=s)[1]["optimal_success_prob"] < 0.95)
    _, info = env.reset(seed=seed)
    expected, start = info["optimal_success_prob"], env.pos
    n, wins = 2000, 0
    for _ in range(n):
        env.pos, env.num_env_steps = start, 0
        while (action := env.oracle_action()) is not None:
            *_, info = env.step(action)
        wins += info["success"]
    sigma = np.sqrt(expected * (1 - expected) / n)
    assert abs(wins / n - expected) < 4 * sigma + 1e-3


def test_deterministic_oracle_takes_the_shortest_path() -> None:
    for seed in range(20):
        env = make(success_rate=1.0)
        _, info = env.reset(seed=seed)
        assert info["optimal_success_prob"] == 1.0
        total, steps = 0.0, 0
        while (action := env.oracle_action()) is not None:
            _, reward, terminated, _, _ = env.step(action)
            total, steps = total + reward, steps + 1
        assert terminated and total == 1.0 and steps == info["optimal_length"]


def test_generator() -> None:
    for seed in range(100):
        desc = generate_random_map(np.random.default_rng(seed), size=5, p=0.6)
        assert len(desc) == 5 and all(len(row) == 5 for row in desc) and has_path(desc)
        assert "".join(desc).count("S") == 1 and "".join(desc).count("G") == 1
    assert "H" not in "".join(generate_random_map(np.random.default_rng(0), p=1.0))
    a = generate_random_map(np.random.default_rng(3))
    assert a == generate_random_map(np.random.default_rng(3))
    maps = {make().reset(seed=s)[0] for s in range(30)}
    assert len(maps) >= 25  # start and goal move too, as in the reference


def test_coordinate_observation() -> None:
    env = on_map(LAKE, observation="grid_coord", success_rate=1.0)
    assert env.render_state() == (
        "Coordinates:\n"
        "Board size: 3 rows x 3 cols (zero-indexed).\n"
        "Start: (0, 0)\nGoal: (2, 2)\nPlayer: (0, 0)\nHoles: (0, 2), (1, 1)\n"
        "Grid Map:\nP_O\n_O_\n__G"
    )


def test_instructions_mention_slipping_only_when_slippery() -> None:
    assert "slippery" in make(success_rate=0.8).instructions
    text = make(success_rate=1.0).instructions
    assert "slippery" not in text
    for needle in ["P: player", "_: frozen", "O: hole", "G: goal", "X: player fell", "√: player on the goal"]:
        assert needle in text
    assert "Left, Down, Right, Up" in text


def test_config_is_the_main_table_setting() -> None:
    cfg = env_conf("frozenlake")
    assert (cfg.max_turns, cfg.max_actions_per_turn) == (5, 2)
    assert cfg.kwargs.success_rate == 1.0 and cfg.kwargs.p == 0.9 and cfg.kwargs.size == 4
    env = ragen2_envs.make(cfg.id, **OmegaConf.to_container(cfg.kwargs))
    obs, info = env.reset(seed=0)
    assert len(obs.splitlines()) == 4 and info["optimal_success_prob"] == 1.0


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"size": 1}, "size"),
        ({"p": 0.0}, "p="),
        ({"success_rate": 1.5}, "success_rate"),
        ({"observation": "rgb"}, "observation"),
    ],
)
def test_bad_knobs_raise_naming_the_key(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        FrozenLakeEnv(**kwargs)  # type: ignore[arg-type]
