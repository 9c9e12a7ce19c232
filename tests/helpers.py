"""Shared test helpers (``from helpers import …``): hand-made turns and episodes, env configs as composed, a
scripted LM."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import torch
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


class ScriptLM(torch.nn.Module):
    """A deterministic LM: row i emits ``scripts[last prompt token of row i]`` token by token, then ``default``.

    Its "cache" is the script state, handed back through ``past_key_values`` as the sampler threads it, so
    any token may repeat inside a script. Use it with ``reuse_prefix=False`` (it holds no real keys/values).
    """

    def __init__(self, vocab_size: int, scripts: dict[int, list[int]], default: int) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # so that next(parameters()) has a device
        self.scripts, self.default, self.vocab_size = scripts, default, vocab_size

    def forward(
        self, input_ids: torch.Tensor, past_key_values: object = None, **_: object
    ) -> SimpleNamespace:
        state = past_key_values
        if not isinstance(state, SimpleNamespace):  # first call of a batch: the whole (left-padded) prompt
            state = SimpleNamespace(keys=input_ids[:, -1].tolist(), n=0)
        script = [self.scripts.get(k, []) for k in state.keys]
        nxt = [s[state.n] if state.n < len(s) else self.default for s in script]
        state.n += 1
        logits = torch.full((*input_ids.shape, self.vocab_size), -20.0)
        logits[:, -1, :].scatter_(-1, torch.tensor(nxt)[:, None], 20.0)
        return SimpleNamespace(logits=logits, past_key_values=state)
