"""RolloutDataModule: every epoch rolls out the current policy and filters the groups.

One RL iteration = one Lightning epoch (``reload_dataloaders_every_n_epochs=1``): ``train_dataloader``
syncs the sampler to the policy, collects ``groups × group_size`` episodes and computes the filter
mask. The batch keeps every group (diagnostics read the unfiltered batch); the module trains on the
kept ones. Instance seeds, sampler seeds and everything random here derive from (seed, iteration,
rank, round), so a run resumed from ``last.ckpt`` rolls out exactly what an uninterrupted run would.

Optional DAPO data steps (METHOD.md §6), both off by default:
- ``shaping`` (``OverlongShaping``) gives each round's collation its per-turn terms: overlong penalty
  per turn, truncated turns out of the loss mask.
- ``sampling`` (``DynamicSampling``) rolls out further rounds of fresh instances, dropping groups whose
  (shaped) returns are all equal, until ``groups`` groups are found or ``max_rounds`` are spent. A short
  batch trains on what was found; when nothing was found the batch holds the last round's groups with
  ``keep`` all False, so diagnostics still see them and the module takes its "kept no group" path.
The SNR filter then runs on the resulting batch, as without dynamic sampling.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import ragen2_envs
import torch

from ragen2.agent.episode import Episode
from ragen2.agent.runner import AgentConfig, EpisodeRunner
from ragen2.algos.filters import filter_stats
from ragen2.data.batch import RolloutBatch, collate_episodes, returns_by_group
from ragen2.data.filtering import GroupFilter
from ragen2.data.metrics import evaluate, rollout_metrics
from ragen2.data.sampling import DynamicSampling, regroup
from ragen2.data.shaping import OverlongShaping
from ragen2.models.loading import load_tokenizer
from ragen2.rollout.base import Sampler, SamplingParams

VAL_SEED_OFFSET = 1_000_000_007  # held-out instances never collide with training seeds
# Dynamic sampling's later rounds draw instance and sampler seeds above both round 0's and validation's.
RESAMPLE_SEED_OFFSET = 2_000_000_011


@dataclass(frozen=True)
class EnvSpec:
    id: str
    max_turns: int
    max_actions_per_turn: int
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class ValSpec:
    every_n_iterations: int = 0  # 0 = no validation
    num_seeds: int = 8
    samples: int = 4  # sampled rollouts per seed, for pass@k
    k: int = 4

    def __post_init__(self) -> None:
        if self.every_n_iterations and self.k > self.samples:
            raise ValueError(f"val.k={self.k} exceeds val.samples={self.samples}; pass@k needs samples ≥ k")


@dataclass
class _Rounds:
    """What one iteration's rounds produced, before the SNR filter."""

    batch: RolloutBatch
    trainable: torch.Tensor  # [G] bool: False only for the degenerate groups kept when none was found
    episodes: list[list[Episode]]  # every sampled episode, per round, group ids as sampled
    placed: dict[tuple[int, int], int]  # (round, group in round) -> group in the batch
    metrics: dict[str, float]  # filter/dynamic_*


class _Once(torch.utils.data.IterableDataset):
    """Yields one pre-built batch: a Lightning epoch is one RL iteration."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __iter__(self) -> Iterator[Any]:
        yield self.batch

    def __len__(self) -> int:
        return 1


def _loader(batch: Any) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(_Once(batch), batch_size=None, collate_fn=lambda x: x)


class RolloutDataModule(L.LightningDataModule):
    def __init__(
        self,
        env: dict[str, Any],
        tokenizer: str,
        sampler: Callable[[Any], Sampler],
        filter: GroupFilter,
        groups: int = 4,
        group_size: int = 4,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_context: int = 4096,
        format_penalty: float = -0.1,
        seed: int = 0,
        val: dict[str, Any] | None = None,
        save_jsonl: bool = False,
        output_dir: str | None = None,
        sampling: DynamicSampling | Mapping[str, Any] | None = None,
        shaping: OverlongShaping | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.env = EnvSpec(
            id=env["id"],
            max_turns=int(env["max_turns"]),
            max_actions_per_turn=int(env["max_actions_per_turn"]),
            kwargs=dict(env.get("kwargs") or {}),
        )
        if group_size < 2:
            raise ValueError(
                f"rollout.group_size={group_size}: group-relative advantages and the reward-variance filter "
                "need at least 2 rollouts per group. Fix: rollout.group_size=4 (or more)."
            )
        if groups < 1:
            raise ValueError(f"rollout.groups={groups} must be ≥ 1")
        self.tokenizer_name = tokenizer
        self.sampler_factory = sampler
        self.filter = filter
        self.groups, self.group_size = groups, group_size
        self.params = SamplingParams(
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k
        )
        self.agent_cfg = AgentConfig(
            max_turns=self.env.max_turns,
            max_actions_per_turn=self.env.max_actions_per_turn,
            format_penalty=format_penalty,
            max_context=max_context,
        )
        self.seed = seed
        self.sampling = DynamicSampling(**sampling) if isinstance(sampling, Mapping) else sampling
        shaping = OverlongShaping(**shaping) if isinstance(shaping, Mapping) else shaping
        self.shaping = shaping.resolve(max_new_tokens) if shaping is not None else None
        self.val = ValSpec(**(val or {}))
        self.save_jsonl = save_jsonl
        self.output_dir = output_dir
        self.tokenizer: Any = None
        self.sampler: Sampler | None = None
        self.runner: EpisodeRunner | None = None

    # ---- set-up -----------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self.runner is not None:
            return
        ragen2_envs.make(self.env.id, **self.env.kwargs)  # fail fast on a bad env id or knob
        self.tokenizer = load_tokenizer(self.tokenizer_name)
        self.sampler = self.sampler_factory(self.tokenizer)
        self.runner = EpisodeRunner(
            lambda: ragen2_envs.make(self.env.id, **self.env.kwargs),
            self.tokenizer,
            self.agent_cfg,
            self.params,
            env_id=self.env.id,
        )

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _policy(self) -> Any:
        trainer = self.trainer
        return None if trainer is None else trainer.lightning_module.policy

    def _resample_slot(self, iteration: int, round: int) -> int:
        """A distinct index per (iteration, rank, round ≥ 1): max_rounds − 1 slots per (iteration, rank)."""
        if self.sampling is None or not 1 <= round < self.sampling.max_rounds:
            raise ValueError(
                f"round {round} does not exist: later rounds need data.sampling.max_rounds > {round}"
            )
        rank, world = self._rank()
        return (iteration * world + rank) * (self.sampling.max_rounds - 1) + round - 1

    def train_seeds(self, iteration: int, round: int = 0) -> list[int]:
        """Instance seeds of one round; round 0 is the only round without dynamic sampling."""
        if round == 0:
            rank, world = self._rank()
            first = self.seed * 1_000_003 + (iteration * world + rank) * self.groups
        else:
            first = (
                RESAMPLE_SEED_OFFSET
                + self.seed * 1_000_003
                + self._resample_slot(iteration, round) * self.groups
            )
        return list(range(first, first + self.groups))

    def sample_seed(self, iteration: int, round: int = 0) -> int:
        """The sampler's seed for one round (the runner derives one per turn from it)."""
        if round == 0:
            rank, _ = self._rank()
            return self.seed * 7919 + iteration * 104_729 + rank
        return RESAMPLE_SEED_OFFSET + self.seed * 7919 + self._resample_slot(iteration, round)

    # ---- rollouts ---------------------------------------------------------------------------
    def _collate(self, episodes: list[Episode], num_groups: int, iteration: int) -> RolloutBatch:
        terms = self.shaping.turn_terms(episodes) if self.shaping is not None else None
        return collate_episodes(episodes, num_groups, self.tokenizer.pad_token_id, iteration, terms)

    def _collect(self, iteration: int, round: int) -> list[Episode]:
        assert self.runner is not None and self.sampler is not None
        return self.runner.collect(
            self.sampler,
            self.train_seeds(iteration, round),
            self.group_size,
            sample_seed=self.sample_seed(iteration, round),
        )

    def _single(self, iteration: int) -> _Rounds:
        episodes = self._collect(iteration, 0)
        return _Rounds(
            batch=self._collate(episodes, self.groups, iteration),
            trainable=torch.ones(self.groups, dtype=torch.bool),
            episodes=[episodes],
            placed={(0, g): g for g in range(self.groups)},
            metrics={},
        )

    def _dynamic(self, iteration: int) -> _Rounds:
        """Rounds of fresh groups until ``groups`` informative ones are found or max_rounds are spent."""
        assert self.sampling is not None
        rounds: list[list[Episode]] = []
        kept: list[Episode] = []
        placed: dict[tuple[int, int], int] = {}
        dropped = 0
        last: RolloutBatch | None = None
        for r in range(self.sampling.max_rounds):
            episodes = self._collect(iteration, r)
            rounds.append(episodes)
            last = self._collate(episodes, self.groups, iteration)
            informative = self.sampling.informative(
                returns_by_group(last.returns, last.group_index, self.groups)
            )
            dropped += int((~informative).sum())
            found = len(kept) // self.group_size
            take = informative.nonzero().squeeze(-1).tolist()[: self.groups - found]
            kept += regroup(episodes, take, first=found)
            placed.update({(r, g): found + i for i, g in enumerate(take)})
            if len(kept) // self.group_size == self.groups:
                break
        assert last is not None
        n_kept = len(kept) // self.group_size
        metrics = {
            "filter/dynamic_rounds": float(len(rounds)),
            "filter/dynamic_groups_sampled": float(len(rounds) * self.groups),
            "filter/dynamic_groups_dropped": float(dropped),
            "filter/dynamic_groups_kept": float(n_kept),
            "filter/dynamic_shortfall": float(self.groups - n_kept),
        }
        if n_kept == 0:
            # Nothing informative: keep the last round's groups for diagnostics, none of them trainable.
            placed = {(len(rounds) - 1, g): g for g in range(self.groups)}
            return _Rounds(last, torch.zeros(self.groups, dtype=torch.bool), rounds, placed, metrics)
        batch = self._collate(kept, n_kept, iteration)
        return _Rounds(batch, torch.ones(n_kept, dtype=torch.bool), rounds, placed, metrics)

    def rollout(self, iteration: int) -> RolloutBatch:
        """Collect and filter one iteration's batch (also callable from a notebook, without a Trainer)."""
        self.setup()
        assert self.runner is not None and self.sampler is not None
        policy = self._policy()
        if policy is not None:
            self.sampler.sync_weights(policy)
        start = time.perf_counter()
        out = self._single(iteration) if self.sampling is None else self._dynamic(iteration)
        rollout_s = time.perf_counter() - start
        batch = out.batch
        keep, scores, stats = self.filter(
            returns_by_group(batch.returns, batch.group_index, batch.num_groups)
        )
        if not bool(out.trainable.all()):
            keep = keep & out.trainable
            stats = filter_stats(scores, keep)
        batch.keep, batch.group_scores = keep, scores
        sampled = [ep for episodes in out.episodes for ep in episodes]
        batch.metrics.update({f"rollout/{k}": v for k, v in rollout_metrics(sampled).items()})
        if self.shaping is not None:
            batch.metrics.update({f"rollout/{k}": v for k, v in self.shaping.metrics(sampled).items()})
        batch.metrics.update({f"filter/{k}": v for k, v in stats.items()})
        batch.metrics.update(out.metrics)
        batch.metrics["time/rollout"] = rollout_s
        if self.save_jsonl:
            self._write_jsonl(out.episodes, out.placed, iteration, keep)
        return batch

    def _write_jsonl(
        self,
        rounds: list[list[Episode]],
        placed: dict[tuple[int, int], int],
        iteration: int,
        keep: torch.Tensor,
    ) -> None:
        """Every sampled episode, with its round and whether the update trains on it (group = in-round)."""
        rank, _ = self._rank()
        root = Path(self.output_dir or (self.trainer.default_root_dir if self.trainer else "."))
        root.mkdir(parents=True, exist_ok=True)
        with (root / f"rollouts.rank{rank}.jsonl").open("a") as f:
            for r, episodes in enumerate(rounds):
                for ep in episodes:
                    at = placed.get((r, ep.group))
                    kept = at is not None and bool(keep[at])
                    record = {"iteration": iteration, "round": r, "kept": kept, **ep.to_record()}
                    f.write(json.dumps(record) + "\n")

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        iteration = self.trainer.current_epoch if self.trainer is not None else 0
        return _loader(self.rollout(iteration))

    def validation_rollout(self) -> dict[str, float]:
        """Greedy success and sampled pass@k on held-out instance seeds."""
        self.setup()
        assert self.runner is not None and self.sampler is not None
        policy = self._policy()
        if policy is not None:
            self.sampler.sync_weights(policy)
        start = time.perf_counter()
        seeds = [VAL_SEED_OFFSET + self.seed * 10_007 + i for i in range(self.val.num_seeds)]
        greedy_runner = EpisodeRunner(
            self.runner.env_factory,
            self.tokenizer,
            self.agent_cfg,
            SamplingParams(max_new_tokens=self.params.max_new_tokens, temperature=0.0),
            env_id=self.env.id,
        )
        ks = sorted({1, self.val.k})
        out = evaluate(
            self.runner, greedy_runner, self.sampler, seeds, self.val.samples, ks, sample_seed=self.seed
        )
        return {
            "val/success": out["greedy/success"],
            "val/return": out["greedy/return"],
            "val/sampled_success": out["sampled/success"],
            **{f"val/pass@{k}": out[f"pass@{k}"] for k in ks},
            "time/validation": time.perf_counter() - start,
        }

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return _loader(self.validation_rollout())
