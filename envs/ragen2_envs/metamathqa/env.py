"""MetaMathQA: answer a math word problem; several attempts, each worth half the one before.

The action is the final answer only (``18``, ``3/4``, ``\\frac{3}{4}``, ``$12.50``...), compared with
:func:`answers_match` (the reference compares lower-cased, whitespace-free strings; we also equate
numerically equal forms). A correct answer on attempt ``k`` (0-based) earns ``1 / 2**k`` and ends
the episode with ``success``; a wrong one earns 0, says "Incorrect" and the episode goes on until
``max_attempts`` answers were given (then ``terminated`` without success). An empty answer, or one
longer than :data:`MAX_ANSWER_CHARS`, is not an answer: ``action_is_valid=False``, no attempt used.

``max_attempts`` defaults to 5 (one answer per turn over the paper's 5 turns): the paper lists
MetaMathQA as multi-turn with a dense reward, which is this halving schedule. The reference's
shipped config caps the trajectory at one action (``max_actions_per_traj: 1``); ``max_attempts: 1``
reproduces that.

Questions come from the built-in generator (default) or a MetaMathQA file (``data_path``), split
into train/test by hashing (see :mod:`ragen2_envs.metamathqa.generator` and ``data``).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from ragen2_envs.base import TextEnv
from ragen2_envs.metamathqa.answers import answers_match
from ragen2_envs.metamathqa.data import load_problems
from ragen2_envs.metamathqa.generator import MathProblem, generate_problem
from ragen2_envs.metamathqa.split import SPLITS
from ragen2_envs.options import OneOf, Range

#: a final answer is short; anything longer is a malformed action, and this bounds matching work
MAX_ANSWER_CHARS = 500


class MetaMathQAEnv(TextEnv):
    """Question -> final answer, up to ``max_attempts`` tries with rewards 1, 1/2, 1/4, ..."""

    default_max_turns: ClassVar[int] = 5
    default_max_actions_per_turn: ClassVar[int] = 1

    def __init__(
        self,
        data_path: str | None = None,
        split: Annotated[str, OneOf(SPLITS)] = "train",
        test_fraction: Annotated[
            float, Range(0.0, 1.0, low_open=True, high_open=True)
        ] = 0.1,  # both hold some
        max_attempts: Annotated[int, Range(1)] = 5,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(render_mode=render_mode)
        self.split = split
        self.test_fraction = float(test_fraction)
        self.max_attempts = int(max_attempts)
        self.data = load_problems(data_path, split, self.test_fraction) if data_path is not None else None
        self.problem = MathProblem(question="", answer="", template="", topic="", key="")
        self.attempts = 0
        self.feedback = ""
        self.done = False

    @property
    def instructions(self) -> str:
        return (
            "You are solving math word problems. Read the question, work it out, and give only the "
            "final answer as your action: a number (like 18, 37.5 or 3/4), without units or words.\n"
            f"You have {self.max_attempts} attempt(s). A correct first answer earns 1, and each "
            "later attempt earns half as much as the one before; a wrong answer earns 0."
        )

    def render_state(self) -> str:
        return self.feedback or self.problem.question

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        if self.data is None:
            self.problem = generate_problem(self.np_random, self.split, self.test_fraction)
        else:
            self.problem = self.data[int(self.np_random.integers(len(self.data)))]
        self.attempts = 0
        self.feedback = ""
        self.done = False
        return {"template": self.problem.template, "topic": self.problem.topic, "answer": self.problem.answer}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        if self.done or not action.strip() or len(action) > MAX_ANSWER_CHARS:
            return 0.0, self.done, False, {"action_is_valid": False, "success": False}
        attempt = self.attempts
        self.attempts += 1
        info: dict[str, Any] = {"action_is_valid": True, "attempt": attempt}
        if answers_match(action, self.problem.answer):
            self.feedback = "Correct!"
            self.done = True
            return 1.0 / 2**attempt, True, False, {**info, "success": True}
        left = self.max_attempts - self.attempts
        self.done = left == 0
        self.feedback = (
            "Incorrect. No attempts left."
            if self.done
            else f"Incorrect. Please think again. Attempts left: {left}."
        )
        return 0.0, self.done, False, {**info, "success": False}

    def example_action(self) -> str:
        return "42"

    def oracle_action(self) -> str | None:
        return None if self.done else self.problem.answer
