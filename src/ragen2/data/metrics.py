"""rollout/* metrics from a list of episodes."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ragen2.agent.episode import Episode


def _mean(xs: Sequence[float]) -> float:
    return float(statistics.fmean(xs)) if xs else 0.0


def rollout_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    turns = [t for ep in episodes for t in ep.turns]
    actions = [v for t in turns for v in t.actions_valid]
    returns = [ep.episode_return for ep in episodes]
    reasoning = [len(t.reasoning_ids) for t in turns if t.reasoning_ids is not None]
    return {
        "success": _mean([float(ep.success) for ep in episodes]),
        "return": _mean(returns),
        "return_std": float(statistics.pstdev(returns)) if len(returns) > 1 else 0.0,
        "turns": _mean([len(ep.turns) for ep in episodes]),
        "format_valid_rate": _mean([float(t.format_ok) for t in turns]),
        "action_valid_rate": _mean([float(v) for v in actions]),
        "actions_per_turn": _mean([len(t.actions) for t in turns]),
        "valid_reasoning_rate": _mean([float(t.reasoning_ids is not None) for t in turns]),
        "reasoning_length": _mean(reasoning),
        "response_length": _mean([len(t.sampled_ids) for t in turns]),
        "response_clip_rate": _mean([float(t.finish_reason == "length") for t in turns]),
        "truncation_rate": _mean([float(ep.truncated) for ep in episodes]),
        "context_truncation_rate": _mean([float(ep.end_reason == "context") for ep in episodes]),
        # a count, not a rate: any hung env call is worth seeing (ragen2.agent.runner, env.step_timeout_s)
        "env_timeouts": float(sum(ep.end_reason == "env_timeout" for ep in episodes)),
        "format_penalty": _mean([sum(t.penalty for t in ep.turns) for ep in episodes]),
        "sequence_length": _mean([len(ep.token_ids) for ep in episodes]),
        **_token_entropy(episodes),
    }


def _token_entropy(episodes: Sequence[Episode]) -> dict[str, float]:
    """Mean next-token entropy over every sampled position, when the sampler recorded it."""
    per_episode = [ep.token_entropies for ep in episodes]
    if any(values is None for values in per_episode):
        return {}
    return {"token_entropy": _mean([h for values in per_episode for h in values or ()])}
