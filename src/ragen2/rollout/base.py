"""The Sampler protocol: token ids in, sampled token ids (and their log-probs) out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from ragen2.errors import ConfigError

FinishReason = Literal["stop", "eos", "length"]


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    stop: tuple[str, ...] = ("</answer>",)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(
                f"rollout.max_new_tokens={self.max_new_tokens} must be ≥ 1. Fix: e.g. rollout.max_new_tokens=48"
            )
        if self.temperature < 0:
            raise ConfigError(
                f"rollout.temperature={self.temperature} must be ≥ 0 (0 = greedy). Fix: rollout.temperature=1.0"
            )
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p={self.top_p} must be in (0, 1]. Fix: rollout.top_p=1.0 (off)")


@dataclass
class Sample:
    ids: list[int]
    finish_reason: FinishReason
    # log π_sampler(token) under the temperature-scaled distribution; None when the backend has no model
    logprobs: list[float] | None = None
    # entropy of the temperature-scaled next-token distribution at each sampled position (T = 1 when
    # greedy); None when the backend has no model (``records_entropy`` False)
    entropies: list[float] | None = None


@dataclass
class PromptMeta:
    """What a backend may know about a prompt beyond its ids (scripted backends use the oracle)."""

    oracle: str | None = None  # the env solver's actions for this turn, joined by ``||``
    reasoning: str | None = None  # why they fit the state (``env.oracle_reasoning``), when the env says
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Sampler(Protocol):
    #: whether the runner should compute ``env.oracle_action()`` for each prompt (scripted backends)
    needs_oracle: bool
    #: whether samples carry the per-token entropies the filter's entropy scores rank by
    records_entropy: bool

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int,
        meta: Sequence[PromptMeta] | None = None,
    ) -> list[Sample]: ...

    def sync_weights(self, model: Any) -> None:
        """Make the backend sample from ``model``'s current weights."""
        ...
