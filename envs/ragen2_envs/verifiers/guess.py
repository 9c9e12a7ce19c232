"""``ragen2-guess``: a multi-turn verifiers environment that ships with ragen2 and runs offline.

verifiers 0.4 has no MultiTurnEnv class: an environment that talks back is an ``Env`` whose ``run`` holds its
seat's rollout open (``agent.interaction(task)``) and answers each reply with the next user turn. Here the env
has picked one of ``span`` whole numbers the prompt names and answers each guess with "Higher."/"Lower." until
the guess is right or ``max_guesses`` are spent; the rubric's ``found`` (weight 1) pays a right last guess.
The secret is the task's ``answer`` (the adapter's oracle).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import verifiers.v1 as vf
from pydantic import Field

__all__ = ["GuessEnv", "GuessTaskset"]

SYSTEM = "Find the number in as few guesses as you can; each wrong guess gets a hint."


class GuessConfig(vf.TasksetConfig):
    size: int = Field(1000, ge=1)
    span: int = Field(8, ge=2)
    """How many numbers the secret is drawn from (their start is drawn from 1 to 50)."""
    seed: int = 0


class GuessData(vf.TaskData):
    answer: str


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def found(self, task: GuessData, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self) -> Iterator[GuessTask]:
        rng = random.Random(self.config.seed)
        for _ in range(self.config.size):
            low = rng.randint(1, 50)
            high = low + self.config.span - 1
            yield GuessTask(
                GuessData(
                    prompt=f"I picked a whole number from {low} to {high}. Guess it: reply with one number.",
                    system_prompt=SYSTEM,
                    answer=str(rng.randint(low, high)),
                ),
                self.config.task,
            )


class GuessEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()
    max_guesses: int = Field(4, ge=1)


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        secret = int(task.data.answer)
        async with agents.agent.interaction(task) as talk:
            segment = await talk.turn()  # the task's prompt opens the exchange
            for _ in range(self.config.max_guesses - 1):
                reply = segment.last_reply
                if segment.terminated or reply == task.data.answer:
                    return
                try:
                    hint = "Higher." if int(reply) < secret else "Lower."
                except ValueError:
                    hint = "Not a number."
                segment = await talk.turn(f"{hint} Guess again.")
