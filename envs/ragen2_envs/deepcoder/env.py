"""DeepCoder: write a Python program for a problem; reward = fraction of hidden tests passed.

The action is the code (optionally in a ```python fence; the last fenced block is taken). Code
that is empty or does not compile is an invalid action: nothing runs, nothing changes, reward 0.
Valid code runs once per test in the sandbox (:mod:`ragen2_envs.deepcoder.sandbox`).

Single attempt by default, as in the reference. With ``max_attempts > 1`` a failed attempt shows
the first failing test in the next observation, and each attempt is rewarded by its improvement
over the best fraction so far, so the episode return is the best fraction reached (never more
than 1 however many attempts). Unlike the reference (binary reward, unsandboxed
``subprocess``), the reward is the fraction of tests passed and every run is isolated.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, ClassVar

from gymnasium import spaces

from ragen2_envs.base import CHARSET, MAX_TEXT, TextEnv
from ragen2_envs.deepcoder.grader import extract_code, grade, syntax_error
from ragen2_envs.deepcoder.loader import problems_for
from ragen2_envs.deepcoder.problems import SPLITS, Problem
from ragen2_envs.deepcoder.sandbox import SandboxLimits, check_interpreter, require_isolation
from ragen2_envs.options import OneOf, Range

MAX_CODE_CHARS = 32_768
FEEDBACK_CHARS = 2_000


class DeepCoderEnv(TextEnv):
    """Programming problems graded by running the submitted program on their tests."""

    default_max_turns: ClassVar[int] = 1
    default_max_actions_per_turn: ClassVar[int] = 1

    def __init__(
        self,
        data_path: str | Path | None = None,
        split: Annotated[str, OneOf(SPLITS)] = "train",
        timeout_s: Annotated[float, Range(0.0, low_open=True)] = 4.0,
        memory_mb: Annotated[int, Range(64)] = 512,  # enough to start Python
        max_tests: Annotated[int | None, Range(1)] = None,  # None: all tests
        max_attempts: Annotated[int, Range(1)] = 1,
        allow_unisolated: bool = False,
        python: str | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(render_mode=render_mode)
        self.limits = SandboxLimits(timeout_s=float(timeout_s), memory_mb=memory_mb)
        self.max_attempts = max_attempts
        self.allow_unisolated = allow_unisolated
        self.python = python
        if python is not None:  # a path that is no interpreter: refused here, not at the first program run
            check_interpreter(python)
        # says at start-up, not at the first step, when untrusted code cannot be isolated here
        self.isolated = require_isolation(allow_unisolated)
        problems = problems_for(data_path, split)
        if max_tests is not None:
            problems = [dataclasses.replace(p, tests=p.tests[:max_tests]) for p in problems]
        self.problems: list[Problem] = problems
        # statements may use symbols beyond the shared charset; program output is escaped instead
        self.charset = frozenset(CHARSET).union(*(p.statement for p in problems))
        self.observation_space = spaces.Text(min_length=0, max_length=MAX_TEXT, charset=self.charset)
        self.problem: Problem = problems[0]
        self.attempts = 0
        self.best = 0.0
        self.feedback = ""
        self.done = False

    @property
    def instructions(self) -> str:
        return (
            "You solve programming problems in Python 3 (standard library only). Answer with one "
            "complete program in a ```python fenced code block. It runs on hidden tests, each with a "
            f"{self.limits.timeout_s:g} s time limit and {self.limits.memory_mb} MB of memory, without "
            "network access. Unless the problem asks for a function, read the input from standard "
            "input and print the answer to standard output, exactly in the format asked. The reward "
            "is the fraction of tests your program passes."
        )

    def render_state(self) -> str:
        p = self.problem
        if p.fn_name is None:
            how = "Read from standard input and write to standard output."
        else:
            how = f"Define `{p.fn_name}` (a function, or a method of class Solution); it is called with the test arguments."
        parts = [f"Problem:\n{p.statement}", how]
        if self.feedback:
            left = self.max_attempts - self.attempts
            parts.append(f"Your previous attempt failed. {self.feedback}\nAttempts left: {left}.")
        return "\n\n".join(parts)[:MAX_TEXT]

    def oracle_action(self) -> str | None:
        ref = self.problem.reference
        return None if ref is None else f"```python\n{ref.rstrip()}\n```"

    def _escape(self, text: str) -> str:
        """Keep the observation inside its charset: escape what a program printed beyond it."""
        out = (c if c in self.charset else c.encode("unicode_escape").decode("ascii") for c in text)
        return "".join(out)[:FEEDBACK_CHARS]

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        if "index" in options:
            index = options["index"]
            if not isinstance(index, int) or not 0 <= index < len(self.problems):
                raise ValueError(f"options['index']={index!r} must be an int in [0, {len(self.problems)})")
        else:
            index = int(self.np_random.integers(len(self.problems)))
        self.problem = self.problems[index]
        self.attempts = 0
        self.best = 0.0
        self.feedback = ""
        self.done = False
        return {"problem_id": self.problem.id, "num_tests": len(self.problem.tests)}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        if self.done:
            return 0.0, True, False, {"action_is_valid": False, "error": "episode is over; call reset()"}
        code = extract_code(action)
        error = None
        if not code.strip():
            error = "no code found"
        elif len(code) > MAX_CODE_CHARS:
            error = f"code is {len(code)} characters; the limit is {MAX_CODE_CHARS}"
        else:
            error = syntax_error(code)
        if error is not None:
            return 0.0, False, False, {"action_is_valid": False, "error": error}
        result = grade(
            self.problem, code, self.limits, python=self.python, allow_unisolated=self.allow_unisolated
        )
        self.attempts += 1
        reward = max(0.0, result.fraction - self.best)
        self.best = max(self.best, result.fraction)
        success = result.passed == result.total
        self.done = success or self.attempts >= self.max_attempts
        self.feedback = "" if self.done else self._escape(result.feedback)
        info = {
            "action_is_valid": True,
            "success": success,
            "passed": result.passed,
            "total": result.total,
            "attempts": self.attempts,
            "feedback": result.feedback,
        }
        return reward, self.done, False, info
