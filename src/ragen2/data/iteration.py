"""One RL iteration's rollouts, plain torch, no Lightning: ``collect_iteration`` is the data side of an iteration,
read top to bottom (docs/method.md §4 and §6):

1. rounds: this rank's share of the iteration's ``groups`` rolled out by ``collect``, instance and sampler seeds
   from ``ragen2.data.seeds``. With DAPO's dynamic sampling (``sampling``), further rounds of fresh instances,
   dropping groups whose (shaped) returns are all equal, until ``groups`` groups are found over all ranks or
   ``max_rounds`` are spent; each round takes the first informative groups in global (rank-major) order. A
   short batch trains on what was found; a rank that found nothing (every rank, when nothing was found
   anywhere) holds its last round's groups, none of them trainable, so that diagnostics still see them and
   the update pads its passes with them.
2. selection: ``select_across`` by the run's ``Filter``: one selection over every rank's trainable groups, the rows
   the update trains on within them, and their share of the iteration's rows, counted once.
3. the record (``ragen2.data.record.IterationRecord``): what every rank's sampled episodes did, the filter's and
   dynamic sampling's statistics, the rollout's time.
4. the batch, built once: ``collate_episodes`` with the selection and the record (``shaping`` gives each
   episode its per-turn terms: overlong penalty per turn, truncated turns out of the loss mask).

The batch keeps every group (diagnostics read the unfiltered batch); the update trains on the kept rows.
With one process (``ranks`` left out) every collective is the identity. ``log`` records every sampled
episode, with its round and whether the update trains on it (``rollout.save_jsonl``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ragen2.agent.episode import Episode
from ragen2.data.batch import Groups, RolloutBatch, by_group, collate_episodes
from ragen2.data.group_filter import Filter, select_across
from ragen2.data.record import DynamicStats, GroupStats, IterationRecord, RolloutStats
from ragen2.data.rollout_log import RolloutLog
from ragen2.data.sampling import DynamicSampling, regroup
from ragen2.data.seeds import instance_seeds, local_groups, sampler_seed
from ragen2.data.shaping import OverlongShaping
from ragen2.distributed import ONE_PROCESS, Ranks
from ragen2.perf import phase_perf, start_phase

__all__ = ["Collect", "IterationPlan", "Rounds", "collect_iteration", "collect_rounds"]

CPU = torch.device("cpu")

#: (this rank's instance seeds of a round, its sampler seed) -> group_size episodes per seed, groups
#: numbered 0… in seed order: the runner with its sampler (``EpisodeRunner.collect``)
Collect = Callable[[list[int], int], list[Episode]]


@dataclass(frozen=True)
class IterationPlan:
    """What an iteration's rollouts are, besides the iteration: what ``collect_iteration`` reads."""

    groups: int  # rollout.groups: the iteration's, over every rank
    group_size: int  # rollout.group_size
    filter: Filter  # filter: ragen2's GroupFilter, or a user's class
    pad_id: int  # the tokenizer's padding id
    seed: int = 0  # the run's seed
    sampling: DynamicSampling | None = None  # algo.sampling
    shaping: OverlongShaping | None = None  # algo.shaping, resolved to the rollout's max_new_tokens

    @property
    def max_rounds(self) -> int:
        return 1 if self.sampling is None else self.sampling.max_rounds

    def terms(self, episodes: list[Episode]) -> list[list[tuple[float, bool]]] | None:
        """Each episode's per-turn shaping terms (None without shaping)."""
        return self.shaping.turn_terms(episodes) if self.shaping is not None else None


@dataclass(frozen=True)
class Rounds:
    """What one iteration's rounds produced on this rank, before the filter."""

    episodes: list[Episode]  # the batch's, groups numbered densely 0…groups-1
    groups: int
    trainable: torch.Tensor  # [groups] bool: False only for the degenerate groups kept when none was found
    sampled: list[list[Episode]]  # every sampled episode, per round, group ids as sampled
    placed: dict[tuple[int, int], int]  # (round, group in round) -> group in the batch
    dynamic: DynamicStats | None  # with dynamic sampling


def collect_iteration(
    iteration: int,
    plan: IterationPlan,
    collect: Collect,
    ranks: Ranks = ONE_PROCESS,
    device: torch.device = CPU,
    log: RolloutLog | None = None,
) -> RolloutBatch:
    """Steps 1–4: one iteration's batch on this rank (``device``: where the sampler's model runs, for
    ``perf/rollout_*``)."""
    start_phase(device)
    start = time.perf_counter()
    rounds = collect_rounds(iteration, plan, collect, ranks)
    rollout_s = max(ranks.gather(time.perf_counter() - start))  # the slowest rank's
    terms = plan.terms(rounds.episodes)
    groups = Groups.of(rounds.episodes, rounds.groups, terms)
    selection, stats = select_across(plan.filter, groups, rounds.trainable, ranks, iteration)
    # every rank's episodes: the logged numbers describe the whole iteration
    everyone = [eps for part in ranks.gather(rounds.sampled) for eps in part]
    sampled = [ep for eps in everyone for ep in eps]
    tokens = sum(len(t.sampled_ids) for eps in rounds.sampled for ep in eps for t in ep.turns)
    record = IterationRecord(
        rollout=RolloutStats.of(sampled),
        groups=GroupStats.of(everyone),
        shaping=None if plan.shaping is None else plan.shaping.stats(sampled),
        filter=stats,
        dynamic=rounds.dynamic,
        perf=phase_perf(tokens, rollout_s, device, ranks),
    )
    batch = collate_episodes(
        rounds.episodes, rounds.groups, plan.pad_id, iteration, terms, selection=selection, record=record
    )
    if log is not None:
        log.write(iteration, rounds.sampled, _trained(batch, rounds))
    return batch


def collect_rounds(
    iteration: int, plan: IterationPlan, collect: Collect, ranks: Ranks = ONE_PROCESS
) -> Rounds:
    """Step 1: one round, or DAPO's rounds of fresh groups until enough informative ones are found."""
    if plan.sampling is None:
        episodes = _round(iteration, 0, plan, collect, ranks)
        local = local_groups(plan.groups, ranks.world)
        placed = {(0, g): g for g in range(local)}
        return Rounds(episodes, local, torch.ones(local, dtype=torch.bool), [episodes], placed, None)
    return _dynamic(iteration, plan, plan.sampling, collect, ranks)


def _round(iteration: int, round: int, plan: IterationPlan, collect: Collect, ranks: Ranks) -> list[Episode]:
    where = {"max_rounds": plan.max_rounds, "rank": ranks.rank, "world": ranks.world}
    seeds = instance_seeds(plan.seed, iteration, plan.groups, round, **where)
    return collect(seeds, sampler_seed(plan.seed, iteration, round, **where))


def _dynamic(
    iteration: int, plan: IterationPlan, sampling: DynamicSampling, collect: Collect, ranks: Ranks
) -> Rounds:
    """Rounds of fresh groups until ``groups`` informative ones are found over all ranks or max_rounds are
    spent. Each round takes the first informative groups in global (rank-major) order."""
    local = local_groups(plan.groups, ranks.world)
    mine = range(ranks.rank * local, (ranks.rank + 1) * local)  # this rank's global group ids
    sampled: list[list[Episode]] = []
    kept: list[Episode] = []
    placed: dict[tuple[int, int], int] = {}
    dropped = found = 0
    for r in range(sampling.max_rounds):
        episodes = _round(iteration, r, plan, collect, ranks)
        sampled.append(episodes)
        round_groups = Groups.of(episodes, local, plan.terms(episodes))
        returns = by_group(round_groups.returns, round_groups.group_index, local)  # [local, K]
        informative = ranks.concat(sampling.informative(returns))  # [groups], every rank's round
        dropped += int((~informative).sum())
        taken = informative.nonzero().squeeze(-1).tolist()[: plan.groups - found]
        take = [g - mine.start for g in taken if g in mine]
        have = len(kept) // plan.group_size
        kept += regroup(episodes, take, first=have)
        placed.update({(r, g): have + i for i, g in enumerate(take)})
        found += len(taken)
        if found == plan.groups:
            break
    dynamic = DynamicStats(
        rounds=len(sampled),
        groups_sampled=len(sampled) * plan.groups,
        groups_dropped=dropped,
        groups_kept=found,
        shortfall=plan.groups - found,
    )
    n_kept = len(kept) // plan.group_size
    if n_kept == 0:
        # Nothing informative here: keep the last round's groups for diagnostics (and the update's padding
        # passes), none of them trainable.
        placed = {(len(sampled) - 1, g): g for g in range(local)}
        return Rounds(sampled[-1], local, torch.zeros(local, dtype=torch.bool), sampled, placed, dynamic)
    return Rounds(kept, n_kept, torch.ones(n_kept, dtype=torch.bool), sampled, placed, dynamic)


def _trained(batch: RolloutBatch, rounds: Rounds) -> list[list[bool]]:
    """Per round, per sampled episode: whether the update trains on it."""
    rows = {(batch.episodes[r].group, batch.episodes[r].sample) for r in batch.kept_rows.tolist()}
    return [
        [(at := rounds.placed.get((r, ep.group))) is not None and (at, ep.sample) in rows for ep in episodes]
        for r, episodes in enumerate(rounds.sampled)
    ]
