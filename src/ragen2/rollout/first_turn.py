"""First turns only: a Sampler that answers turn 1 and ends every later turn at once.

``ragen2-diagnose`` scores first-turn (X, Z) pairs (``ragen2.diagnostics.report``). Rolling them out
with the project's own episode runner renders turn 1 exactly as training does (the turn limit is part
of the prompt); wrapping the sampler makes the episodes' later turns cost no model call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from ragen2.rollout.base import PromptMeta, Sample, Sampler, SamplingParams

E = TypeVar("E")


class FirstTurnSampler:
    """A Sampler that answers the first turn with ``inner`` and ends every later turn at once (EOS).

    The episodes' later turns end as bad-format turns nobody reads.
    """

    def __init__(self, inner: Sampler, eos_token_id: int) -> None:
        self.inner = inner
        self.eos_token_id = eos_token_id
        self.needs_oracle = inner.needs_oracle
        self.records_entropy = inner.records_entropy
        self.calls = 0

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int,
        meta: Sequence[PromptMeta] | None = None,
    ) -> list[Sample]:
        self.calls += 1
        if self.calls == 1:
            return self.inner.generate(prompts, params, seed, meta)
        return [Sample([self.eos_token_id], "eos", [0.0], [0.0]) for _ in prompts]

    def sync_weights(self, model: Any) -> None:
        self.inner.sync_weights(model)


class Collects(Protocol[E]):
    """What ``sample_first_turns`` needs of an episode runner (``ragen2.agent.EpisodeRunner``)."""

    tokenizer: Any

    def collect(
        self, sampler: Sampler, seeds: Sequence[int], group_size: int, sample_seed: int, *, desc: str = ...
    ) -> list[E]: ...


def sample_first_turns(
    runner: Collects[E], sampler: Sampler, seeds: Sequence[int], samples: int, sample_seed: int
) -> list[E]:
    """``samples`` first turns for each instance seed (episodes whose turn 1 is the sampled one)."""
    first_turns = FirstTurnSampler(sampler, runner.tokenizer.eos_token_id)
    return runner.collect(first_turns, seeds, samples, sample_seed, desc="diagnose rollout")
