"""Shared test helpers (``from helpers import …``): hand-made turns and episodes, env configs as composed."""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig

from ragen2.agent.episode import Episode, Turn
from ragen2.config import compose


def turn(
    prompt: Sequence[int],
    sampled: Sequence[int],
    reward: float = 0.0,
    penalty: float = 0.0,
    finish_reason: str = "stop",
    entropies: Sequence[float] | None = None,
) -> Turn:
    """A well-formed turn (a bad one when ``penalty`` < 0) whose reasoning is its first sampled id."""
    return Turn(
        prompt_ids=list(prompt),
        sampled_ids=list(sampled),
        sampler_logprobs=[-0.5] * len(sampled),
        text="",
        finish_reason=finish_reason,
        observation="",
        format_ok=penalty == 0.0,
        actions=["a"],
        actions_valid=[True],
        reward=reward,
        penalty=penalty,
        reasoning_ids=list(sampled[:1]),
        entropies=None if entropies is None else list(entropies),
    )


def episode(group: int, turns: Sequence[Turn], sample: int = 0, seed: int | None = None) -> Episode:
    return Episode(
        env_id="x",
        seed=group if seed is None else seed,
        group=group,
        sample=sample,
        system_prompt="",
        turns=list(turns),
    )


def env_conf(name: str) -> DictConfig:
    """``conf/env/<name>.yaml`` as the training config composes it, with the env's own turn limit."""
    return compose([f"env={name}", "max_turns_cap=null"]).env
