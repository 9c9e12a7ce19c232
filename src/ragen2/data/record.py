"""Typed records of what rollouts did: ``RolloutStats`` over a list of episodes, ``GroupStats`` over their
groups, ``DynamicStats`` over DAPO's rounds, and ``IterationRecord``, an iteration's all of them with the
overlong shaping's (``OverlongStats``), the filter's statistics and the rollout's time and tokens (``PhasePerf``)
(``RolloutBatch.record``). Code reads their fields; ``as_metrics`` is where their logged keys are made
(``rollout/*`` and ``filter/*`` in training, ``greedy/*`` and ``sampled/*`` in evaluation). The filter's
statistics stay a mapping: a user's filter names its own.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ragen2.agent.episode import ENV_ERROR, Episode
from ragen2.data.shaping import OverlongStats
from ragen2.perf import PhasePerf


def _mean(xs: Sequence[float]) -> float:
    return float(statistics.fmean(xs)) if xs else 0.0


def _as_metrics(
    record: Any, prefix: str, renamed: Mapping[str, str], skip: tuple[str, ...] = ()
) -> dict[str, float]:
    """The record's number fields as ``prefix + key``: the field's name, or the one ``renamed`` gives it."""
    return {
        f"{prefix}{renamed.get(f.name, f.name)}": float(getattr(record, f.name))
        for f in fields(record)
        if f.name not in skip
    }


@dataclass(frozen=True)
class RolloutStats:
    """Rates and means over episodes (per turn where a turn has the quantity), and counts of what went wrong."""

    success: float
    return_: float  # logged as "return"
    return_std: float  # population std over episodes
    turns: float
    format_valid_rate: float
    action_valid_rate: float
    actions_per_turn: float
    valid_reasoning_rate: float
    reasoning_length: float  # tokens of Z, over turns with a valid reasoning
    response_length: float
    response_clip_rate: float
    truncation_rate: float
    context_truncation_rate: float
    # counts, not rates: any hung env call is worth seeing (ragen2.agent.runner, env.step_timeout_s)
    env_timeouts: int
    # episodes an env ended on a failure of its own side (a remote server that died), ``info["env_error"]``
    env_errors: int
    # tool turns' calls and the failed ones (env.tools, ``ragen2.agent.tools``)
    tool_calls: int
    tool_errors: int
    format_penalty: float  # per episode
    sequence_length: float
    # mean next-token entropy over every sampled position; None when the sampler did not record it
    token_entropy: float | None = None
    # success per kind of instance the env names (``Episode.kind``): TwoHop's zero-variance kinds would
    # otherwise hide how the learnable ones fare
    success_by_kind: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, episodes: Sequence[Episode]) -> RolloutStats:
        turns = [t for ep in episodes for t in ep.turns]
        returns = [ep.episode_return for ep in episodes]
        entropies = [ep.token_entropies for ep in episodes]
        kinds = sorted({ep.kind for ep in episodes if ep.kind})
        return cls(
            success=_mean([float(ep.success) for ep in episodes]),
            return_=_mean(returns),
            return_std=float(statistics.pstdev(returns)) if len(returns) > 1 else 0.0,
            turns=_mean([len(ep.turns) for ep in episodes]),
            format_valid_rate=_mean([float(t.format_ok) for t in turns]),
            action_valid_rate=_mean([float(v) for t in turns for v in t.actions_valid]),
            actions_per_turn=_mean([len(t.actions) for t in turns]),
            valid_reasoning_rate=_mean([float(t.reasoning_ids is not None) for t in turns]),
            reasoning_length=_mean([len(t.reasoning_ids) for t in turns if t.reasoning_ids is not None]),
            response_length=_mean([len(t.sampled_ids) for t in turns]),
            response_clip_rate=_mean([float(t.finish_reason == "length") for t in turns]),
            truncation_rate=_mean([float(ep.truncated) for ep in episodes]),
            context_truncation_rate=_mean([float(ep.end_reason == "context") for ep in episodes]),
            env_timeouts=sum(ep.end_reason == "env_timeout" for ep in episodes),
            env_errors=sum(any(ENV_ERROR in i for t in ep.turns for i in t.infos) for ep in episodes),
            tool_calls=sum(len(t.tool_calls) for t in turns),
            tool_errors=sum(bool(c.error) for t in turns for c in t.tool_calls),
            format_penalty=_mean([sum(t.penalty for t in ep.turns) for ep in episodes]),
            sequence_length=_mean([len(ep.token_ids) for ep in episodes]),
            token_entropy=None
            if any(values is None for values in entropies)
            else _mean([h for values in entropies for h in values or ()]),
            success_by_kind={k: _mean([float(ep.success) for ep in episodes if ep.kind == k]) for k in kinds},
        )

    def as_metrics(self, prefix: str = "") -> dict[str, float]:
        out = _as_metrics(self, prefix, {"return_": "return"}, skip=("token_entropy", "success_by_kind"))
        if self.token_entropy is not None:
            out[f"{prefix}token_entropy"] = self.token_entropy
        out.update({f"{prefix}success_{k}": v for k, v in self.success_by_kind.items()})
        return out


@dataclass(frozen=True)
class GroupStats:
    """The iteration's groups by outcome, and the spread of their reward variance.

    Every group's rollouts all succeeded (``all_success``), all failed (``all_fail``) or both occur
    (``mixed``): shares of ``groups``, the number of groups. Only a group whose returns differ gives an
    advantage; with a success-only reward that is a mixed group. RV is a group's Bessel-corrected standard
    deviation of returns (the filter's ``reward_std``, what the paper calls RV; 0 for a group of one):
    ``rv_mean`` is its mean over groups and ``rv_cv`` = Std(RV)/Mean(RV) with the population std (0 when the
    mean is 0, as ``filter/score_cv``), the paper's predictor of whether filtering helps (docs/method.md §4),
    whatever score the filter ranks by.
    """

    groups: int
    all_success: float
    all_fail: float
    mixed: float
    rv_mean: float
    rv_cv: float

    @classmethod
    def of(cls, rounds: Sequence[Sequence[Episode]]) -> GroupStats | None:
        """``rounds``: the episodes of each round of each rank, a group being the episodes of one round that
        share ``Episode.group``; None when there are none."""
        groups = [members for episodes in rounds for members in _by_group(episodes)]
        if not groups:
            return None
        wins = [sum(ep.success for ep in members) for members in groups]
        returns = [[ep.episode_return for ep in members] for members in groups]
        rv = [statistics.stdev(r) if len(r) > 1 else 0.0 for r in returns]
        mean = statistics.fmean(rv)
        return cls(
            groups=len(groups),
            all_success=_mean([float(w == len(g)) for w, g in zip(wins, groups)]),
            all_fail=_mean([float(w == 0) for w in wins]),
            mixed=_mean([float(0 < w < len(g)) for w, g in zip(wins, groups)]),
            rv_mean=mean,
            rv_cv=statistics.pstdev(rv) / mean if mean != 0 else 0.0,
        )

    def as_metrics(self, prefix: str = "") -> dict[str, float]:
        return _as_metrics(
            self,
            prefix,
            {"all_success": "groups_all_success", "all_fail": "groups_all_fail", "mixed": "groups_mixed"},
        )


def _by_group(episodes: Sequence[Episode]) -> list[list[Episode]]:
    groups: dict[int, list[Episode]] = {}
    for ep in episodes:
        groups.setdefault(ep.group, []).append(ep)
    return list(groups.values())


@dataclass(frozen=True)
class DynamicStats:
    """DAPO's dynamic sampling over one iteration's rounds (``algo.sampling``, ``ragen2.data.iteration``)."""

    rounds: int
    groups_sampled: int  # rounds × the iteration's groups
    groups_dropped: int  # groups whose (shaped) returns were all equal
    groups_kept: int
    shortfall: int  # groups the rounds did not find

    def as_metrics(self) -> dict[str, float]:
        return _as_metrics(self, "filter/dynamic_", {})


@dataclass(frozen=True)
class IterationRecord:
    """What one iteration's rollouts did before the update (``collect_iteration``): the module logs
    ``as_metrics`` with its own. A batch built by hand has an empty one."""

    rollout: RolloutStats | None = None  # every rank's sampled episodes
    groups: GroupStats | None = None
    shaping: OverlongStats | None = None  # ``OverlongShaping.stats`` (None without the shaping)
    # the filter's statistics (a user's filter names its own)
    filter: Mapping[str, float] = field(default_factory=dict)
    dynamic: DynamicStats | None = None
    perf: PhasePerf | None = None  # the rollout's time and tokens

    @property
    def rollout_s(self) -> float | None:
        """The rollout's time (the slowest rank's)."""
        return None if self.perf is None else self.perf.seconds

    def as_metrics(self) -> dict[str, float]:
        """rollout/*, filter/*, time/rollout and perf/rollout_*."""
        out = {} if self.rollout is None else self.rollout.as_metrics("rollout/")
        out.update({} if self.groups is None else self.groups.as_metrics("rollout/"))
        out.update({} if self.shaping is None else self.shaping.as_metrics())
        out.update({f"filter/{k}": v for k, v in self.filter.items()})
        out.update({} if self.dynamic is None else self.dynamic.as_metrics())
        return out | ({} if self.perf is None else self.perf.as_metrics("rollout"))
