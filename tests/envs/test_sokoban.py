"""Sokoban: generator, optimal solver, hand-derived rewards, parsing, seeding, configs."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import ragen2_envs
from gymnasium.utils.env_checker import check_env
from helpers import env_conf
from omegaconf import OmegaConf
from ragen2_envs.sokoban import ACTIONS, SokobanEnv, SokobanState, generate_puzzle, solve

from .test_all_envs import fuzz_actions

# player (1,1), box (1,3), target (1,5): Right, push, push = 3 moves
CORRIDOR = """
#######
#P_X_O#
#######
"""
# the box at (2,2) must go down onto (3,2): step Left to (1,2), then push Down = 2 moves
DROP = """
#####
#__P#
#_X_#
#_O_#
#####
"""
# two boxes: one already on its target at (1,2), one at (1,5) next to the target (1,6)
TWO_BOXES = """
########
#P√__XO#
########
"""


def make(**kwargs: object) -> SokobanEnv:
    env = ragen2_envs.make("ragen2/Sokoban-v0", **kwargs)
    assert isinstance(env, SokobanEnv)
    return env


def on_board(text: str, **kwargs: object) -> SokobanEnv:
    """A real env reset normally, then put on a hand-made board."""
    env = make(**kwargs)
    env.reset(seed=0)
    env.state = SokobanState.from_text(text)
    return env


def play(state: SokobanState, actions: list[str]) -> SokobanState:
    for action in actions:
        state = state.move(action)
    return state


@pytest.mark.parametrize("observation", ["grid", "coord", "grid_coord"])
def test_check_env(observation: str) -> None:
    check_env(make(observation=observation), skip_render_check=False)


def test_check_env_8x8_two_boxes() -> None:
    check_env(make(dim_room=[8, 8], num_boxes=2, search_depth=10), skip_render_check=False)


def test_corridor_rewards_by_hand() -> None:
    env = on_board(CORRIDOR)
    # step onto floor: only the step penalty
    _, reward, terminated, truncated, info = env.step("Right")
    assert reward == pytest.approx(-0.1) and not terminated and not truncated
    assert info["action_is_valid"] and info["action_is_effective"] and not info["success"]
    # push the box from (1,3) to (1,4): still off target, −0.1
    _, reward, terminated, _, _ = env.step("right")
    assert reward == pytest.approx(-0.1) and not terminated
    # push onto the target: −0.1 + 1 (box on target) + 10 (solved) = 10.9, terminated
    obs, reward, terminated, truncated, info = env.step("RIGHT")
    assert reward == pytest.approx(10.9)
    assert terminated and not truncated and info["success"] and info["boxes_on_target"] == 1
    assert obs == "#######\n#___P√#\n#######"


def test_push_off_target_and_blocked_push_by_hand() -> None:
    env = on_board(TWO_BOXES)
    # pushing the box off its target at (1,2) to (1,3): −0.1 − 1 = −1.1
    obs, reward, *_, info = env.step("Right")
    assert reward == pytest.approx(-1.1) and info["boxes_on_target"] == 0
    # the player now stands on the vacated target: S
    assert obs.splitlines()[1] == "#_SX_XO#"
    # push it on to (1,4), next to the other box: −0.1
    assert env.step("Right")[1] == pytest.approx(-0.1)
    # box against box cannot move: a valid action that changes nothing, still −0.1
    before = env.render_state()
    obs, reward, terminated, _, info = env.step("Right")
    assert reward == pytest.approx(-0.1) and obs == before and not terminated
    assert info["action_is_valid"] and not info["action_is_effective"]


def test_wall_bump_is_valid_noop_and_budget_truncates() -> None:
    env = on_board(CORRIDOR, max_steps=3)
    before = env.render_state()
    for k in range(3):
        obs, reward, terminated, truncated, info = env.step("Up")  # wall above the player
        assert obs == before and reward == pytest.approx(-0.1) and info["action_is_valid"]
        assert not info["action_is_effective"] and not terminated
        assert truncated == (k == 2)
    # once over, further actions change nothing and earn nothing
    obs, reward, terminated, truncated, _ = env.step("Right")
    assert obs == before and reward == 0.0 and truncated and not terminated


def test_invalid_text_changes_nothing_and_costs_nothing() -> None:
    env = on_board(CORRIDOR, max_steps=2)
    before = env.render_state()
    for text in ["Upp", "right!", "R", "<answer>Right</answer>", "Right || Right", "push right", "3", ""]:
        obs, reward, terminated, truncated, info = env.step(text)
        assert obs == before and reward == 0.0 and not terminated and not truncated
        assert info["action_is_valid"] is False
    # invalid text does not spend the action budget: two valid steps still fit in max_steps=2
    assert not env.step("Right")[3]
    assert env.step("  Right\n")[3]


def test_fuzzed_actions() -> None:
    env = make()
    env.reset(seed=1)
    valid_names = {name.lower() for name in ACTIONS}
    for text in fuzz_actions(np.random.default_rng(1)):
        before = env.render_state()
        obs, reward, terminated, truncated, info = env.step(text)
        assert info["action_is_valid"] == (text.strip().lower() in valid_names)
        if not info["action_is_valid"]:
            assert obs == before and reward == 0.0
        if terminated or truncated:
            env.reset(seed=1)


def test_same_seed_same_puzzle_and_trajectory() -> None:
    actions = ["Up", "Left", "bogus", "Down", "Right", "Right", "Up"]
    runs = []
    for sample in (0, 0, 3):
        env = make()
        obs, info = env.reset(seed=42, options={"sample": sample})
        runs.append([(obs, info["optimal_length"])] + [env.step(a)[:4] for a in actions])
    assert runs[0] == runs[1] == runs[2]  # Sokoban has no per-step noise: samples agree too
    puzzles = {make().reset(seed=s)[0] for s in range(30)}
    assert len(puzzles) >= 25


def test_solver_hand_puzzles() -> None:
    assert solve(SokobanState.from_text(CORRIDOR)) == ["Right", "Right", "Right"]
    assert solve(SokobanState.from_text(DROP)) == ["Left", "Down"]
    # the depth bound is exact: 3 moves are needed, 2 are not enough
    assert solve(SokobanState.from_text(CORRIDOR), max_depth=2) is None
    assert solve(SokobanState.from_text(CORRIDOR), max_depth=3) == ["Right", "Right", "Right"]
    # a box in a corner that is not a target can never move again
    assert solve(SokobanState.from_text("#####\n#X_P#\n#__O#\n#####")) is None
    # already solved
    assert solve(SokobanState.from_text("####\n#P√#\n####")) == []
    # one corridor, two boxes: the stray box at (1,5) needs the player at (1,4), but the way there
    # pushes the box on (1,2) along until it jams against the stray box (no pulls): unsolvable
    assert solve(SokobanState.from_text(TWO_BOXES)) is None


def test_solver_is_optimal_against_brute_force() -> None:
    # every sequence shorter than the solver's answer fails: enumerate all 4^k of them
    checked = 0
    for seed in range(40):
        state, solution = generate_puzzle(np.random.default_rng(seed), max_optimal_length=6)
        assert play(state, solution).solved
        for k in range(len(solution)):
            assert not any(play(state, list(seq)).solved for seq in itertools.product(ACTIONS, repeat=k))
        checked += 1
    assert checked == 40


def test_generated_puzzles_fit_the_budget() -> None:
    rng = np.random.default_rng(7)
    start = time.perf_counter()
    lengths = []
    for _ in range(100):
        state, solution = generate_puzzle(rng)
        assert state.boxes_on_target == 0 and len(state.boxes) == 1
        assert 1 <= len(solution) <= 10 and solve(state) == solution
        lengths.append(len(solution))
    # typical generation is a few ms; 50 ms each leaves room for a loaded machine
    assert time.perf_counter() - start < 5.0
    assert len(set(lengths)) >= 5  # a spread of difficulties, not one template
    state, solution = generate_puzzle(np.random.default_rng(0), min_optimal_length=6, max_optimal_length=8)
    assert 6 <= len(solution) <= 8


def test_oracle_solves_in_optimal_length_with_exact_return() -> None:
    for seed in range(20):
        env = make()
        _, info = env.reset(seed=seed)
        length, total, steps = info["optimal_length"], 0.0, 0
        while (action := env.oracle_action()) is not None:
            _, reward, terminated, _, info = env.step(action)
            total, steps = total + reward, steps + 1
        # one box, pushed onto its target only at the last step: 11 − 0.1 per action
        assert terminated and info["success"] and steps == length
        assert total == pytest.approx(11.0 - 0.1 * length)


def test_8x8_config_puzzles_solve_within_10() -> None:
    cfg = env_conf("sokoban_8x8")
    env = ragen2_envs.make(cfg.id, **OmegaConf.to_container(cfg.kwargs))
    for seed in range(5):
        obs, reset_info = env.reset(seed=seed)
        assert len(obs.splitlines()) == 8 and obs.count("X") == 2 and obs.count("O") + obs.count("S") == 2
        steps = 0
        while (action := env.oracle_action()) is not None:
            *_, info = env.step(action)
            steps += 1
        assert info["success"] and steps == reset_info["optimal_length"] <= 10


def test_config_defaults_match_the_paper() -> None:
    cfg = env_conf("sokoban")
    assert (cfg.max_turns, cfg.max_actions_per_turn) == (5, 2)
    assert (SokobanEnv.default_max_turns, SokobanEnv.default_max_actions_per_turn) == (5, 2)
    env = ragen2_envs.make(cfg.id, **OmegaConf.to_container(cfg.kwargs))
    obs, info = env.reset(seed=0)
    assert info["optimal_length"] <= cfg.max_turns * cfg.max_actions_per_turn
    assert len(obs.splitlines()) == 6


def test_observation_formats() -> None:
    env = on_board(DROP, observation="coord")
    assert env.render_state() == (
        "Board size: 5 rows x 5 cols (zero-indexed).\n"
        "Walls: (0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 0), (1, 4), (2, 0), (2, 4), (3, 0), (3, 4), "
        "(4, 0), (4, 1), (4, 2), (4, 3), (4, 4)\n"
        "Targets: (3, 2)\n"
        "Boxes: (2, 2)\n"
        "Player: (1, 3)"
    )
    env.observation = "grid_coord"
    assert env.render_state().endswith("Grid Map:\n#####\n#__P#\n#_X_#\n#_O_#\n#####")
    env.observation = "grid"
    env.step("Left")
    env.step("Down")  # box onto target, player now at (2,2)
    assert env.render_state() == "#####\n#___#\n#_P_#\n#_√_#\n#####"


def test_instructions_name_symbols_and_actions() -> None:
    text = make().instructions
    for needle in ["#: wall", "_: empty floor", "O: target", "X: box", "√: box on target", "P: player"]:
        assert needle in text
    assert "S: player on target" in text and "Up, Down, Left, Right" in text


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"dim_room": [6]}, "dim_room"),
        ({"num_boxes": 0}, "num_boxes"),
        ({"observation": "pixels"}, "observation"),
        ({"max_optimal_length": 0}, "max_optimal_length"),
        ({"max_steps": 0}, "max_steps"),
        ({"p_change_directions": 1.5}, "p_change_directions"),
        ({"num_gen_steps": 0}, "num_gen_steps"),
    ],
)
def test_bad_knobs_raise_naming_the_key(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        SokobanEnv(**kwargs)  # type: ignore[arg-type]


def test_impossible_generation_budget_raises_clearly() -> None:
    # 2 boxes cannot be solved in 1 action from a state with both boxes off target
    env = make(num_boxes=2, max_optimal_length=1, max_gen_tries=20)
    with pytest.raises(RuntimeError, match="max_optimal_length"):
        env.reset(seed=0)
