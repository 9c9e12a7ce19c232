"""rollout/* metrics from a list of episodes, and from its groups."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ragen2.agent.episode import ENV_ERROR, Episode


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
        # episodes an env ended on a failure of its own side (a remote server that died), ``info["env_error"]``
        "env_errors": float(sum(any(ENV_ERROR in i for t in ep.turns for i in t.infos) for ep in episodes)),
        # counts, as env_timeouts: tool turns' calls and the failed ones (env.tools, ``ragen2.agent.tools``)
        "tool_calls": float(sum(len(t.tool_calls) for t in turns)),
        "tool_errors": float(sum(bool(c.error) for t in turns for c in t.tool_calls)),
        "format_penalty": _mean([sum(t.penalty for t in ep.turns) for ep in episodes]),
        "sequence_length": _mean([len(ep.token_ids) for ep in episodes]),
        **_token_entropy(episodes),
        **_success_by_kind(episodes),
    }


def _success_by_kind(episodes: Sequence[Episode]) -> dict[str, float]:
    """``success_<kind>`` for each kind of instance the env names (``Episode.kind``): TwoHop's zero-variance
    kinds would otherwise hide how the learnable ones fare."""
    kinds = sorted({ep.kind for ep in episodes if ep.kind})
    return {f"success_{k}": _mean([float(ep.success) for ep in episodes if ep.kind == k]) for k in kinds}


def _token_entropy(episodes: Sequence[Episode]) -> dict[str, float]:
    """Mean next-token entropy over every sampled position, when the sampler recorded it."""
    per_episode = [ep.token_entropies for ep in episodes]
    if any(values is None for values in per_episode):
        return {}
    return {"token_entropy": _mean([h for values in per_episode for h in values or ()])}


def group_metrics(rounds: Sequence[Sequence[Episode]]) -> dict[str, float]:
    """The iteration's groups by outcome, and the spread of their reward variance.

    ``rounds``: the episodes of each round of each rank, a group being the episodes of one round that share
    ``Episode.group``. Every group's rollouts all succeeded (``groups_all_success``), all failed
    (``groups_all_fail``) or both occur (``groups_mixed``): shares of ``groups``, the number of groups. Only
    a group whose returns differ gives an advantage; with a success-only reward that is a mixed group.
    RV is a group's Bessel-corrected standard deviation of returns (the filter's ``reward_std``, what the
    paper calls RV; 0 for a group of one): ``rv_mean`` is its mean over groups and ``rv_cv`` =
    Std(RV)/Mean(RV) with the population std (0 when the mean is 0, as ``filter/score_cv``), the paper's
    predictor of whether filtering helps (docs/method.md §4), whatever score the filter ranks by.
    """
    groups = [members for episodes in rounds for members in _by_group(episodes)]
    if not groups:
        return {}
    wins = [sum(ep.success for ep in members) for members in groups]
    returns = [[ep.episode_return for ep in members] for members in groups]
    rv = [statistics.stdev(r) if len(r) > 1 else 0.0 for r in returns]
    mean = statistics.fmean(rv)
    return {
        "groups": float(len(groups)),
        "groups_all_success": _mean([float(w == len(g)) for w, g in zip(wins, groups)]),
        "groups_all_fail": _mean([float(w == 0) for w in wins]),
        "groups_mixed": _mean([float(0 < w < len(g)) for w, g in zip(wins, groups)]),
        "rv_mean": mean,
        "rv_cv": statistics.pstdev(rv) / mean if mean != 0 else 0.0,
    }


def _by_group(episodes: Sequence[Episode]) -> list[list[Episode]]:
    groups: dict[int, list[Episode]] = {}
    for ep in episodes:
        groups.setdefault(ep.group, []).append(ep)
    return list(groups.values())
