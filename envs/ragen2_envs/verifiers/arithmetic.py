"""``ragen2-arithmetic``: a single-turn verifiers taskset that ships with ragen2 and runs offline
(env=verifiers' default).

A verifiers taskset as a package would write one: tasks built from config (``size`` questions ``a + b × c``
from ``seed``) and a rubric of weighted ``@vf.reward`` methods, ``correct`` (weight 1: the reply is the value)
and ``integer`` (weight 0.1: the reply is a plain integer). A wrong integer earns 0.1 and a right one 1.1, so
the return is shaped while success (a return of at least the env's ``success_threshold``, 1.0) is the right
answer alone. verifiers plays it with its ``SingleAgentEnv``: one seat, one model call.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import verifiers.v1 as vf
from pydantic import Field

__all__ = ["ArithmeticTaskset"]

SYSTEM = "Compute the value of the expression. Reply with the integer only."


class ArithmeticConfig(vf.TasksetConfig):
    size: int = Field(1000, ge=1)
    """How many questions."""
    seed: int = 0
    """Another seed: other questions."""


class ArithmeticData(vf.TaskData):
    answer: str


def _integer(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


class ArithmeticTask(vf.Task[ArithmeticData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, task: ArithmeticData, trace: vf.Trace) -> float:
        return float(_integer(trace.last_reply) == int(task.answer))

    @vf.reward(weight=0.1)
    async def integer(self, trace: vf.Trace) -> float:
        return float(_integer(trace.last_reply) is not None)


class ArithmeticTaskset(vf.Taskset[ArithmeticTask, ArithmeticConfig]):
    def load(self) -> Iterator[ArithmeticTask]:
        rng = random.Random(self.config.seed)
        for _ in range(self.config.size):
            a, b, c = rng.randint(1, 20), rng.randint(1, 9), rng.randint(1, 9)
            yield ArithmeticTask(
                ArithmeticData(
                    prompt=f"What is {a} + {b} × {c}?", system_prompt=SYSTEM, answer=str(a + b * c)
                ),
                self.config.task,
            )
