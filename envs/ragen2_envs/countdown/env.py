"""Countdown: combine the given numbers into an expression that equals the target (single turn).

Reward, following the reference's ``compute_score`` (score 1.0, format_score 0.1):

* ``score`` (1.0): the expression uses every given number exactly once (as a multiset) and its exact
  value equals the target. ``success`` is True.
* ``format_score`` (0.1): the expression uses every given number exactly once but its value is wrong
  (a division by zero counts as wrong). The reference gives 0.1 to any text whose digit runs match
  the numbers, even text that does not evaluate; we require a parsable expression.
* 0.0: a parsable expression over other numbers (one missing, one repeated, one invented). The
  action is still valid: it is a wrong answer, not a bad format.
* Not an expression (see :mod:`ragen2_envs.countdown.expression`; ``3*4-2 = 10`` is not one, and
  the reference's ``eval`` fails on it too): reward 0, ``action_is_valid=False``, nothing changes
  and the episode goes on.

Any valid answer ends the episode (``terminated``). Instances come from the built-in generator
(solvable by construction) or, with ``data_path``, from a Countdown-Tasks-3to4 file. Rows without an
exact solution are skipped at reset; the reference filters its data too, but keeps only rows
solvable with ``+`` and ``-`` alone, while we keep every row solvable with the four operators.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar

from ragen2_envs.base import TextEnv
from ragen2_envs.countdown.data import load_instances
from ragen2_envs.countdown.expression import parse_expression
from ragen2_envs.countdown.generator import CountdownInstance, generate_instance
from ragen2_envs.countdown.solver import explain, solve
from ragen2_envs.options import Range

#: redraws of a data row before giving up on finding a solvable one
MAX_ROW_DRAWS = 100


class CountdownEnv(TextEnv):
    """Target + 3–4 numbers -> one arithmetic expression (see the module docstring for rewards)."""

    default_max_turns: ClassVar[int] = 1
    default_max_actions_per_turn: ClassVar[int] = 1

    def __init__(
        self,
        data_path: str | None = None,
        min_numbers: Annotated[int, Range(1)] = 3,
        max_numbers: Annotated[int, Range(1)] = 4,
        max_number: Annotated[int, Range(1)] = 99,
        max_target: Annotated[int, Range(1)] = 100,
        ops: str = "+-*/",
        score: float = 1.0,
        format_score: float = 0.1,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(render_mode=render_mode)
        if min_numbers > max_numbers:
            raise ValueError(
                f"countdown min_numbers={min_numbers}, max_numbers={max_numbers}: need min_numbers <= max_numbers"
            )
        if not ops or set(ops) - set("+-*/") or len(set(ops)) != len(ops):
            raise ValueError(f"countdown ops={ops!r}: use distinct characters from '+-*/'")
        self.data = load_instances(data_path) if data_path is not None else None
        self.generator_kwargs = {
            "min_numbers": min_numbers,
            "max_numbers": max_numbers,
            "max_number": max_number,
            "max_target": max_target,
            "ops": ops,
        }
        self.score = float(score)
        self.format_score = float(format_score)
        self.instance = CountdownInstance(numbers=(), target=0)
        self.solution: str | None = None
        self.result = ""
        self.done = False
        # solutions of data rows already solved: reset must not pay for the search twice
        self._row_solutions: dict[int, str | None] = {}

    @property
    def instructions(self) -> str:
        return (
            "You are solving the Countdown puzzle. You get a target number and a list of numbers. "
            "Write one arithmetic expression that equals the target, using every number in the list "
            "exactly once. Allowed: the numbers, + - * /, and parentheses. Write only the expression, "
            "without '= target'.\n"
            "Example: target 4, numbers [3, 5, 2]: 2 + 5 - 3 = 7 - 3 = 4, so the action is 2 + 5 - 3.\n"
            f"Reward: {self.score:g} for a correct expression, {self.format_score:g} for one that uses "
            "each number once but misses the target, 0 otherwise."
        )

    def render_state(self) -> str:
        numbers = ", ".join(str(n) for n in self.instance.numbers)
        state = f"Target: {self.instance.target}\nNumbers: [{numbers}]"
        return f"{state}\n{self.result}" if self.result else state

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        if self.data is None:
            self.instance = generate_instance(self.np_random, **self.generator_kwargs)
            self.solution = self.instance.witness
        else:
            self.instance, self.solution = self._draw_solvable_row()
        self.result = ""
        self.done = False
        return {"target": self.instance.target, "numbers": list(self.instance.numbers)}

    def _draw_solvable_row(self) -> tuple[CountdownInstance, str]:
        assert self.data is not None
        for _ in range(MAX_ROW_DRAWS):
            index = int(self.np_random.integers(len(self.data)))
            row = self.data[index]
            if index not in self._row_solutions:
                self._row_solutions[index] = solve(row.numbers, row.target)
            solution = self._row_solutions[index]
            if solution is not None:
                return row, solution
        raise RuntimeError(
            f"countdown data ({len(self.data)} rows): no solvable row in {MAX_ROW_DRAWS} draws; "
            "check the file's 'target' and 'nums' columns"
        )

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        if self.done:
            return 0.0, True, False, {"action_is_valid": False, "success": False}
        expression = parse_expression(action)
        if expression is None:
            return 0.0, False, False, {"action_is_valid": False, "success": False}
        uses_numbers = sorted(expression.numbers) == sorted(self.instance.numbers)
        success = uses_numbers and expression.value == self.instance.target
        if success:
            reward = self.score
        elif uses_numbers:
            reward = self.format_score
        else:
            reward = 0.0
        value = "undefined (division by zero)" if expression.value is None else str(expression.value)
        self.result = f"Your expression equals {value}; reward {reward:g}."
        self.done = True
        info = {
            "action_is_valid": True,
            "success": success,
            "uses_all_numbers": uses_numbers,
            "value": None if expression.value is None else str(expression.value),
        }
        return reward, True, False, info

    def example_action(self) -> str:
        return "(1 + 2) * 3"

    def oracle_action(self) -> str | None:
        return None if self.done else self.solution

    def oracle_reasoning(self, actions: Sequence[str]) -> str | None:
        """The target, the numbers and the solution (``solver.explain``); one action: the expression."""
        return explain(self.instance.numbers, self.instance.target, actions[0]) if actions else None
