"""reasoning-gym's procedural tasks (``reasoning_gym.create_dataset``) as single-turn ragen2 environments.

One episode is one entry of the task's dataset: the question is the observation, the action is the answer,
and the task's own scorer (``dataset.score_answer``) gives the reward in [0, 1]. ``success`` is a flag apart
from that shaped return: a score of at least ``success_threshold``. The entry is drawn from ``np_random``, so
the K rollouts of one seed see one question, byte for byte; reasoning-gym generates entry ``i`` from
``dataset_seed + i`` alone, so no per-step noise exists and ``dynamics_rng`` is unused.

Where it departs from reasoning-gym: a blank answer is an invalid action (the episode goes on, as in
ragen2's own envs) rather than a wrong one; a scorer that raises on model output scores 0 and sets
``info["scorer_error"]``; an answer longer than ``max_answer_chars`` scores 0 unread (some scorers parse with
sympy, whose time grows with the text).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from ragen2_envs.adapters import AnyText, bounded, finite, require
from ragen2_envs.base import TextEnv
from ragen2_envs.options import Named, Range

#: the id as conf/env/reasoning_gym.yaml names it (importing ragen2_envs.reasoning_gym registers it)
ENV_ID = "ragen2_envs.reasoning_gym:ragen2/ReasoningGym-v0"
reasoning_gym = require(
    "reasoning_gym", ENV_ID, "pip install 'ragen2[reasoning-gym]' (reasoning-gym==0.1.25)"
)
TASKS: Mapping[str, Any] = reasoning_gym.factory.DATASETS


#: the name of one of reasoning-gym's tasks
TASK = Named(
    TASKS,
    "a reasoning-gym task",
    f"{len(TASKS)} tasks, e.g. basic_arithmetic, leg_counting, chain_sum, countdown, sudoku; "
    "reasoning_gym.factory.DATASETS lists them all",
)


@functools.cache
def _dataset(task: str, dataset_seed: int, size: int, config: str) -> Any:
    """One dataset object per task and settings, shared by every env made from them (a group's K envs, the
    episodes of a run): reasoning-gym builds word lists and puzzles once per dataset."""
    try:
        return reasoning_gym.create_dataset(task, seed=dataset_seed, size=size, **json.loads(config))
    except (TypeError, ValueError, AssertionError) as err:  # its config dataclass and its validate()
        raise ValueError(f"task={task!r} refuses task_config={config}: {err}") from None


class ReasoningGymEnv(TextEnv):
    """Answer one question of a reasoning-gym task; the task's scorer grades the answer."""

    default_max_turns: ClassVar[int] = 1
    default_max_actions_per_turn: ClassVar[int] = 1

    def __init__(
        self,
        task: Annotated[str, TASK] = "basic_arithmetic",
        task_config: dict[str, Any] | None = None,
        size: Annotated[int, Range(1)] = 10_000,
        dataset_seed: Annotated[int, Range(0)] = 0,
        success_threshold: Annotated[float, Range(0.0, 1.0, low_open=True)] = 1.0,
        max_answer_chars: Annotated[int, Range(1)] = 4_096,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(render_mode=render_mode)
        self.observation_space = AnyText()
        self.action_space = AnyText()
        self.task = task
        self.dataset = _dataset(task, dataset_seed, size, json.dumps(task_config or {}, sort_keys=True))
        self.success_threshold = float(success_threshold)
        self.max_answer_chars = max_answer_chars
        self.entry: dict[str, Any] = self.dataset[0]
        self.score: float | None = None

    @property
    def instructions(self) -> str:
        return (
            f"You are solving a reasoning task ({self.task}). Read the question, work it out, then give only "
            "the final answer as your action, in the form the question asks for."
        )

    def render_state(self) -> str:
        question = bounded(self.entry["question"])[0]
        return question if self.score is None else f"{question}\n\nYour answer scored {self.score:.2f}."

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        index = int(self.np_random.integers(len(self.dataset)))
        self.entry, self.score = self.dataset[index], None
        return {"task": self.task, "index": index}

    def _step(self, action: str) -> tuple[float, bool, bool, dict[str, Any]]:
        if self.score is not None or not action:
            return 0.0, False, False, {"action_is_valid": False}
        unread = len(action) > self.max_answer_chars
        raw: object = None
        if not unread:
            try:
                raw = self.dataset.score_answer(action, self.entry)
            except Exception:  # the task's scorer on arbitrary model text: a wrong answer, never a crash
                raw = None
        score, scored = finite(raw)
        self.score = score
        # scorer_error: the scorer raised or gave no finite number (an unread answer is no error of its own)
        info = {
            "score": score,
            "success": score >= self.success_threshold,
            "scorer_error": not (scored or unread),
        }
        return score, True, False, info

    def oracle_action(self) -> str | None:
        """The entry's reference answer, where it has one that its own scorer passes (a few tasks, e.g.
        propositional_logic, grade by a verifier and carry none)."""
        answer = self.entry.get("answer")
        if self.score is not None or not isinstance(answer, str) or not answer.strip():
            return None
        return answer if self.dataset.score_answer(answer, self.entry) >= self.success_threshold else None
