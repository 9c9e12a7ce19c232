"""RolloutDataModule: every epoch rolls out the current policy and filters the groups.

One RL iteration = one Lightning epoch (``reload_dataloaders_every_n_epochs=1``): ``train_dataloader``
syncs the sampler to the policy, collects ``groups × group_size`` episodes and computes the filter
mask. The batch keeps every group (diagnostics read the unfiltered batch); the module trains on the
kept ones. Instance seeds, sampler seeds and everything random here derive from (seed, iteration,
rank, round), so a run resumed from ``last.ckpt`` rolls out exactly what an uninterrupted run would.

Across data-parallel ranks (``ragen2.distributed``), ``rollout.groups`` is the iteration's global count:
each rank rolls out its ``groups / world`` share (global group g has the same instance seed whatever
the world size), the group scores are gathered and the SNR filter makes one selection over all of
them, and each rank keeps its own slice. ``rollout/*`` and ``filter/*`` describe the whole iteration.

Optional DAPO data steps (docs/method.md §6), both off by default:
- ``shaping`` (``OverlongShaping``) gives each round's collation its per-turn terms: overlong penalty
  per turn, truncated turns out of the loss mask.
- ``sampling`` (``DynamicSampling``) rolls out further rounds of fresh instances, dropping groups whose
  (shaped) returns are all equal, until ``groups`` groups are found over all ranks or ``max_rounds``
  are spent. A short batch trains on what was found; a rank that found nothing (every rank, when
  nothing was found anywhere) holds its last round's groups with ``keep`` all False, so diagnostics
  still see them and the module pads its passes with them.
The SNR filter then runs on the resulting batch, as without dynamic sampling.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch

from ragen2.agent.episode import Episode
from ragen2.agent.runner import EpisodeRunner
from ragen2.algos.filters import filter_stats
from ragen2.data.batch import KeptShare, RolloutBatch, by_group, collate_episodes
from ragen2.data.contracts import held_policy
from ragen2.data.evaluation import evaluate, heldout_seeds, validation_metrics
from ragen2.data.group_filter import GroupFilter
from ragen2.data.metrics import group_metrics, rollout_metrics
from ragen2.data.rollout_config import EnvConfig, RolloutConfig, ValConfig
from ragen2.data.sampling import DynamicSampling, regroup
from ragen2.data.shaping import OverlongShaping
from ragen2.distributed import Ranks
from ragen2.errors import ConfigError
from ragen2.models.loading import load_tokenizer
from ragen2.models.placement import AUTOCAST
from ragen2.models.weights import full_named_tensors, weights_version
from ragen2.perf import phase_metrics, start_phase
from ragen2.rollout.base import Sampler
from ragen2.settings import settings

# Dynamic sampling's later rounds draw instance and sampler seeds above both round 0's and the held-out
# ones (ragen2.data.evaluation.VAL_SEED_OFFSET).
RESAMPLE_SEED_OFFSET = 2_000_000_011


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


def _is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _device(model: Any) -> torch.device:
    """The device the sampler's model lives on (the CPU without one: scripted responses)."""
    return next(model.parameters()).device if model is not None else torch.device("cpu")


def _tied_names(model: Any) -> set[str]:
    """State-dict names that alias another parameter (an LM head tied to the embeddings)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        seen.setdefault(id(p), name)
    return tied


def _loader(batch: Any) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(_Once(batch), batch_size=None, collate_fn=lambda x: x)


class RolloutDataModule(L.LightningDataModule):
    """Rolls out, shapes and filters one iteration's groups; validation rolls out held-out seeds.

    Reads of the LightningModule only what ``HoldsPolicy`` declares (the policy, synced into the sampler
    every iteration). A checkpoint records the env and rollout settings (``state_dict``), so
    ``ragen2-eval`` evaluates a checkpoint with the settings it was trained with.
    """

    def __init__(
        self,
        env: EnvConfig | Mapping[str, Any],
        rollout: RolloutConfig | Mapping[str, Any],
        tokenizer: str,
        filter: GroupFilter,
        seed: int = 0,
        val: ValConfig | Mapping[str, Any] | None = None,
        output_dir: str | None = None,
        sampling: DynamicSampling | Mapping[str, Any] | None = None,
        shaping: OverlongShaping | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.env = settings(EnvConfig, env, "env")
        self.rollout_cfg = settings(RolloutConfig, rollout, "rollout")
        self.filter = filter
        sampler_cls = getattr(self.rollout_cfg.sampler, "func", self.rollout_cfg.sampler)
        if filter.needs_entropy and not getattr(sampler_cls, "records_entropy", False):
            raise ConfigError(
                f"filter.score={filter.score!r} ranks groups by the sampler's token entropies, which "
                f"{getattr(sampler_cls, '__name__', sampler_cls)} does not record. Fix: rollout=hf, or a "
                "reward or length score."
            )
        self.tokenizer_name = tokenizer
        self.seed = seed
        self.sampling = DynamicSampling(**sampling) if isinstance(sampling, Mapping) else sampling
        shaping = OverlongShaping(**shaping) if isinstance(shaping, Mapping) else shaping
        self.shaping = shaping.resolve(self.rollout_cfg.max_new_tokens) if shaping is not None else None
        self.val = settings(ValConfig, val, "val")
        self.output_dir = output_dir
        self.tokenizer: Any = None
        self._full_policy: Any = None  # trainer=fsdp: the unsharded copy the sampler samples from
        self._synced: tuple[int, int] | None = None
        self._jsonl_trimmed = False  # rollouts.rank<r>.jsonl cut back to before this run's first iteration
        self.sampler: Sampler | None = None
        self.runner: EpisodeRunner | None = None

    @property
    def groups(self) -> int:
        """Groups per iteration (``rollout.groups``)."""
        return self.rollout_cfg.groups

    @property
    def local_groups(self) -> int:
        """Groups this rank rolls out per round: its share of ``groups``."""
        ranks = self._ranks()
        if self.groups % ranks.world:
            raise ConfigError(
                f"rollout.groups={self.groups} does not divide among {ranks.world} ranks: each rank rolls "
                f"out an equal share of the iteration's groups. Fix: rollout.groups a multiple of "
                f"{ranks.world}, or trainer.devices dividing {self.groups}."
            )
        return self.groups // ranks.world

    @property
    def group_size(self) -> int:
        """Rollouts per group (``rollout.group_size``)."""
        return self.rollout_cfg.group_size

    # ---- set-up -----------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self.runner is not None:
            return
        self.env.make()  # fail fast on a bad env knob
        self.tokenizer = load_tokenizer(self.tokenizer_name)
        self.sampler = self.rollout_cfg.sampler(self.tokenizer)
        self.runner = self.rollout_cfg.runner(self.env, self.tokenizer)

    def teardown(self, stage: str) -> None:
        """At the end of fit, release the sampler: an in-process vLLM engine holds its memory and, alone in
        its process, the torch.distributed group it made (``VLLMSampler.close``)."""
        getattr(self.sampler, "close", lambda: None)()
        self.sampler = self.runner = None

    def state_dict(self) -> dict[str, Any]:
        """The env and rollout settings the run trained with (read back by ``ragen2-eval``)."""
        return {"env": asdict(self.env), "rollout": self.rollout_cfg.saved()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Settings come from the config; the saved ones only document the run."""

    def _ranks(self) -> Ranks:
        return Ranks.current() if self.trainer is not None else Ranks()

    def _policy(self) -> Any:
        """The model the sampler samples from: the module's policy, or under FSDP a full copy of it."""
        module = None if self.trainer is None else self.trainer.lightning_module
        policy = held_policy(module)
        return self._unsharded(policy) if _is_sharded(policy) else policy

    def _precision(self, device: torch.device) -> AbstractContextManager:
        """The update's autocast under a mixed precision (``bf16-mixed``): the sampler computes the log-probs
        the update recomputes with the same numerics, at bf16 speed. Off otherwise."""
        dtype = self._autocast_dtype()
        return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()

    def _autocast_dtype(self) -> torch.dtype | None:
        """The mixed precision's compute dtype (``bf16-mixed``: bf16), None without one."""
        return AUTOCAST.get(str(self.trainer.precision)) if self.trainer is not None else None

    def _unsharded(self, policy: Any) -> Any:
        """A full copy of an FSDP-sharded policy, refreshed from every rank's shards (a collective: every
        rank rolls out). HF generate stops early on some ranks and would desynchronise the sharded
        model's per-forward gathers; the copy samples without any collective."""
        from transformers import AutoModelForCausalLM

        if self._full_policy is None:
            # on this rank's compute device (its shards'), not the CPU from_config defaults to; in the
            # dtype the sharded policy computes in (bf16 under bf16-*: FSDP's param_dtype), which also
            # keeps the copy at half the size of fp32 weights beside the update's optimizer state
            dtype = self._autocast_dtype() or policy.dtype
            with torch.device(_device(policy)):
                full = AutoModelForCausalLM.from_config(policy.config, dtype=dtype)
            self._full_policy = full.eval()
        if self._synced != weights_version(policy):
            weights = dict(full_named_tensors(policy))
            missing = self._full_policy.load_state_dict(weights, strict=False).missing_keys
            self._full_policy.tie_weights()
            untied = [k for k in missing if k not in _tied_names(self._full_policy)]
            assert not untied, f"the sampling copy lacks {untied}"
            self._synced = weights_version(policy)
        return self._full_policy

    def _resample_slot(self, iteration: int, round: int) -> int:
        """A distinct index per (iteration, round ≥ 1): max_rounds − 1 slots per iteration."""
        if self.sampling is None or not 1 <= round < self.sampling.max_rounds:
            raise ValueError(
                f"round {round} does not exist: later rounds need algo.sampling.max_rounds > {round}"
            )
        return iteration * (self.sampling.max_rounds - 1) + round - 1

    def train_seeds(self, iteration: int, round: int = 0) -> list[int]:
        """This rank's instance seeds of one round (global groups rank·local … rank·local + local − 1);
        round 0 is the only round without dynamic sampling."""
        slot = iteration if round == 0 else self._resample_slot(iteration, round)
        base = self.seed * 1_000_003 + (0 if round == 0 else RESAMPLE_SEED_OFFSET)
        local = self.local_groups
        first = base + slot * self.groups + self._ranks().rank * local
        return list(range(first, first + local))

    def sample_seed(self, iteration: int, round: int = 0) -> int:
        """This rank's sampler seed for one round (the runner derives one per turn from it)."""
        ranks = self._ranks()
        if round == 0:
            return self.seed * 7919 + iteration * 104_729 + ranks.rank
        slot = self._resample_slot(iteration, round) * ranks.world + ranks.rank
        return RESAMPLE_SEED_OFFSET + self.seed * 7919 + slot

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
        local = self.local_groups
        return _Rounds(
            batch=self._collate(episodes, local, iteration),
            trainable=torch.ones(local, dtype=torch.bool),
            episodes=[episodes],
            placed={(0, g): g for g in range(local)},
            metrics={},
        )

    def _dynamic(self, iteration: int) -> _Rounds:
        """Rounds of fresh groups until ``groups`` informative ones are found over all ranks or max_rounds
        are spent. Each round takes the first informative groups in global (rank-major) order."""
        assert self.sampling is not None
        ranks, local = self._ranks(), self.local_groups
        mine = range(ranks.rank * local, (ranks.rank + 1) * local)  # this rank's global group ids
        rounds: list[list[Episode]] = []
        kept: list[Episode] = []
        placed: dict[tuple[int, int], int] = {}
        dropped = found = 0
        last: RolloutBatch | None = None
        for r in range(self.sampling.max_rounds):
            episodes = self._collect(iteration, r)
            rounds.append(episodes)
            last = self._collate(episodes, local, iteration)
            informative = ranks.concat(
                self.sampling.informative(by_group(last.returns, last.group_index, local))
            )  # [groups], every rank's round
            dropped += int((~informative).sum())
            taken = informative.nonzero().squeeze(-1).tolist()[: self.groups - found]
            take = [g - mine.start for g in taken if g in mine]
            have = len(kept) // self.group_size
            kept += regroup(episodes, take, first=have)
            placed.update({(r, g): have + i for i, g in enumerate(take)})
            found += len(taken)
            if found == self.groups:
                break
        assert last is not None
        n_kept = len(kept) // self.group_size
        metrics = {
            "filter/dynamic_rounds": float(len(rounds)),
            "filter/dynamic_groups_sampled": float(len(rounds) * self.groups),
            "filter/dynamic_groups_dropped": float(dropped),
            "filter/dynamic_groups_kept": float(found),
            "filter/dynamic_shortfall": float(self.groups - found),
        }
        if n_kept == 0:
            # Nothing informative here: keep the last round's groups for diagnostics (and the update's
            # padding passes), none of them trainable.
            placed = {(len(rounds) - 1, g): g for g in range(local)}
            return _Rounds(last, torch.zeros(local, dtype=torch.bool), rounds, placed, metrics)
        batch = self._collate(kept, n_kept, iteration)
        return _Rounds(batch, torch.ones(n_kept, dtype=torch.bool), rounds, placed, metrics)

    def _select(
        self, batch: RolloutBatch, trainable: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """(keep [G], scores [G], filter/* stats): one SNR selection over every rank's trainable groups."""
        ranks = self._ranks()
        scores = self.filter.scores(batch)
        anywhere = ranks.any(bool(trainable.any()))
        pool = (
            trainable if anywhere else torch.ones_like(trainable)
        )  # nothing trainable: score all, keep none
        everyone = ranks.concat(scores[pool])
        keep_all, stats = self.filter.select(everyone)
        first, _ = ranks.offset(int(pool.sum()))
        keep = torch.zeros_like(trainable)
        keep[pool] = keep_all[first : first + int(pool.sum())]
        if not anywhere:
            keep &= trainable
            stats = filter_stats(everyone, keep_all & False)
        counts = ranks.gather(int(keep.sum()))
        stats.update(kept_groups_rank_min=float(min(counts)), kept_groups_rank_max=float(max(counts)))
        return keep, scores, stats

    def _kept_share(self, batch: RolloutBatch) -> KeptShare:
        """The rows the update trains on, over every rank (one gather): this rank's place among them,
        their count and their share of all rows."""
        ranks = self._ranks()
        counts = ranks.gather((int(batch.kept_rows.numel()), int(batch.keep_rows.numel())))
        kept = [k for k, _ in counts]
        return KeptShare(sum(kept[: ranks.rank]), sum(kept), sum(rows for _, rows in counts))

    def rollout(self, iteration: int) -> RolloutBatch:
        """Collect and filter one iteration's batch (also callable from a notebook, without a Trainer)."""
        self.setup()
        assert self.runner is not None and self.sampler is not None
        policy = self._policy()
        if policy is not None:
            self.sampler.sync_weights(policy)
        device = _device(policy)
        start_phase(device)
        start = time.perf_counter()
        with self._precision(device):
            out = self._single(iteration) if self.sampling is None else self._dynamic(iteration)
        rollout_s = max(self._ranks().gather(time.perf_counter() - start))  # the slowest rank's
        batch = out.batch
        keep, scores, stats = self._select(batch, out.trainable)
        batch.keep, batch.group_scores = keep, scores
        batch.keep_rows = self.filter.rows(batch)
        batch.share = self._kept_share(batch)
        stats.update(kept_rows=float(batch.share.kept), kept_row_ratio=batch.share.ratio)
        # every rank's episodes: the logged numbers describe the whole iteration
        rounds = [eps for part in self._ranks().gather(out.episodes) for eps in part]
        sampled = [ep for eps in rounds for ep in eps]
        batch.metrics.update({f"rollout/{k}": v for k, v in rollout_metrics(sampled).items()})
        batch.metrics.update({f"rollout/{k}": v for k, v in group_metrics(rounds).items()})
        if self.shaping is not None:
            batch.metrics.update({f"rollout/{k}": v for k, v in self.shaping.metrics(sampled).items()})
        batch.metrics.update({f"filter/{k}": v for k, v in stats.items()})
        batch.metrics.update(out.metrics)
        batch.metrics["time/rollout"] = rollout_s
        sampled_tokens = sum(len(t.sampled_ids) for eps in out.episodes for ep in eps for t in ep.turns)
        batch.metrics.update(phase_metrics("rollout", sampled_tokens, rollout_s, device, self._ranks()))
        if self.rollout_cfg.save_jsonl:
            trained = {(batch.episodes[r].group, batch.episodes[r].sample) for r in batch.kept_rows.tolist()}
            self._write_jsonl(out.episodes, out.placed, iteration, trained)
        self._release()
        return batch

    def _write_jsonl(
        self,
        rounds: list[list[Episode]],
        placed: dict[tuple[int, int], int],
        iteration: int,
        trained: set[tuple[int, int]],
    ) -> None:
        """Every sampled episode, with its round and whether the update trains on it (group = in-round;
        ``trained`` holds (group in the batch, sample) of the rows the update trains on)."""
        rank = self._ranks().rank
        root = Path(self.output_dir or (self.trainer.default_root_dir if self.trainer else "."))
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"rollouts.rank{rank}.jsonl"
        if not self._jsonl_trimmed and path.is_file():
            # a resumed (requeued) run redoes the iteration it was cut off in: keep each iteration once
            kept = [
                line for line in path.read_text().splitlines() if json.loads(line)["iteration"] < iteration
            ]
            path.write_text("".join(f"{line}\n" for line in kept))
        self._jsonl_trimmed = True
        with path.open("a") as f:
            for r, episodes in enumerate(rounds):
                for ep in episodes:
                    at = placed.get((r, ep.group))
                    kept = at is not None and (at, ep.sample) in trained
                    record = {"iteration": iteration, "round": r, "kept": kept, **ep.to_record()}
                    f.write(json.dumps(record) + "\n")

    def _release(self) -> None:
        """Let a backend that can free its memory during the update do so (vLLM's sleep mode on GPU,
        ``rollout.sampler.sleep_during_update``); the next ``sync_weights`` wakes it."""
        getattr(self.sampler, "sleep", lambda: None)()

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        iteration = self.trainer.current_epoch if self.trainer is not None else 0
        return _loader(self.rollout(iteration))

    def validation_rollout(self) -> dict[str, float]:
        """Greedy success and sampled pass@k on held-out instance seeds (``ragen2.data.evaluation``)."""
        self.setup()
        assert self.runner is not None and self.sampler is not None
        policy = self._policy()
        if policy is not None:
            self.sampler.sync_weights(policy)
        start = time.perf_counter()
        seeds = heldout_seeds(self.seed, self.val.num_seeds)
        with self._precision(_device(policy)):
            results = evaluate(
                self.runner,
                self.sampler,
                seeds,
                self.val.samples,
                sorted({1, self.val.k}),
                sample_seed=self.seed,
            )
        self._release()
        return {**validation_metrics(results), "time/validation": time.perf_counter() - start}

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return _loader(self.validation_rollout())
