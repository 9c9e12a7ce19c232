"""Scripted backends: canned responses for tests, debugging and env smoke runs; the solver's demonstrations.

``ScriptedSampler``: each response is a template for the text after the forced ``<think>``; ``{oracle}``
becomes the env's known-good action for the prompt and ``{reasoning}`` the env's reason for it (an env that
holds reasoning to a grammar, TwoHop, accepts only that) (so some episodes succeed and others do not:
differently rewarded groups with no trained model). Responses are drawn with a seeded RNG, so runs are
reproducible.

``Demonstrator``: the env's solver as a sampler, for the warm start's demonstrations
(``ragen2.data.demos``): one reply template filled with the solver's reasoning and moves, cut where a
model's sample would be cut.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
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

    def __init__(
        self,
        tokenizer: Any,
        responses: Sequence[str] = DEFAULT_RESPONSES,
        fallback: str = "Up",
        fallback_reasoning: str = "I should follow the plan.",
    ):
        if not responses:
            raise ValueError("rollout.responses is empty: give at least one response template")
        self.tokenizer = tokenizer
        self.responses = list(responses)
        self.fallback = fallback  # stands in for {oracle} when the env has none
        self.fallback_reasoning = fallback_reasoning  # stands in for {reasoning} when the env has none

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
            m = meta[i] if meta is not None else PromptMeta()
            text = (
                rng.choice(self.responses)
                .replace("{oracle}", self.fallback if m.oracle is None else m.oracle)
                .replace("{reasoning}", self.fallback_reasoning if m.reasoning is None else m.reasoning)
            )
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            finish = (
                "stop"
                if len(ids) <= params.max_new_tokens and any(s in text for s in params.stop)
                else "length"
            )
            out.append(Sample(ids=ids[: params.max_new_tokens], finish_reason=finish))
        return out


@dataclass(frozen=True)
class Demonstrated:
    """What the solver planned for one prompt, and the reply written from it (both None without a plan)."""

    oracle: str | None  # the solver's actions joined by ``||`` (``PromptMeta.oracle``)
    reply: str | None  # the whole reply text, before any cut


class Demonstrator:
    """The env's solver as a Sampler: each turn's reply is ``reply`` with ``{reasoning}`` and ``{oracle}``
    filled in from the solver (``PromptMeta``), cut where a model's sample would be cut (the token that
    completes the first stop string, the first EOS, or ``max_new_tokens``), so the ids are the ones the
    agent loop records when a model writes that reply.

    A prompt the solver has no move or no reasoning for is answered with EOS. ``demonstrated`` keeps, per
    prompt (its ids), the plan and the whole reply: the warm start checks each recorded turn against them.
    """

    needs_oracle = True
    records_entropy = False  # no model, no distribution

    def __init__(self, tokenizer: Any, reply: str) -> None:
        self.tokenizer = tokenizer
        self.reply = reply
        self.demonstrated: dict[tuple[int, ...], Demonstrated] = {}

    def sync_weights(self, model: Any) -> None:
        """The solver's replies do not depend on weights."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int,
        meta: Sequence[PromptMeta] | None = None,
    ) -> list[Sample]:
        out = []
        for i, prompt in enumerate(prompts):
            m = meta[i] if meta is not None else PromptMeta()
            if m.oracle is None or m.reasoning is None:
                self.demonstrated[tuple(prompt)] = Demonstrated(None, None)
                out.append(Sample(ids=[self.tokenizer.eos_token_id], finish_reason="eos"))
                continue
            text = self.reply.replace("{reasoning}", m.reasoning).replace("{oracle}", m.oracle)
            self.demonstrated[tuple(prompt)] = Demonstrated(m.oracle, text)
            out.append(self._as_sampled(text, params))
        return out

    def _as_sampled(self, text: str, params: SamplingParams) -> Sample:
        """``text``'s ids up to where a sampler stops (``ragen2.rollout.hf``'s rule, checked per token)."""
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        for n in range(1, min(len(ids), params.max_new_tokens) + 1):
            if ids[n - 1] == self.tokenizer.eos_token_id:
                return Sample(ids=ids[:n], finish_reason="eos")
            if any(stop in self.tokenizer.decode(ids[:n]) for stop in params.stop):
                return Sample(ids=ids[:n], finish_reason="stop")
        return Sample(ids=ids[: params.max_new_tokens], finish_reason="length")
