"""The SNR filter as a config object (``filter.*``): score each group of a batch, select, report (docs/method.md §4).

Each score reduces its own per-rollout quantity, read in its entry of ``ragen2.plugins.SCORES`` (registered
here, as a package outside ragen2 registers its own): episode returns for ``reward_*``, each rollout's binary
outcome (``Episode.success``) for ``success_std``, the mean next-token entropy the sampler recorded over the
rollout's sampled positions for ``entropy*``, the rollout's sampled tokens for ``length``. The selection
itself is the pure ``select_groups``; this object holds the knobs and refuses values that cannot work at
construction. With ``monitor`` the filter only reports: ``filter/*`` describe the groups it would keep, and
every group trains.

Two levels, composed: ``select`` chooses groups (one decision over every rank's gathered scores), and
``rows`` chooses rollouts within each group: all of them by default, or with ``trajectory_fraction`` < 1
the most extreme returns (``extreme_rows``; the paper's trajectory-level control is ``strategy=none``,
``trajectory_fraction=0.5``: every prompt, half of its rollouts). A rank holds whole groups, so the row
choice is local to it. ``select_across`` is an iteration's whole choice across data-parallel ranks, for any
``Filter``: each rank's trainable groups scored, one selection over all of them, each rank's slice of it,
its rows, and the kept share (``KeptShare``) counted once over every rank.

The update computes advantages on the rows it trains on. For a group-level filter those are whole
groups, so group statistics are untouched by the filter. Under a trajectory-level filter a group's mean
and std (GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline) are those of its kept extremes. Why: the reference
computes advantages after its filter, on the filtered batch, so a filter that drops rollouts there does
the same; every estimator then sees exactly the rows that train, critic values, KL in the reward and
whitening included, and no forward is spent on a dropped row; and GAE (PPO, whose Sokoban baseline, 12.9,
is the no-filter row of the paper's Table 7) has no group statistics at all, only whitening over the
trained rows, as with a group-level filter.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from ragen2 import plugins
from ragen2.algos.filters import extreme_rows, filter_stats, group_scores, select_groups
from ragen2.data.batch import Grouped, KeptShare, Selection, by_group, ungroup
from ragen2.distributed import ONE_PROCESS, Ranks
from ragen2.errors import ConfigError


class Filter(Protocol):
    """What an iteration needs of ``filter``: ``GroupFilter``, or a class of the user's (``filter._target_``).

    ``select_across`` makes the iteration's choice across data-parallel ranks from the three methods below,
    and N ranks choose as one rank would when each keeps this contract:

    - ``scores(groups)``: [G] one score per group of this rank's ``groups`` alone; no collective.
    - ``select(scores, iteration)``: -> (keep [G] bool, ``filter/*`` stats). Every rank calls it with the
      same scores (every rank's trainable groups', concatenated in rank order) and the same iteration, and
      must return the same keep: a function of its arguments and the filter's settings alone (random draws
      from a generator seeded by them, never the global RNG or the rank), and no collective.
    - ``rows(groups)``: [B] bool, the rollouts the update may train on within each group of this rank's;
      decided group by group, so each rank decides for its own; no collective.

    A dataclass: its fields are the run's filter settings (``RolloutDataModule.state_dict`` records them).
    ``check_sampler`` refuses, at construction, a sampler (class or factory) whose rollouts the scores
    cannot read.
    """

    __dataclass_fields__: ClassVar[dict[str, Any]]

    def check_sampler(self, sampler: Any) -> None: ...

    def scores(self, groups: Grouped) -> torch.Tensor: ...

    def select(self, scores: torch.Tensor, iteration: int) -> tuple[torch.Tensor, dict[str, float]]: ...

    def rows(self, groups: Grouped) -> torch.Tensor: ...


def returns(batch: Grouped) -> torch.Tensor:
    """[B] each rollout's return."""
    return batch.returns


def entropies(batch: Grouped) -> torch.Tensor:
    """[B] each rollout's mean token entropy, as the sampler recorded it (``check_sampler`` refuses a
    sampler that records none)."""
    values = [ep.mean_entropy for ep in batch.episodes]
    if any(v is None for v in values):
        raise ValueError(
            "filter.score ranks by entropy, but these episodes carry no recorded entropies; use a sampler "
            "that records them (rollout=hf)"
        )
    return torch.tensor(values, dtype=torch.float64)


def lengths(batch: Grouped) -> torch.Tensor:
    """[B] each rollout's sampled tokens."""
    return torch.tensor([ep.sampled_tokens for ep in batch.episodes], dtype=torch.float64)


def successes(batch: Grouped) -> torch.Tensor:
    """[B] each rollout's binary outcome: 1 solved, 0 not."""
    return torch.tensor([float(ep.success) for ep in batch.episodes], dtype=torch.float64)


def _std(values: torch.Tensor) -> torch.Tensor:
    return values.std(dim=1)  # Bessel-corrected: the reference's "RV"


def _var(values: torch.Tensor) -> torch.Tensor:
    return values.var(dim=1)


def _mean(values: torch.Tensor) -> torch.Tensor:
    return values.mean(dim=1)


Reads = Callable[[Grouped], torch.Tensor]
Reduce = Callable[[torch.Tensor], torch.Tensor]


def _register(scores: dict[str, tuple[Reads, Reduce]]) -> None:
    """Each score under its name; a spread (std, var) needs 2 rollouts per group."""
    for name, (reads, reduce) in scores.items():
        plugins.score(name, reads, 2 if reduce in (_std, _var) else 1)(reduce)


_register(
    {
        "reward_std": (returns, _std),
        "reward_var": (returns, _var),
        "reward_mean": (returns, _mean),
        # with shaped rewards (Sokoban's step and box terms) a group that never succeeds still has return
        # variance and survives reward_std; its success_std is 0, and the zero drop removes it
        "success_std": (successes, _std),
        "entropy": (entropies, _mean),
        "entropy_std": (entropies, _std),
        "length": (lengths, _mean),
    }
)


@dataclass(frozen=True)
class GroupFilter:
    """Keeps the groups with the most signal; ``strategy="none"`` keeps every group (the no-filter baseline).
    Within kept groups, ``trajectory_fraction`` < 1 keeps only the rollouts with the most extreme returns."""

    score: str = "reward_std"
    """reward_std (the reference's "RV") | reward_var | reward_mean | success_std (the std of the binary
    outcome: with shaped rewards, a group that never succeeds scores 0) | entropy | entropy_std | length, or
    a score a package registers (``ragen2.plugins``)."""
    strategy: str = "top_p"
    """top_p | top_k | top_k_abs | min_p | quantile | random_drop | none, or a strategy a package registers
    (``ragen2.plugins``)."""
    value: float = 0.9
    """top_p: the share of the total score to keep, > 0 (≥ 1 keeps every candidate); top_k: a fraction of groups; top_k_abs: a
    count; min_p: the fraction of the best score; quantile: the band, 1 (highest scores) … ``bands``."""
    mode: str = "linear"
    """top_p: linear (recommended) | softmax (depends on the scale of the scores)."""
    include_zero: bool = False
    """Whether zero-score groups (no reward variance) may be kept."""
    eps: float = 0.01
    """top_p linear: the kept prefix must reach p·Σs − eps."""
    largest: bool = True
    """Keep the highest scores (False: the lowest)."""
    bands: int = 4
    """quantile: the number of equal-count bands of groups (4: quartiles)."""
    trajectory_fraction: float = 1.0
    """The share of each kept group's rollouts the update trains on, in (0, 1]: the most extreme returns,
    half from the top and half from the bottom (at least one of each); 1 trains on every rollout."""
    monitor: bool = False
    """Report only: ``filter/*`` describe the groups the filter would keep, and every group trains."""
    seed: int = 0
    """random_drop: its draws, with the iteration's number (the run's seed in conf/filter/random_drop.yaml)."""

    def __post_init__(self) -> None:
        if self.score not in plugins.SCORES:
            raise ConfigError(f"filter.score={self.score!r} is unknown. Fix: choose one of {plugins.SCORES}")
        if not 0 < self.trajectory_fraction <= 1:
            raise ConfigError(
                f"filter.trajectory_fraction={self.trajectory_fraction}: the share of each group's rollouts "
                "trained on, in (0, 1] (1 trains on every rollout). Fix: filter.trajectory_fraction=0.5 "
                "(the paper's trajectory-level control) or 1"
            )
        try:  # the strategy's own check of value/mode/eps/bands, once (and warns once for softmax mode)
            select_groups(
                torch.ones(2),
                self.strategy,
                self.value,
                mode=self.mode,
                eps=self.eps,
                bands=self.bands,
                generator=torch.Generator(),
            )
        except ValueError as err:
            raise ConfigError(str(err)) from err

    def check_sampler(self, sampler: Any) -> None:
        """Refuse a score that ranks by token entropies with a sampler (class or factory) that records none."""
        sampler = getattr(sampler, "func", sampler)  # a Hydra partial: the class it builds
        if plugins.SCORES[self.score].reads is entropies and not getattr(sampler, "records_entropy", False):
            raise ConfigError(
                f"filter.score={self.score!r} ranks groups by the sampler's token entropies, which "
                f"{getattr(sampler, '__name__', sampler)} does not record. Fix: rollout=hf, or a "
                "reward or length score."
            )

    def scores(self, batch: Grouped) -> torch.Tensor:
        """[G] the score of each of the batch's groups."""
        score = plugins.SCORES[self.score]
        values = by_group(score.reads(batch), batch.group_index, batch.num_groups)  # [G, K]
        return group_scores(values, score.reduce, self.score, score.min_rollouts)

    def select(self, scores: torch.Tensor, iteration: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
        """[G] scores -> (keep [G], filter/* stats): one decision over every group it is given (across
        ranks, the iteration's gathered scores); under ``monitor`` every group is kept and the stats
        describe the decision. ``random_drop`` draws from ``seed`` and ``iteration``: a resumed run, and
        every rank, draws what an uninterrupted single process would."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + iteration)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # already warned at construction
            keep = select_groups(
                scores,
                self.strategy,
                self.value,
                mode=self.mode,
                include_zero=self.include_zero,
                eps=self.eps,
                largest=self.largest,
                bands=self.bands,
                generator=generator,
            )
        return (torch.ones_like(keep) if self.monitor else keep), filter_stats(scores, keep)

    def rows(self, batch: Grouped) -> torch.Tensor:
        """[B] bool: the rows the update may train on within their groups (every row unless
        ``trajectory_fraction`` < 1); per group, so each rank decides for its own groups."""
        grouped = by_group(batch.returns, batch.group_index, batch.num_groups)  # [G, K]
        return ungroup(extreme_rows(grouped, self.trajectory_fraction), batch.group_index)

    def __call__(
        self, batch: Grouped, iteration: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """The batch's groups -> (keep [G], scores [G], filter/* stats)."""
        scores = self.scores(batch)
        keep, stats = self.select(scores, iteration)
        return keep, scores, stats


def select_across(
    filter: Filter, groups: Grouped, trainable: torch.Tensor, ranks: Ranks = ONE_PROCESS, iteration: int = 0
) -> tuple[Selection, dict[str, float]]:
    """This rank's ``groups`` -> (what the update trains on, filter/* stats): one selection by ``filter`` over
    every rank's trainable groups ([G] bool ``trainable``: False only for the degenerate groups dynamic
    sampling holds when it found none), the rows within the kept ones, and the kept share."""
    scores = filter.scores(groups)
    anywhere = ranks.any(bool(trainable.any()))
    # nothing trainable on any rank: every group is scored (the stats still describe them), none kept
    pool = trainable if anywhere else torch.ones_like(trainable)
    everyone = ranks.concat(scores[pool])
    keep_all, stats = filter.select(everyone, iteration)
    pooled = int(pool.sum())
    first, _ = ranks.offset(pooled)
    keep = torch.zeros_like(trainable)
    keep[pool] = keep_all[first : first + pooled]
    if not anywhere:
        keep &= trainable
        stats = filter_stats(everyone, torch.zeros_like(keep_all))
    keep_rows = filter.rows(groups)
    kept_rows = int((keep[groups.group_index] & keep_rows).sum())
    counts = ranks.gather((int(keep.sum()), kept_rows, int(keep_rows.numel())))  # per rank
    kept = [k for _, k, _ in counts]
    share = KeptShare(sum(kept[: ranks.rank]), sum(kept), sum(rows for _, _, rows in counts))
    groups_kept = [g for g, _, _ in counts]
    stats.update(
        kept_groups_rank_min=float(min(groups_kept)),
        kept_groups_rank_max=float(max(groups_kept)),
        kept_rows=float(share.kept),
        kept_row_ratio=share.ratio,
    )
    return Selection(keep, scores, keep_rows, share), stats
