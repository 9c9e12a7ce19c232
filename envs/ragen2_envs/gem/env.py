"""GEM's environments (``gem-llm``: ``gem.make(id)``, ``reset(seed)``, ``step(text)``) as ragen2 environments.

GEM's games are multi-turn: each turn the policy answers with one action and GEM replies with what it did; the
observation is GEM's latest text followed by its ``info["suffix"]`` (the board, the prompt for the next move),
as GEM's own observation wrappers show it. GEM reads an action inside ``\\boxed{…}``: the adapter puts the
agent's ``<answer>`` in the box, unless the answer has one already.

Where it departs from GEM (so that K rollouts of a group and ragen2's contract hold):

* GEM's games draw from Python's and numpy's global generators, and ``reset(seed)`` reseeds both. The adapter
  runs every GEM call on a generator state of its own and puts the process's back afterwards: the instance
  comes from ``np_random`` (GEM's reset seed is drawn from it), later draws (2048's new tiles) from
  ``dynamics_rng``, and nothing else in the process sees its generators move.
* GEM ends an episode on an action it cannot parse, with its format-error reward (-0.1). Here such a turn
  changes nothing (the game is restored from a copy taken before it), earns 0 and is an invalid action: the
  agent's format penalty replaces GEM's.
* GEM has no success flag. ``success`` is set when the game terminates (not truncates) with GEM's rewards of
  the episode summing to at least ``success_return`` (GuessTheNumber pays 1 once; Mastermind pays the share
  of new black pegs each turn, 1 in all).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import random
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import numpy as np

from ragen2_envs.adapters import AnyText, bounded, finite, require
from ragen2_envs.base import TextEnv
from ragen2_envs.options import Named, Range

#: the id as conf/env/gem.yaml names it (importing ragen2_envs.gem registers it)
ENV_ID = "ragen2_envs.gem:ragen2/GEM-v0"


def _import_gem() -> Any:
    """``gem``, imported without its ``logging.basicConfig(level=INFO)`` taking over the root logger."""
    root = logging.getLogger()
    guard = logging.NullHandler()  # basicConfig does nothing while the root logger has a handler
    root.addHandler(guard)
    try:
        # gem-llm's own pins (reasoning-gym 0.1.23; antlr4 4.13, which breaks Hydra) are not ours: no deps
        return require("gem", ENV_ID, "pip install --no-deps gem-llm==0.1.0")
    finally:
        root.removeHandler(guard)


gem = _import_gem()
REGISTRY: Mapping[str, Any] = gem.envs.registration.ENV_REGISTRY
FORMAT_ERROR_REWARD: float = importlib.import_module(
    "gem.utils.constants"
).LanguageGameReward.format_error_reward
#: GEM 0.1.0's games that run offline and were tried here (Wordle, Hangman and WordSearch download NLTK's
#: word list at first use; math:, code: and qa: ids load hub datasets)
OFFLINE = (
    "game:GuessTheNumber-v0-easy",
    "game:GuessTheNumber-v0-hard",
    "game:Mastermind-v0-easy",
    "game:Minesweeper-v0-easy",
    "game:TowerofHanoi-v0-easy",
    "game:Sudoku-v0-easy",
    "game:Game2048-v0-easy",
    "game:FifteenPuzzle-v0-easy",
)
#: a known-good next action for the games whose state shows one (the secret): class name -> reader
ORACLES: Mapping[str, Callable[[Any], str]] = {
    "GuessTheNumberEnv": lambda game: str(game.game_number),
    "MastermindEnv": lambda game: " ".join(map(str, game.game_code)),
}


#: an id in GEM's registry
GEM_ID = Named(
    REGISTRY, "a GEM environment", f"offline ones: {', '.join(OFFLINE[:4])}; gem.print_envs() lists all"
)


@dataclass
class _Generators:
    """The state of Python's and numpy's global generators that one GEM game owns between its calls."""

    python: Any
    numpy: Any

    @classmethod
    def seeded(cls, seed: int) -> _Generators:
        return cls(random.Random(seed).getstate(), np.random.RandomState(seed).get_state())


@contextlib.contextmanager
def _owned(generators: _Generators) -> Iterator[None]:
    """Run GEM code on ``generators`` and give the process its own global generators back afterwards.

    Calls into an env come one at a time (agent/timeout.py), so swapping the globals is safe."""
    outside = random.getstate(), np.random.get_state()
    random.setstate(generators.python)
    np.random.set_state(generators.numpy)
    try:
        yield
    finally:
        generators.python, generators.numpy = random.getstate(), np.random.get_state()
        random.setstate(outside[0])
        np.random.set_state(outside[1])


class GemEnv(TextEnv):
    """One GEM environment, by its id in GEM's registry (``gem_id``)."""

    # GEM truncates at each game's own limit; 10 covers the easy games (GuessTheNumber easy 4, TowerofHanoi
    # easy 10) and env.max_turns sets another
    default_max_turns: ClassVar[int] = 10
    default_max_actions_per_turn: ClassVar[int] = 1

    def __init__(
        self,
        gem_id: Annotated[str, GEM_ID] = "game:GuessTheNumber-v0-easy",
        gem_kwargs: dict[str, Any] | None = None,
        success_return: Annotated[float, Range(0.0, low_open=True)] = 1.0,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(render_mode=render_mode)
        self.observation_space = AnyText()
        self.action_space = AnyText()
        self.gem_id = gem_id
        self.success_return = float(success_return)
        self.generators = _Generators.seeded(0)
        try:
            with _owned(self.generators):  # GEM's constructors reset once, unseeded
                self.game = gem.make(gem_id, **(gem_kwargs or {}))
        except Exception as err:  # a game that needs a download, or kwargs it refuses
            said = " ".join(re.sub(r"\x1b\[[0-9;]*m|\*", "", str(err)).split())[:160]
            raise ValueError(
                f"gem_id={gem_id!r} with gem_kwargs={gem_kwargs or {}} does not start here "
                f"({type(err).__name__}: {said}); offline games: {', '.join(OFFLINE)}"
            ) from None
        self.text, self.earned, self.over = "", 0.0, False

    @property
    def instructions(self) -> str:
        return (
            "You are playing a text game. Its rules come in the first message. Each turn, give one move as "
            "your action, written as the rules say to put it inside \\boxed{}: the box is added for you."
        )

    def render_state(self) -> str:
        return bounded(self.text)[0]

    def _show(self, text: object, info: Mapping[str, Any]) -> None:
        """GEM's text as its observation wrappers join it: prefix, the text on lines of its own, suffix."""
        body, suffix = str(text), str(info.get("suffix", ""))
        if body and suffix and not body.endswith("\n"):
            body += "\n"
        self.text = f"{info.get('prefix', '')}{body}{suffix}"

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        seed = int(self.np_random.integers(2**31))
        with _owned(self.generators):
            text, info = self.game.reset(seed=seed)
        # the instance is drawn; what GEM draws from here on is the rollout's own noise
        self.generators = _Generators.seeded(int(self.dynamics_rng.integers(2**31)))
        self._show(text, info)
        self.earned, self.over = 0.0, False
        return {"gem_id": self.gem_id, "observation_cut": bounded(self.text)[1]}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        if self.over or not action:
            return 0.0, False, False, {"action_is_valid": False}
        boxed = action if "\\boxed{" in action else f"\\boxed{{{action}}}"
        before = copy.deepcopy((self.game, self.generators))
        try:
            with _owned(self.generators):
                text, reward, terminated, truncated, info = self.game.step(boxed)
        except Exception:  # GEM code on arbitrary model text: an invalid action, never a crash
            self.game, self.generators = before
            return 0.0, False, False, {"action_is_valid": False, "gem_error": True}
        reward, is_finite = finite(reward)
        if terminated and reward == FORMAT_ERROR_REWARD:
            self.game, self.generators = before
            return 0.0, False, False, {"action_is_valid": False}
        self._show(text, info if isinstance(info, Mapping) else {})
        self.earned += reward
        self.over = bool(terminated or truncated)
        success = bool(terminated) and not truncated and self.earned >= self.success_return
        return (
            reward,
            bool(terminated),
            bool(truncated),
            {"success": success, "reward_invalid": not is_finite},
        )

    def oracle_action(self) -> str | None:
        read = ORACLES.get(type(self.game).__name__)
        return None if read is None or self.over else read(self.game)
