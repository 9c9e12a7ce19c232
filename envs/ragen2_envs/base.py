"""The contract every ragen2 text environment follows (docs/method.md §7).

An observation is text; an action is the text of ONE action (the agent splits a turn's answer on
``||`` and calls :meth:`TextEnv.step` once per action). The environment owns its action vocabulary:
text it cannot parse changes nothing, earns reward 0 and sets ``info["action_is_valid"] = False``.
``step`` never raises on model output: the format penalty is the agent's, not the environment's.

Seeding has two parts so that a *group* (K rollouts of one prompt) sees one identical instance
while stochastic dynamics stay independent across its rollouts:

* ``reset(seed=s)`` makes the instance (map, puzzle, question) from ``self.np_random`` only, so the
  same ``s`` gives the same first observation, byte for byte.
* ``reset(seed=s, options={"sample": k})`` seeds ``self.dynamics_rng`` from ``(s, k)``; slips,
  payouts and other per-step noise draw from it. ``sample`` defaults to 0.

An env may also act through tools (``tool_names``: methods the agent calls with JSON arguments); a tool that
moves the env returns an ``EnvStep`` instead of text.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ragen2_envs.options import check_bounds

# Printable ASCII plus the symbols our renderers use; Text spaces reject characters outside their charset.
CHARSET = frozenset(string.printable) | frozenset("√·×÷−…–—’“”°")
MAX_TEXT = 65_536


@dataclass(frozen=True)
class EnvStep:
    """What an env's tool that moves the env returns (``tool_names``, ragen2's ``env.tools``): the tool message's
    text and the step, as ``step`` gives it (``info["success"]`` marks a success, as for a text action)."""

    content: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.terminated or self.truncated


@functools.cache
def text_space(max_length: int = MAX_TEXT) -> spaces.Text:
    """The text space of every observation and action (one object: building its charset per env cost more
    than a small model's sampling)."""
    return spaces.Text(min_length=0, max_length=max_length, charset=CHARSET)


class TextEnv(gym.Env[str, str]):
    """Base class: subclasses implement ``_reset``, ``_step``, ``render_state`` and ``instructions``.

    A subclass declares its options in its ``__init__``'s signature (``ragen2_envs.options``): every
    construction is checked against their bounds before ``__init__`` runs."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}
    #: default agent settings for this env (a conf/env yaml may override them)
    default_max_turns: ClassVar[int] = 5
    default_max_actions_per_turn: ClassVar[int] = 2

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        check_bounds(cls, args, kwargs)
        return super().__new__(cls)

    def __init__(self, render_mode: str | None = "ansi") -> None:
        super().__init__()
        self.render_mode = render_mode
        self.observation_space = text_space()
        self.action_space = text_space()
        self._dynamics_seed: int | list[int] = 0
        self._dynamics_rng: np.random.Generator | None = None

    @property
    def dynamics_rng(self) -> np.random.Generator:
        """The episode's per-step noise, seeded from ``(seed, sample)``; made when first drawn from (an env
        without noise never makes it: the organism made 128 an iteration for nothing)."""
        if self._dynamics_rng is None:
            self._dynamics_rng = np.random.default_rng(self._dynamics_seed)
        return self._dynamics_rng

    @dynamics_rng.setter
    def dynamics_rng(self, rng: np.random.Generator) -> None:
        self._dynamics_rng = rng

    # ---- what subclasses implement -------------------------------------------------------
    @property
    def instructions(self) -> str:
        """Task description, symbol legend and action list: the agent puts it in the system prompt."""
        raise NotImplementedError

    def render_state(self) -> str:
        """The current observation as text."""
        raise NotImplementedError

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        """Build the instance from ``self.np_random``; return the reset ``info``."""
        raise NotImplementedError

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        """Apply one action's text: (reward, terminated, truncated, info with action_is_valid, success)."""
        raise NotImplementedError

    def reasoning_grammar(self) -> tuple[str, ...] | None:
        """Every reasoning this env accepts, when it holds the reasoning to a finite grammar (None: any text).

        The agent counts a turn whose reasoning (whitespace runs read as one space, the ends stripped) is not
        one of these as a format failure, and the MI pass enumerates them for the exact I(X;Z)
        (``diag/exact/*``).
        """
        return None

    def example_action(self) -> str | None:
        """A fixed action in this env's syntax for the prompt's example reply (never a state-dependent hint).

        Small models copy placeholders such as "your action" literally; a concrete example fixes that.
        """
        return None

    def oracle_action(self) -> str | None:
        """A known-good next action for the current state (a solver's move, the answer), if any."""
        return None

    def oracle_reasoning(self, actions: Sequence[str]) -> str | None:
        """Why the solver's next ``actions`` (``oracle_action`` and the ones after it) fit the current state,
        in words that read the observation (where the player and the goal are, the numbers and the target).

        The warm start's demonstrations reason this way (``ragen2-warmstart``); None where the env has no
        such reasoning, which the warm start refuses.
        """
        return None

    # ---- gymnasium API -------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        sample = int(options.get("sample", 0))
        base = int(self.np_random.integers(0, 2**63 - 1)) if seed is None else int(seed)
        self._dynamics_seed, self._dynamics_rng = [base, sample], None
        info = self._reset(options)
        info.setdefault("action_is_valid", True)
        info.setdefault("success", False)
        return self.render_state(), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        text = action if isinstance(action, str) else str(action)
        reward, terminated, truncated, info = self._step(text.strip())
        info.setdefault("action_is_valid", True)
        info.setdefault("success", False)
        return self.render_state(), float(reward), bool(terminated), bool(truncated), info

    def render(self) -> str:
        return self.render_state()
