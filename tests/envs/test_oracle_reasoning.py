"""The solvers' reasoning (``env.oracle_reasoning``, the warm start's demonstrations) reads the observation:
hand-checked texts, then the cells, numbers and names it states against the ones the observation shows."""

from __future__ import annotations

import re

import pytest
import ragen2_envs
from ragen2_envs.countdown.expression import parse_expression

from .test_frozenlake import LAKE, on_map
from .test_sokoban import DROP, TWO_BOXES, on_board


def _cell(label: str, text: str) -> tuple[int, int]:
    r, c = re.search(rf"{label}:? \((\d+), (\d+)\)", text).groups()  # type: ignore[union-attr]
    return int(r), int(c)


def test_frozenlake_by_hand() -> None:
    env = on_map(
        LAKE, success_rate=1.0
    )  # S at (0, 0), G at (2, 2), the way round the holes: Down, Down, Right, Right
    assert env.oracle_action() == "Down"
    assert env.oracle_reasoning(["Down", "Down"]) == (
        "I am at (0, 0). The goal is at (2, 2). The safe way starts with Down then Down."
    )
    env.step("Down")
    assert env.oracle_reasoning(["Down"]) == (
        "I am at (1, 0). The goal is at (2, 2). The safe way starts with Down."
    )


@pytest.mark.parametrize("observation", ["grid", "coord"])
def test_frozenlake_names_the_cells_the_observation_shows(observation: str) -> None:
    env = ragen2_envs.make("ragen2/FrozenLake-v0", size=4, success_rate=1.0, observation=observation)
    for seed in range(30):
        obs, _ = env.reset(seed=seed)
        if observation == "grid":
            rows = obs.split("\n")
            player = next((r, row.index("P")) for r, row in enumerate(rows) if "P" in row)
            goal = next((r, row.index("G")) for r, row in enumerate(rows) if "G" in row)
        else:
            player, goal = _cell("Player", obs), _cell("Goal", obs)
        action = env.oracle_action()
        assert action is not None
        text = env.oracle_reasoning([action])
        assert text is not None
        assert (_cell("I am at", text), _cell("The goal is at", text)) == (player, goal)
        assert text.endswith(f"starts with {action}.")


def test_sokoban_by_hand() -> None:
    env = on_board(DROP)  # player (1, 3), box (2, 2), target (3, 2): Left, then push Down
    assert env.oracle_action() == "Left"
    assert env.oracle_reasoning(["Left", "Down"]) == (
        "I am at (1, 3). The box is at (2, 2); the target is at (3, 2). "
        "The shortest solution starts with Left then Down."
    )
    two = on_board(TWO_BOXES)
    assert two.oracle_reasoning(["Right"]) == (
        "I am at (1, 1). The boxes are at (1, 2), (1, 5); the targets are at (1, 2), (1, 6). "
        "The shortest solution starts with Right."
    )


def test_sokoban_names_the_cells_the_coordinates_show() -> None:
    env = ragen2_envs.make("ragen2/Sokoban-v0", observation="coord")
    for seed in range(5):
        obs, _ = env.reset(seed=seed)
        action = env.oracle_action()
        assert action is not None
        text = env.oracle_reasoning([action])
        assert text is not None and _cell("I am at", text) == _cell("Player", obs)
        assert re.search(r"Boxes: (\(\d+, \d+\))", obs).group(1) in text  # type: ignore[union-attr]
        assert re.search(r"Targets: (\(\d+, \d+\))", obs).group(1) in text  # type: ignore[union-attr]


def test_countdown_states_the_target_and_numbers_and_a_solution_that_hits_it() -> None:
    env = ragen2_envs.make("ragen2/Countdown-v0")
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        expression = env.oracle_action()
        assert expression is not None
        numbers = ", ".join(str(n) for n in info["numbers"])
        assert f"Target: {info['target']}\nNumbers: [{numbers}]" == obs
        assert env.oracle_reasoning([expression]) == (
            f"I need {info['target']} from {numbers}. {expression} = {info['target']}."
        )
        parsed = parse_expression(expression)
        assert parsed is not None and parsed.value == info["target"]


def test_bandit_names_both_arms_as_shown_and_the_better_one() -> None:
    env = ragen2_envs.make("ragen2/Bandit-v0")
    for seed in range(10):
        obs, info = env.reset(seed=seed)
        first, second = info["arms"]
        best = env.oracle_action()
        assert best == env.high_name  # 0.25 expected against 0.1 with the defaults
        assert f"The 2 arms are {first} and {second}." in obs
        assert env.oracle_reasoning([best]) == (
            f"The arms are {first} and {second}. {best} is the riskier arm and pays more on average."
        )
    safe = ragen2_envs.make("ragen2/Bandit-v0", low_payout=0.5)
    safe.reset(seed=0)
    assert safe.oracle_action() == safe.low_name
    assert "is the safer arm" in str(safe.oracle_reasoning([safe.low_name]))
