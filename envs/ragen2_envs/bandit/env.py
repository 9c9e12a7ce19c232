"""Two-armed bandit with meaningful arm names: a probe of risk preference (single turn).

The low-risk arm always pays ``low_payout`` (0.1); the high-risk arm pays ``high_payout`` (1.0) with
probability ``high_prob`` (0.25), else ``high_fail_payout`` (0.0): expected 0.25 vs 0.1 with the
defaults, as in the reference. The action is one arm's name, matched case-insensitively and
otherwise exactly (the reference's lookup: lower-cased name -> arm). One valid pull ends the episode.

Seeding departs from the reference on purpose: there, the arm names and their order come from a
per-instance seed offset, so the K rollouts of one group see different prompts. Here the pair and
its order are drawn from ``np_random`` (one seed, one prompt) and only the payout draws from
``dynamics_rng`` (independent across the rollouts of a group).

``info["arm"]`` is ``"low"`` or ``"high"``; ``success`` means the chosen arm has the strictly larger
expected payout (the high-risk arm with the defaults, the reference's definition).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar

from ragen2_envs.bandit.names import ARM_NAME_PAIRS
from ragen2_envs.base import TextEnv
from ragen2_envs.options import OneOf, Range


class BanditEnv(TextEnv):
    """Pull one of two named arms; the names hint at which arm is the gamble."""

    default_max_turns: ClassVar[int] = 1
    default_max_actions_per_turn: ClassVar[int] = 1

    def __init__(
        self,
        low_payout: float = 0.1,
        high_payout: float = 1.0,
        high_prob: Annotated[float, Range(0.0, 1.0)] = 0.25,
        high_fail_payout: float = 0.0,
        split: Annotated[str, OneOf(tuple(sorted(ARM_NAME_PAIRS)))] = "train",
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(render_mode=render_mode)
        self.low_payout = float(low_payout)
        self.high_payout = float(high_payout)
        self.high_prob = float(high_prob)
        self.high_fail_payout = float(high_fail_payout)
        self.split = split
        self.low_name, self.high_name = ARM_NAME_PAIRS[split][0]
        self.shown: tuple[str, str] = (self.low_name, self.high_name)
        self.result = ""
        self.done = False

    @property
    def instructions(self) -> str:
        return (
            "You are playing a bandit game. Goal: get as much reward as possible by choosing which arm "
            "to pull.\n"
            "Rules: there are 2 arms, each with its own reward distribution, related to its name. "
            "Think about what each name means to guess how its rewards behave, then pull the arm you "
            "expect to pay more on average.\n"
            "Action: the name of one arm, exactly as written (case does not matter). You pull once."
        )

    def render_state(self) -> str:
        if self.result:
            return self.result
        first, second = self.shown
        return f"The 2 arms are {first} and {second}. Which arm do you pull: {first} or {second}?"

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        pairs = ARM_NAME_PAIRS[self.split]
        self.low_name, self.high_name = pairs[int(self.np_random.integers(len(pairs)))]
        low_first = bool(self.np_random.random() < 0.5)
        self.shown = (self.low_name, self.high_name) if low_first else (self.high_name, self.low_name)
        self.result = ""
        self.done = False
        return {"arms": list(self.shown)}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        if self.done:
            return 0.0, True, False, {"action_is_valid": False, "success": False}
        choice = action.strip().lower()
        if choice == self.low_name.lower():
            arm, name, payout = "low", self.low_name, self.low_payout
        elif choice == self.high_name.lower():
            won = bool(self.dynamics_rng.random() < self.high_prob)
            arm, name = "high", self.high_name
            payout = self.high_payout if won else self.high_fail_payout
        else:
            return 0.0, False, False, {"action_is_valid": False, "success": False}
        self.result = f"{name}: {payout:g} points"
        self.done = True
        return payout, True, False, {"action_is_valid": True, "success": self._is_better(arm), "arm": arm}

    def _is_better(self, arm: str) -> bool:
        high_mean = self.high_prob * self.high_payout + (1.0 - self.high_prob) * self.high_fail_payout
        return high_mean > self.low_payout if arm == "high" else self.low_payout > high_mean

    def oracle_action(self) -> str | None:
        if self.done:
            return None
        return self.low_name if self._is_better("low") else self.high_name

    def oracle_reasoning(self, actions: Sequence[str]) -> str | None:
        """Both arms' names as shown, then which one pays more on average and why (it is the safer or the
        riskier of the two)."""
        if not actions:
            return None
        first, second = self.shown
        kind = "riskier" if actions[0].lower() == self.high_name.lower() else "safer"
        return f"The arms are {first} and {second}. {actions[0]} is the {kind} arm and pays more on average."
