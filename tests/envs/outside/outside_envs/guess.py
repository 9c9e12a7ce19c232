"""Guess the number: a secret whole number from 1 to ``high``; each wrong guess is told "higher" or "lower"."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar

from ragen2_envs import TextEnv
from ragen2_envs.options import Range


class GuessEnv(TextEnv):
    """One guess per turn; 1 for the secret (the episode ends), 0 for another number, invalid for other text."""

    default_max_turns: ClassVar[int] = 5  # binary search needs at most 5 guesses below 32
    default_max_actions_per_turn: ClassVar[int] = 1

    def __init__(self, high: Annotated[int, Range(2, 31)] = 16, render_mode: str | None = "ansi") -> None:
        super().__init__(render_mode=render_mode)
        self.high = high
        self.low, self.top, self.secret, self.said = 1, high, 1, ""

    @property
    def instructions(self) -> str:
        return (
            f"Guess the secret whole number from 1 to {self.high}. After a wrong guess you are told whether "
            "the secret is higher or lower.\nAction: one whole number."
        )

    def render_state(self) -> str:
        return f"{self.said}The secret is from {self.low} to {self.top}. Your guess?"

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.secret = int(self.np_random.integers(1, self.high + 1))
        self.low, self.top, self.said = 1, self.high, ""
        return {}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        if not re.fullmatch(r"[0-9]{1,2}", action) or not self.low <= int(action) <= self.top:
            self.said = ""
            return 0.0, False, False, {"action_is_valid": False}
        guess = int(action)
        if guess == self.secret:
            self.said = f"{guess} is right. "
            return 1.0, True, False, {"success": True}
        if guess < self.secret:
            self.low, self.said = guess + 1, f"{guess} is too low. "
        else:
            self.top, self.said = guess - 1, f"{guess} is too high. "
        return 0.0, False, False, {}

    def example_action(self) -> str | None:
        return "3"

    def oracle_action(self) -> str | None:
        return str((self.low + self.top) // 2)

    def oracle_reasoning(self, actions: Sequence[str]) -> str | None:
        """Halving: the guess in the middle of what is left (a warm start can demonstrate it)."""
        return f"The secret is from {self.low} to {self.top}, so {actions[0]} halves it." if actions else None
