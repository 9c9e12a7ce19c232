"""RolloutDataModule: Lightning's side of the rollouts. One RL iteration = one Lightning epoch
(``reload_dataloaders_every_n_epochs=1``): ``train_dataloader`` syncs the sampler to the policy and hands
``collect_iteration``'s batch (``ragen2.data.iteration``, plain torch) to Lightning as a one-batch loader;
``val_dataloader`` does the same for held-out evaluation (``ragen2.data.evaluation``). What this class adds is
what only Lightning knows: the module's policy (under FSDP a full copy, ``ragen2.models.weights.SamplingCopy``),
the trainer's precision, ranks, epoch and run folder.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from ragen2.agent.episode import Episode
from ragen2.agent.runner import EpisodeRunner
from ragen2.data.batch import RolloutBatch
from ragen2.data.contracts import held_policy
from ragen2.data.evaluation import validation_rollout
from ragen2.data.group_filter import Filter
from ragen2.data.iteration import IterationPlan, collect_iteration
from ragen2.data.rollout_config import EnvConfig, RolloutConfig, ValConfig
from ragen2.data.rollout_log import RolloutLog
from ragen2.data.sampling import DynamicSampling
from ragen2.data.shaping import OverlongShaping
from ragen2.distributed import Ranks
from ragen2.models.loading import load_tokenizer
from ragen2.models.placement import AUTOCAST, autocast
from ragen2.models.weights import SamplingCopy
from ragen2.rollout.base import Sampler
from ragen2.rollout.first_turn import sample_first_turns
from ragen2.settings import settings


def _one_batch(batch: Any) -> DataLoader:
    """A loader of one pre-built batch: a Lightning epoch is one RL iteration."""
    one = cast(Dataset[Any], [batch])  # a list is a map-style dataset: __len__ and __getitem__
    return DataLoader(one, batch_size=None, collate_fn=lambda x: x)


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
        filter: Filter,
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
        filter.check_sampler(self.rollout_cfg.sampler)
        self.tokenizer_name = tokenizer
        self.seed = seed
        self.sampling = None if sampling is None else settings(DynamicSampling, sampling, "algo.sampling")
        shaping = None if shaping is None else settings(OverlongShaping, shaping, "algo.shaping")
        self.shaping = shaping.resolve(self.rollout_cfg.max_new_tokens) if shaping is not None else None
        self.val = settings(ValConfig, val, "val")
        self.output_dir = output_dir
        self.tokenizer: Any = None
        self.sampling_copy = SamplingCopy()  # trainer=fsdp: the unsharded copy the sampler samples from
        self.log: RolloutLog | None = None  # rollout.save_jsonl
        self.sampler: Sampler | None = None
        self.runner: EpisodeRunner | None = None

    def plan(self) -> IterationPlan:
        """What ``collect_iteration`` reads of these settings (after ``setup``: the tokenizer's padding)."""
        r, pad_id = self.rollout_cfg, self.tokenizer.pad_token_id
        return IterationPlan(
            r.groups, r.group_size, self.filter, pad_id, self.seed, self.sampling, self.shaping
        )

    def setup(self, stage: str | None = None) -> None:
        if self.runner is not None:
            return
        self.env.make()  # fail fast on a bad env knob
        self.tokenizer = load_tokenizer(self.tokenizer_name)
        self.sampler = self.rollout_cfg.sampler(self.tokenizer)
        self.runner = self.rollout_cfg.runner(self.env, self.tokenizer)

    def teardown(self, stage: str) -> None:
        """Release the sampler: an in-process vLLM engine holds memory and its process group (``close``)."""
        getattr(self.sampler, "close", lambda: None)()
        self.sampler = self.runner = None

    def state_dict(self) -> dict[str, Any]:
        """The env, rollout and filter settings and the seed the run trained with (``ragen2-eval`` reads the
        env and rollout back; a resume compares them all)."""
        return {
            "env": asdict(self.env),
            "rollout": self.rollout_cfg.saved(),
            "filter": asdict(self.filter),
            "seed": self.seed,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Settings come from the config; the saved ones only document the run."""

    def train_dataloader(self) -> DataLoader:
        return _one_batch(self.rollout(self.trainer.current_epoch if self.trainer is not None else 0))

    def val_dataloader(self) -> DataLoader:
        return _one_batch(self.validation_rollout())

    @contextmanager
    def _sampling(self) -> Iterator[torch.device]:
        """The sampler holding the module's current weights, under the update's autocast (the sampler's
        log-probs get the update's numerics); yields the sampling device. Afterwards a backend that can free
        its memory during the update does (``rollout.sampler.sleep_during_update``); ``sync_weights`` wakes it."""
        self.setup()
        assert self.sampler is not None
        module = None if self.trainer is None else self.trainer.lightning_module
        precision = str(self.trainer.precision) if self.trainer is not None else "32-true"
        policy = self.sampling_copy(held_policy(module), AUTOCAST.get(precision))
        device = next(policy.parameters()).device if policy is not None else torch.device("cpu")
        if policy is not None:
            self.sampler.sync_weights(policy)
        with autocast(device, precision):
            yield device
        getattr(self.sampler, "sleep", lambda: None)()

    def collect(self, seeds: list[int], sample_seed: int) -> list[Episode]:
        """``group_size`` episodes of each instance seed (``ragen2.data.iteration.Collect``)."""
        assert self.runner is not None and self.sampler is not None
        return self.runner.collect(self.sampler, seeds, self.rollout_cfg.group_size, sample_seed=sample_seed)

    def rollout(self, iteration: int) -> RolloutBatch:
        """Collect and filter one iteration's batch (also callable from a notebook, without a Trainer)."""
        ranks = Ranks.current() if self.trainer is not None else Ranks()
        if self.log is None and self.rollout_cfg.save_jsonl:
            root = Path(self.output_dir or (self.trainer.default_root_dir if self.trainer else "."))
            self.log = RolloutLog(root / f"rollouts.rank{ranks.rank}.jsonl", self.tokenizer)
        with self._sampling() as device:
            return collect_iteration(iteration, self.plan(), self.collect, ranks, device, self.log)

    def first_turns(self, seeds: Sequence[int], samples: int, sample_seed: int) -> list[Episode]:
        """``samples`` first turns of each instance seed from the module's current weights (the MI pass's
        ``heldout`` curve; ``SamplesFirstTurns``), neither trained on nor logged."""
        with self._sampling():
            assert self.runner is not None and self.sampler is not None
            return sample_first_turns(self.runner, self.sampler, list(seeds), samples, sample_seed)

    def first_prompts(self, seeds: Sequence[int]) -> list[tuple[list[int], Mapping[str, Any]]]:
        """Each instance seed's turn-1 prompt ids and reset info (``RendersPrompts``)."""
        self.setup()
        assert self.runner is not None
        return list(self.runner.first_prompts(seeds))

    def grammar_ids(self) -> list[list[int]] | None:
        """The env's reasoning grammar as the ids the exact figures score, or None (``RendersPrompts``)."""
        self.setup()
        assert self.runner is not None
        return self.runner.grammar_ids()

    def validation_rollout(self) -> dict[str, float]:
        """Greedy success and sampled pass@k on held-out instance seeds (``ragen2.data.evaluation``)."""
        with self._sampling():
            assert self.runner is not None and self.sampler is not None
            return validation_rollout(self.runner, self.sampler, self.seed, self.val)
