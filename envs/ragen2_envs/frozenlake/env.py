"""FrozenLake as a text environment (``ragen2/FrozenLake-v0``), symbols as the reference."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar

import numpy as np

from ragen2_envs.base import TextEnv
from ragen2_envs.frozenlake.generator import generate_random_map
from ragen2_envs.frozenlake.solver import (
    ACTIONS,
    explain,
    move,
    optimal_policy,
    reach_probabilities,
    shortest_path,
    slip_direction,
)
from ragen2_envs.options import OneOf, Range

OBSERVATIONS = ("grid", "coord", "grid_coord")
PLAYER, FROZEN, HOLE, GOAL, PLAYER_IN_HOLE, PLAYER_ON_GOAL = "P", "_", "O", "G", "X", "√"
LEGEND: dict[str, str] = {
    PLAYER: "player",
    FROZEN: "frozen ice (safe)",
    HOLE: "hole",
    GOAL: "goal",
    PLAYER_IN_HOLE: "player fell into a hole",
    PLAYER_ON_GOAL: "player on the goal",
}
_TILE_SYMBOL = {"S": FROZEN, "F": FROZEN, "H": HOLE, "G": GOAL}
_ACTION_BY_TEXT = {name.lower(): index for index, name in enumerate(ACTIONS)}


class FrozenLakeEnv(TextEnv):
    """Walk from the start to the goal over ice without falling into a hole.

    With probability ``success_rate`` the intended move happens, otherwise one of the two
    perpendicular moves (each half of the rest); 1.0 is deterministic. Reaching the goal earns 1
    and terminates; a hole terminates with 0. A move off the map is valid and leaves the player in
    place. The episode is truncated after ``max_steps`` actions. Reset info carries the map's
    ``optimal_length`` (fewest moves) and ``optimal_success_prob`` (V* at the start); step info
    says whether the move ``slipped``.
    """

    default_max_turns: ClassVar[int] = 5
    default_max_actions_per_turn: ClassVar[int] = 2

    def __init__(
        self,
        size: Annotated[int, Range(2)] = 4,
        p: Annotated[float, Range(0.0, 1.0, low_open=True)] = 0.9,  # a tile is frozen
        success_rate: Annotated[float, Range(0.0, 1.0)] = 0.8,  # 1.0: not slippery
        max_steps: Annotated[int, Range(1)] = 100,
        observation: Annotated[str, OneOf(OBSERVATIONS)] = "grid",
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(render_mode=render_mode)
        self.size = size
        self.p = p
        self.success_rate = success_rate
        self.max_steps = max_steps
        self.observation = observation
        self.desc: tuple[str, ...] = ()
        self.pos: tuple[int, int] = (0, 0)
        self.num_env_steps = 0
        self._policy: np.ndarray | None = None

    @property
    def instructions(self) -> str:
        legend = "\n".join(f"{symbol}: {meaning}" for symbol, meaning in LEGEND.items())
        coordinates = (
            ""
            if self.observation == "grid"
            else "Coordinates are (row, column), zero-indexed from the top-left.\n"
        )
        slippery = (
            " The ice is slippery: a move may take you in a direction perpendicular to the one you chose."
            if self.success_rate < 1.0
            else ""
        )
        return (
            "You are solving the FrozenLake puzzle. Avoid the holes and walk to the goal; falling into "
            f"a hole ends the game. Moving off the edge leaves you in place.{slippery}\n"
            f"Symbols:\n{legend}\n"
            f"{coordinates}"
            f"Actions: {', '.join(ACTIONS)}. Several actions are separated by ||, "
            "e.g. <answer>Left || Up</answer>."
        )

    @property
    def tile(self) -> str:
        return self.desc[self.pos[0]][self.pos[1]]

    def render_state(self) -> str:
        if not self.desc:
            raise RuntimeError("FrozenLakeEnv: call reset() before rendering or stepping")
        if self.observation == "grid":
            return self._grid()
        if self.observation == "coord":
            return self._coords()
        return f"Coordinates:\n{self._coords()}\nGrid Map:\n{self._grid()}"

    def _grid(self) -> str:
        rows = [[_TILE_SYMBOL[t] for t in row] for row in self.desc]
        rows[self.pos[0]][self.pos[1]] = {"H": PLAYER_IN_HOLE, "G": PLAYER_ON_GOAL}.get(self.tile, PLAYER)
        return "\n".join("".join(row) for row in rows)

    def _coords(self) -> str:
        """Entity coordinates, laid out as the reference's coordinate observation."""
        cells = {
            t: [(r, c) for r, row in enumerate(self.desc) for c, x in enumerate(row) if x == t] for t in "SGH"
        }
        player_label = {"G": "Player on goal", "H": "Player in hole"}.get(self.tile, "Player")
        groups = [
            ("Start", cells["S"]),
            ("Goal", cells["G"]),
            (player_label, [self.pos]),
            ("Holes", cells["H"]),
        ]
        lines = [f"Board size: {len(self.desc)} rows x {len(self.desc[0])} cols (zero-indexed)."]
        lines += [
            f"{label}: " + ", ".join(f"({r}, {c})" for r, c in found) for label, found in groups if found
        ]
        return "\n".join(lines)

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.desc = generate_random_map(self.np_random, self.size, self.p)
        start_row = next(r for r, row in enumerate(self.desc) if "S" in row)
        self.pos = (start_row, self.desc[start_row].index("S"))
        self.num_env_steps = 0
        self._policy = None
        path = shortest_path(self.desc, self.pos)
        assert path is not None  # the generator only returns maps with a path
        # V*(start) ignores the step budget: the maximal probability of ever reaching the goal
        success_prob = (
            1.0
            if self.success_rate == 1.0
            else float(reach_probabilities(self.desc, self.success_rate)[self.pos])
        )
        return {"optimal_length": len(path), "optimal_success_prob": success_prob}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        if not self.desc:
            raise RuntimeError("FrozenLakeEnv: call reset() before step()")
        intended = _ACTION_BY_TEXT.get(action.lower())
        over = self.tile in "HG" or self.num_env_steps >= self.max_steps
        info: dict[str, Any] = {"success": self.tile == "G", "slipped": False, "action_is_effective": False}
        if intended is None or over:
            # unknown text, or an episode already over: nothing changes and nothing is drawn
            info["action_is_valid"] = intended is not None
            return 0.0, self.tile in "HG", over and self.tile not in "HG", info
        # one uniform draw per valid action keeps dynamics streams aligned across success rates
        direction = slip_direction(intended, self.success_rate, float(self.dynamics_rng.random()))
        before = self.pos
        self.pos = move(self.desc, self.pos, direction)
        self.num_env_steps += 1
        terminated = self.tile in "HG"
        truncated = not terminated and self.num_env_steps >= self.max_steps
        info.update(
            action_is_valid=True,
            action_is_effective=self.pos != before,
            success=self.tile == "G",
            slipped=direction != intended,
        )
        return float(self.tile == "G"), terminated, truncated, info

    def example_action(self) -> str:
        return "Left"

    def oracle_action(self) -> str | None:
        """An optimal next move: BFS when deterministic, the value-iteration policy when slippery."""
        if not self.desc or self.tile in "HG" or self.num_env_steps >= self.max_steps:
            return None
        if self.success_rate == 1.0:
            path = shortest_path(self.desc, self.pos)
            return path[0] if path else None
        if self._policy is None:
            # solved once per map, on first use: rollouts that never ask for the oracle skip the cost
            self._policy, _ = optimal_policy(self.desc, self.success_rate)
        return ACTIONS[int(self._policy[self.pos])]

    def oracle_reasoning(self, actions: Sequence[str]) -> str | None:
        """The player's cell, the goal's and the solver's next moves (``solver.explain``)."""
        return explain(self.desc, self.pos, actions) if self.desc else None
