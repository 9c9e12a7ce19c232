"""PolicyModule: Lightning's side of the update, for every algorithm in conf/algo/.

The algorithm itself is ``ragen2.modules.update`` (``Update``: old log-probs, KL in the reward,
advantages, mini-batches of micro-batches, backward, clip, step; plain torch). This module does what
Lightning asks of it around that:

- builds the models (``configure_model``): the policy, the frozen reference when a KL term uses it
  (a copy of the policy, or under ``model.lora`` the policy itself with its adapters off: no second model),
  the critic (``ragen2.modules.critic``), and under ``trainer=fsdp`` shards them (FSDP2, a unit per
  decoder layer);
- builds the optimizer (``configure_optimizers``: ``ragen2.modules.update.build_optimizer``);
- keeps the checkpoint what a resumed run needs (``on_save_checkpoint``, ``on_load_checkpoint``): the
  frozen parameters stay out (the reference, a LoRA policy's base: both are the base model that ``model.*``
  names, rebuilt at a load), the run state goes in (``ragen2.modules.run_state``);
- runs one iteration (``training_step``): a batch whose filter kept no group on any rank makes no
  update, and ``algo.max_empty_iterations`` such batches in a row stop the run; otherwise ``Update.run``
  with Lightning's ``manual_backward``, then ``train/*`` logged with the batch's ``rollout/``,
  ``filter/`` and ``diag/`` metrics, and ``time/update``, ``perf/update_*``.

An algorithm is this module plus the objects its ``conf/algo/<name>.yaml`` names (``AlgoConfig``): an
advantage estimator, a policy objective and, for PPO, a critic.

Departures from the paper's code: an empty filtered batch skips the update instead of failing, and the
frozen reference model exists only when a KL term is on (and stays out of checkpoints, as does every
frozen parameter).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, replace
from functools import partial
from typing import Any, cast

import lightning as L
import torch

from ragen2.data.batch import RolloutBatch
from ragen2.diagnostics.findings import Findings
from ragen2.distributed import Ranks
from ragen2.errors import ConfigError
from ragen2.log import log
from ragen2.models.loading import ModelConfig
from ragen2.models.lora import adapters_off, has_adapters
from ragen2.modules.algo_config import AlgoConfig
from ragen2.modules.critic import Critic
from ragen2.modules.record import Iteration
from ragen2.modules.run_state import KEY, RunState, migrate
from ragen2.modules.update import Update, build_optimizer
from ragen2.perf import phase_perf, start_phase
from ragen2.settings import settings

REF_PREFIX = "ref_policy."


class RunStopped(ConfigError):
    """The run stopped before its last iteration for a reason a setting names (``algo.max_empty_iterations``):
    ``ragen2-train`` ends with this one line and a non-zero status once the run's files are written, so a
    SLURM array or a script marks the job failed."""


class PolicyModule(L.LightningModule):
    """The update of every algorithm: configured by ``algo`` (``AlgoConfig``), not subclassed.

    Declared attributes (``ragen2.data.contracts``): ``policy``, the causal LM being trained (the
    DataModule samples from it, callbacks score with it); ``last``, the latest iteration's record
    (``ragen2.modules.record.Iteration``), and ``last_metrics``, every metric it logged; ``row``, the iteration's row of logged numbers, to which callbacks add theirs
    (``MetricsRow``) before the module writes it; ``findings`` (``ragen2.diagnostics.findings``), what the diagnostic callbacks found,
    whose passes before the update it logs with its own numbers. ``critic`` is the PPO critic or None; ``ref_policy`` the frozen copy of the policy that
    a KL term compares with, or None (no KL term, or LoRA: the reference is the policy with its adapters off);
    ``update`` the algorithm over them (``ragen2.modules.update.Update``), set once the models are built;
    ``stopped`` the ``RunStopped`` error that ended the run early, or None.
    """

    def __init__(
        self,
        model: ModelConfig | Mapping[str, Any],
        algo: AlgoConfig | Mapping[str, Any],
        temperature: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.model_cfg = settings(ModelConfig, model, "model")
        self.algo = settings(AlgoConfig, algo, "algo")
        self.critic: Critic | None = self.algo.critic
        self.temperature = temperature
        self.seed = seed
        kl = self.algo.kl_reward
        self.run_state = RunState(kl_controller=None if kl is None else kl.controller)
        self.policy: Any = None
        self.ref_policy: Any = None
        self.update: Update | None = None
        self.last: Iteration | None = None
        self.last_metrics: dict[str, float] = {}
        self.findings = Findings()
        self.stopped: RunStopped | None = None
        self.row: dict[str, float] = {}  # the iteration's logged numbers, written at its batch end

    # ---- model and optimizer ----------------------------------------------------------------
    def configure_model(self) -> None:
        if self.policy is not None:
            return
        self.policy = self.model_cfg.load()
        self.policy.config.use_cache = False
        self.policy.train()
        reference, ref_scope = self._reference()
        if self.critic is not None:
            self.critic.build(self.policy, self.model_cfg.lora)
        self.update = Update(
            self.algo, self.policy, reference, self.critic, self.temperature, self.seed, ref_scope
        )
        if self._device_mesh is not None:  # ModelParallelStrategy (trainer=fsdp): shard across the ranks
            self._shard([m for m in (self.policy, self.ref_policy) if m is not None])

    def _reference(self) -> tuple[Any, Callable[[], AbstractContextManager[Any]]]:
        """The frozen reference a KL term compares with (None without one) and the scope it is scored in: a
        policy with LoRA adapters is its own reference with them off; any other gets a frozen copy."""
        if not self.algo.needs_reference:
            return None, nullcontext
        if has_adapters(self.policy):
            return self.policy, partial(adapters_off, self.policy)
        self.ref_policy = copy.deepcopy(self.policy).eval().requires_grad_(False)
        return self.ref_policy, nullcontext

    def _frozen_keys(self) -> set[str]:
        """State-dict names of the parameters no optimizer trains (the reference copy, a LoRA policy's base,
        tied aliases included): the base model, which the config names."""
        return {name for name, p in self.named_parameters(remove_duplicate=False) if not p.requires_grad}

    def _shard(self, models: list[Any]) -> None:
        """FSDP2: each decoder layer its own unit, the rest of each model (embeddings, norm, head) the root."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

        assert self.device_mesh is not None, "configure_model shards only under a device mesh"
        mesh = self.device_mesh["data_parallel"]
        precision = self.trainer.precision if self._trainer is not None else "32-true"
        mp = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if "bf16" in str(precision)
            else MixedPrecisionPolicy()
        )
        for model in models:
            for layer in model.get_decoder().layers:
                fully_shard(layer, mesh=mesh, mp_policy=mp)
            fully_shard(model, mesh=mesh, mp_policy=mp)
            register_fsdp_forward_method(model, "ragen2_token_scores")  # bound by Update
        if self.critic is not None:
            fully_shard(self.critic, mesh=mesh, mp_policy=mp)
        # the checkpoint leaves the frozen parameters out, and this strategy loads weights before
        # on_load_checkpoint could supply them: load the rest non-strictly
        self.strict_loading = not self._frozen_keys()

    def configure_optimizers(self) -> Any:
        optimizer, scheduler = build_optimizer(self.algo, self.policy, self.critic)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ---- checkpoint -------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        weights = checkpoint.get("state_dict", {})
        frozen = self._frozen_keys()
        for key in [k for k in weights if k.startswith(REF_PREFIX) or k in frozen]:  # rebuilt from the base
            del weights[key]
        # every rank calls this hook (rank 0 writes): gather each rank's RNG states
        state = self.run_state.state_dict(Ranks.current())
        checkpoint[KEY] = {**state, "model": asdict(self.model_cfg), "algo": self.algo.name}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        for change in migrate(checkpoint):
            log.info("checkpoint of an older layout: %s", change)
        frozen = self._frozen_keys()
        if frozen:  # runs before the weights load: supply what the save left out, as the base model has it
            own = {k: v for k, v in self.state_dict().items() if k.startswith(REF_PREFIX) or k in frozen}
            checkpoint.setdefault("state_dict", {}).update(own)
        self.run_state.load_state_dict(checkpoint.get(KEY, {}), Ranks.current())

    # ---- one iteration ----------------------------------------------------------------------
    def training_step(self, batch: RolloutBatch, batch_idx: int) -> None:
        start = time.perf_counter()
        start_phase(self.device)
        iteration = Iteration(batch.iteration, batch.record, *self.findings.before_update(batch.iteration))
        # nothing kept on any rank, nothing to learn from
        if batch.kept_share().kept == 0:
            self._log(replace(iteration, empty_streak=self._skip(batch.iteration)))
            return
        self.run_state.empty_streak = 0
        ranks = Ranks.current()
        # one optimizer and one scheduler (configure_optimizers); a LightningOptimizer subclasses the class
        # of the optimizer it wraps at run time, and its step runs the strategy's and precision's hooks
        optimizer = cast(torch.optim.Optimizer, self.optimizers())
        scheduler = cast(torch.optim.lr_scheduler.LRScheduler, self.lr_schedulers())
        assert self.update is not None, "configure_model() builds the update with the models"
        stats = self.update.run(batch, optimizer, scheduler, self.manual_backward, self.run_state, ranks)
        seconds = time.perf_counter() - start
        kept_tokens = int(batch.attention_mask[batch.kept_rows].sum())
        tokens = kept_tokens * self.algo.epochs  # forwarded once per epoch
        self._log(replace(iteration, update=stats, perf=phase_perf(tokens, seconds, self.device, ranks)))

    def _skip(self, iteration: int) -> int:
        """Count an iteration whose filter kept no group (the streak, this one included); stop after
        ``algo.max_empty_iterations``."""
        self.run_state.empty_streak += 1
        streak, limit = self.run_state.empty_streak, self.algo.max_empty_iterations
        if limit and streak >= limit:
            # the iteration ends as any other (logged, saved); ragen2.train raises the error after the fit
            self.stopped = RunStopped(
                f"algo.max_empty_iterations={limit}: the filter kept no group in {streak} iterations in a row "
                f"(iterations {iteration - streak + 1}–{iteration}: no group's rollouts differed in reward), so "
                f"the run stopped after iteration {iteration}. Fix: more spread within a group "
                "(rollout.group_size, rollout.temperature), a filter that keeps more (filter.value, filter=none), "
                "or algo.max_empty_iterations=0 to go on regardless"
            )
            log.warning(
                "stopping: %d consecutive iterations kept no group (algo.max_empty_iterations=%d)",
                streak,
                limit,
            )
            self.trainer.should_stop = True
        else:
            log.info("iteration %d: the filter kept no group; no update this iteration", iteration)
        return streak

    def _log(self, iteration: Iteration) -> None:
        self.last = iteration
        self.last_metrics = iteration.as_metrics()
        self.row.update(self.last_metrics)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Write the iteration's row to every logger, in one call after every callback's batch-end hook (a
        callback adds to it through ``MetricsRow``), at the step ``log_dict`` would use. ``log_dict`` keeps a
        result object per key and moves it every iteration: with the ~220 numbers of an iteration that cost
        ~0.7 ms a key, more than a small model's whole update (bench/bench_organism.py)."""
        self.trainer._logger_connector.log_metrics(cast(dict[str, Any], self.row))
        self.row = {}

    # ---- validation -------------------------------------------------------------------------
    def validation_step(self, batch: dict[str, float], batch_idx: int) -> None:
        self.log_dict(batch, on_step=False, on_epoch=True, batch_size=1)
