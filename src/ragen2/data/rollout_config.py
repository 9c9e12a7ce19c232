"""``env.*``, ``rollout.*`` and ``val.*`` as validated objects, and the episode runner they describe.

The DataModule (training and validation rollouts) and ``ragen2-eval`` build their runners from the same
objects, so an episode is rolled out the same way wherever it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ragen2_envs

from ragen2.agent.render import check_layout
from ragen2.agent.runner import DEFAULT_STEP_TIMEOUT_S, AgentConfig, EpisodeRunner
from ragen2.agent.tools import Toolbox, check_specs
from ragen2.errors import ConfigError
from ragen2.rollout.base import Sampler, SamplingParams
from ragen2.settings import check_type, shown, unknown_key


@dataclass(frozen=True)
class EnvConfig:
    """``env.*``: the environment, its constructor's knobs and the agent's limits on it."""

    id: str
    """An environment id: one of ragen2's own (``ragen2_envs.own_ids``, e.g. ragen2/Sokoban-v0), or one a
    package outside ragen2 registers (``ragen2_envs.registry``: the ``ragen2.envs`` entry points, as ragen2
    declares its own, ``gymnasium.register``, ``<module>:<id>``)."""
    max_turns: int = 5
    """Turns per episode: the env's own limit, capped by ``max_turns_cap`` (conf/env/*.yaml)."""
    max_actions_per_turn: int = 2
    """Actions the agent may chain in one turn with ``||``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """The env constructor's keyword arguments."""
    step_timeout_s: float | None = DEFAULT_STEP_TIMEOUT_S
    """Seconds each env call (reset, step) may take; one past it ends its episode as a counted failure
    (``rollout/env_timeouts``). 0 or null: no limit."""
    tools: list[str] = field(default_factory=list)
    """Tools the policy may call through its chat template's function-call format (empty: text actions only):
    each a tool of the env (``search`` for SearchQA; ``*``: every tool it has or its server lists), a
    ``module:function`` or ``mcp:<command>`` (a local MCP server's tools). Tool calls and results are its turns; ``<answer>`` still acts on the env (docs/tools.md)."""
    tool_format: str = "auto"
    """The function-call format the policy writes its calls in: ``hermes`` (``<tool_call>`` JSON: Qwen, Hermes),
    ``llama3_json`` (Llama 3.x's JSON, and 3.1's built-in tools), ``mistral`` (``[TOOL_CALLS]``), ``pythonic``
    (``[f(a=1)]``: Llama 3.2's and 4's pythonic templates, Gemma 3); ``auto`` reads it off the chat template."""

    def __post_init__(self) -> None:
        try:
            env_class = ragen2_envs.env_class(self.id)
        except ragen2_envs.UnknownEnvError as err:
            raise ConfigError(str(err)) from None
        object.__setattr__(self, "tools", check_specs(list(self.tools or ()), env_class))
        AgentConfig(  # checks all four
            max_turns=self.max_turns,
            max_actions_per_turn=self.max_actions_per_turn,
            step_timeout_s=self.step_timeout_s,
            tool_format=self.tool_format,
        )
        object.__setattr__(self, "kwargs", dict(self.kwargs or {}))
        self._check_kwargs()

    def _check_kwargs(self) -> None:
        """Each of ``env.kwargs`` against the option of that name the env declares: its name, its type and
        its bounds (what only several options decide together, the env's constructor checks in ``make``)."""
        declared = ragen2_envs.env_options(self.id)
        for name, value in self.kwargs.items():
            key = f"env.kwargs.{name}"
            option = declared.get(name)
            if option is None:
                raise unknown_key(key, value, declared, f"an option of {self.id}")
            check_type(key, value, option.hint, option.default)
            problem = option.problem(value)
            if problem:
                raise ConfigError(f"{key}={shown(value)} {problem}. Fix: {key}={shown(option.default)}")

    def make(self) -> ragen2_envs.TextEnv:
        """A fresh instance of the environment; options it refuses together, and what it needs but does not
        find here (a file, an interpreter, a sandbox), are a ``ConfigError``."""
        try:
            return ragen2_envs.make(self.id, **self.kwargs)
        except (ValueError, OSError, RuntimeError) as err:
            raise ConfigError(
                f"env.kwargs of {self.id}: {err}. Fix: change the env.kwargs named (conf/env/ holds each env's "
                "defaults)"
            ) from err


@dataclass(frozen=True)
class RolloutConfig:
    """``rollout.*``: how an iteration's episodes are sampled."""

    sampler: Callable[[Any], Sampler]
    """The backend, built from the tokenizer: conf/rollout/<name>.yaml's ``sampler`` (a ``_partial_``)."""
    groups: int = 4
    """Distinct instances (prompts) per iteration."""
    group_size: int = 4
    """Rollouts per instance (K ≥ 2: group advantages and reward variance need two)."""
    max_new_tokens: int = 48
    """Sampled tokens per turn."""
    temperature: float = 1.0
    """Sampling temperature (0 = greedy); the update scores log-probs at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling: sample from the fewest tokens holding this share of the probability (1 = off)."""
    top_k: int = 0
    """Sample from the k most likely tokens (0 = off)."""
    max_context: int = 4096
    """Prompt + response tokens the model may hold; an episode that would exceed it ends as truncated."""
    format_penalty: float = -0.1
    """Added once to a turn with a bad format or an invalid action (≤ 0)."""
    save_jsonl: bool = False
    """Every episode (ids, text, rewards, group, seed) to <run>/rollouts.rank<r>.jsonl."""
    layout: str = "auto"
    """``sequence``: one training sequence per episode, each prompt the last one plus the sampled ids (the
    chat template must keep history verbatim); ``per_turn``: one sequence per turn, each prompt the
    conversation through the template (which may drop earlier turns' reasoning, as Qwen3's does); ``auto``:
    ``sequence`` where the template allows it, else ``per_turn`` (``ragen2.agent.render``)."""

    def __post_init__(self) -> None:
        if self.groups < 1:
            raise ConfigError(f"rollout.groups={self.groups} must be ≥ 1. Fix: rollout.groups=4")
        if self.group_size < 2:
            raise ConfigError(
                f"rollout.group_size={self.group_size}: group-relative advantages and the reward-variance "
                "filter need at least 2 rollouts per group. Fix: rollout.group_size=4 (or more)."
            )
        if self.top_k < 0:
            raise ConfigError(f"rollout.top_k={self.top_k} must be ≥ 0. Fix: rollout.top_k=0 (off)")
        if self.format_penalty > 0:
            raise ConfigError(
                f"rollout.format_penalty={self.format_penalty} must be ≤ 0: it is added to bad turns. "
                "Fix: rollout.format_penalty=-0.1"
            )
        check_layout(self.layout)
        params = self.params()  # checks max_new_tokens, temperature, top_p
        if self.max_context <= params.max_new_tokens:
            raise ConfigError(
                f"rollout.max_context={self.max_context} leaves no room for a prompt next to "
                f"rollout.max_new_tokens={self.max_new_tokens}. Fix: raise rollout.max_context."
            )

    def params(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
        )

    def runner(self, env: EnvConfig, tokenizer: Any) -> EpisodeRunner:
        """The episode runner for ``env`` with these sampling settings."""
        agent = AgentConfig(
            max_turns=env.max_turns,
            max_actions_per_turn=env.max_actions_per_turn,
            format_penalty=self.format_penalty,
            max_context=self.max_context,
            step_timeout_s=env.step_timeout_s,
            layout=self.layout,
            tool_format=env.tool_format,
        )
        tools = Toolbox.from_specs(env.tools, ragen2_envs.env_class(env.id), env.make) if env.tools else None
        return EpisodeRunner(env.make, tokenizer, agent, self.params(), env_id=env.id, tools=tools)

    def saved(self) -> dict[str, Any]:
        """Every setting but the backend, as plain values (what a checkpoint records)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "sampler"}


@dataclass(frozen=True)
class ValConfig:
    """``val.*``: held-out evaluation during training (greedy success, sampled pass@k)."""

    every_n_iterations: int = 0
    """Validate after every n-th iteration (0 = no validation)."""
    num_seeds: int = 8
    """Held-out instances (disjoint from every training seed)."""
    samples: int = 4
    """Sampled rollouts per instance, for pass@k."""
    k: int = 4
    """The k of pass@k (unbiased, from an instance's ``samples`` rollouts; k ≤ samples)."""

    def __post_init__(self) -> None:
        for key in ("every_n_iterations", "samples"):
            if getattr(self, key) < 0:
                raise ConfigError(f"val.{key}={getattr(self, key)} must be ≥ 0. Fix: val.{key}=0 (none)")
        if self.num_seeds < 1 or self.k < 1:
            raise ConfigError(
                f"val.num_seeds={self.num_seeds} and val.k={self.k} must both be ≥ 1. Fix: e.g. val.num_seeds=8 val.k=4"
            )
        if self.every_n_iterations and self.k > self.samples:
            raise ConfigError(
                f"val.k={self.k} exceeds val.samples={self.samples}; pass@k needs samples ≥ k. Fix: val.samples={self.k}"
            )
