"""Scripted backend: canned responses for tests, debugging and env smoke runs.

Each response is a template for the text after the forced ``<think>``; ``{oracle}`` becomes the env's
known-good action for the prompt (so some episodes succeed and others do not: differently rewarded
groups with no trained model). Responses are drawn with a seeded RNG, so runs are reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ragen2.rollout.base import PromptMeta, Sample, SamplingParams

DEFAULT_RESPONSES: tuple[str, ...] = (
    "I should follow the plan.</think><answer>{oracle}</answer>",
    "Let me move toward the goal.</think><answer>{oracle}</answer>",
    "Trying something.</think><answer>Left||Up</answer>",
    "Maybe down.</think><answer>Down</answer>",
    "I am not sure what to do here",  # unclosed reasoning: a format error
)


class ScriptedSampler:
    needs_oracle = True
    records_entropy = False  # no model, no distribution

    def __init__(self, tokenizer: Any, responses: Sequence[str] = DEFAULT_RESPONSES, fallback: str = "Up"):
        if not responses:
            raise ValueError("rollout.responses is empty: give at least one response template")
        self.tokenizer = tokenizer
        self.responses = list(responses)
        self.fallback = fallback  # stands in for {oracle} when the env has none

    def sync_weights(self, model: Any) -> None:
        """Scripted responses do not depend on weights."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int,
        meta: Sequence[PromptMeta] | None = None,
    ) -> list[Sample]:
        rng = random.Random(seed)
        out = []
        for i in range(len(prompts)):
            planned = meta[i].oracle if meta is not None else None
            text = rng.choice(self.responses).replace(
                "{oracle}", self.fallback if planned is None else planned
            )
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            finish = (
                "stop"
                if len(ids) <= params.max_new_tokens and any(s in text for s in params.stop)
                else "length"
            )
            out.append(Sample(ids=ids[: params.max_new_tokens], finish_reason=finish))
        return out
