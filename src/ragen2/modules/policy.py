"""PolicyModule: one RL iteration's update, with manual optimization, for every algorithm in conf/algo/.

``training_step`` is the algorithm, step by step (METHOD.md §6):

0. A batch whose filter kept no group makes no update; ``algo.max_empty_iterations`` such batches in a
   row stop the run.
1. Old log-probs of the kept rows (and the critic's values), and reference log-probs when a KL term
   is on: no grad, recomputed by the training model (the sampler's are only compared,
   ``rollout/logprob_gap_*``). Rows trained before the first optimizer step reuse their training
   forward instead (on-policy: old = current).
2. KL in the reward (``algo.kl_reward``).
3. Advantages of the kept groups (``algo.advantage``; group statistics are those of whole groups),
   scaled by the kept ratio if ``algo.loss_scaling`` asks.
4. ``algo.epochs`` passes of fixed-size mini-batches (fewer kept groups, fewer steps), each split into
   token-budget micro-batches: ``loss_terms`` (policy objective, entropy, KL, value), manual_backward,
   a gradient clip per parameter group, one optimizer step.
5. Log ``train/*`` (each loss term on its own) with the batch's ``rollout/``, ``filter/``, ``diag/`` metrics.

An algorithm is this module plus the objects its ``conf/algo/<name>.yaml`` names (``AlgoConfig``): an
advantage estimator, a policy objective and, for PPO, a critic (``ragen2.modules.critic``). Log-probs
are computed only at sampled positions, with the LM head in chunks (``ragen2.algos.logprobs``): the
49k vocabulary makes full-batch logits gigabytes.

Departures from the paper's code: old log-probs are always recomputed; an empty filtered batch skips
the update instead of failing; KL in the reward and KL in the loss are separate terms, and the frozen
reference model exists only when one of them is on (and stays out of checkpoints: it is the base model).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import lightning as L
import torch

from ragen2.algos.batching import micro_batch_share, micro_batches, minibatch_order
from ragen2.algos.filters import loss_scale
from ragen2.algos.kl import kl_penalty
from ragen2.algos.logprobs import masked_mean, sampled_logprobs
from ragen2.algos.losses import aggregate, entropy_loss
from ragen2.config import settings
from ragen2.data.batch import RolloutBatch
from ragen2.log import log
from ragen2.models.forward import decoder_hidden, lm_head
from ragen2.models.loading import ModelConfig
from ragen2.modules.algo_config import AlgoConfig
from ragen2.modules.critic import Critic
from ragen2.modules.objectives import LossTerms
from ragen2.modules.run_state import KEY, RunState, migrate
from ragen2.progress import bar

REF_PREFIX = "ref_policy."


@dataclass
class UpdateInputs:
    """What every mini-batch of one iteration reads: [B, T] tensors over the kept rows."""

    old_logp: torch.Tensor  # filled lazily for rows first trained before any step (see ``known``)
    known: torch.Tensor  # [B] bool: old_logp is set for the row
    ref_logp: torch.Tensor | None
    values: torch.Tensor | None  # the critic's values before the update
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None  # the critic's targets


def _pad_to(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, like.shape[1] - x.shape[1]))


class PolicyModule(L.LightningModule):
    """The update of every algorithm: configured by ``algo`` (``AlgoConfig``), not subclassed.

    Declared attributes (``ragen2.data.contracts``): ``policy``, the causal LM being trained (the
    DataModule samples from it, callbacks score with it); ``last_metrics``, every metric the latest
    iteration logged. ``critic`` is the PPO critic or None; ``ref_policy`` the frozen reference or None.
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
        self.last_metrics: dict[str, float] = {}

    # ---- model and optimizer ----------------------------------------------------------------
    def configure_model(self) -> None:
        if self.policy is not None:
            return
        self.policy = self.model_cfg.load()
        self.policy.config.use_cache = False
        self.policy.train()
        if self.algo.needs_reference:  # the frozen reference exists only when a KL term uses it
            self.ref_policy = copy.deepcopy(self.policy).eval().requires_grad_(False)
        if self.critic is not None:
            self.critic.build(self.policy)

    def configure_optimizers(self) -> Any:
        """One AdamW with a parameter group per trained part (two optimizers would double global_step)."""
        opt = self.algo.optim
        groups = [
            {
                "name": "policy",
                "params": [p for p in self.policy.parameters() if p.requires_grad],
                "lr": opt.lr,
                "weight_decay": opt.weight_decay,
                "max_norm": opt.grad_clip,
            }
        ]
        if self.critic is not None:
            groups.append(self.critic.param_group())
        optimizer = torch.optim.AdamW(groups, betas=opt.betas)
        warmup = opt.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (warmup + 1)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ---- checkpoint -------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        weights = checkpoint.get("state_dict", {})
        for key in [k for k in weights if k.startswith(REF_PREFIX)]:  # rebuilt from the base model
            del weights[key]
        checkpoint[KEY] = {**self.run_state.state_dict(), "model": asdict(self.model_cfg)}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        for change in migrate(checkpoint):
            log.info("checkpoint of an older layout: %s", change)
        if self.ref_policy is not None:  # runs before the weights load: supply the reference left out
            ref = {f"{REF_PREFIX}{k}": v for k, v in self.ref_policy.state_dict().items()}
            checkpoint.setdefault("state_dict", {}).update(ref)
        self.run_state.load_state_dict(checkpoint.get(KEY, {}))

    # ---- one iteration ----------------------------------------------------------------------
    def training_step(self, batch: RolloutBatch, batch_idx: int) -> None:
        start = time.perf_counter()
        it = batch.iteration
        metrics = {**batch.metrics, "train/iteration": float(it)}
        # 0. nothing kept, nothing to learn from
        if batch.kept_rows.numel() == 0:
            self._log({**metrics, **self._skip(it)})
            return
        self.run_state.empty_streak = 0
        metrics["filter/skipped"] = 0.0
        train = batch.select(batch.kept_rows)
        order = minibatch_order(
            train.input_ids.shape[0], self.algo.mini_batch_size, self.algo.epochs, self.seed * 31 + it
        )
        # 1. old log-probs, the critic's values and reference log-probs, before any step
        inputs = self._pre_update(train, order)
        # 2. KL in the reward
        if self.algo.kl_reward is not None:
            assert inputs.ref_logp is not None
            train, kl_stats = self.algo.kl_reward(train, inputs.old_logp, inputs.ref_logp)
            metrics.update({f"train/{k}": v for k, v in kl_stats.items()})
        # 3. advantages of the kept groups
        est = self.algo.advantage(train, inputs.values)
        inputs.advantages = est.advantages * loss_scale(batch.kept_ratio, self.algo.loss_scaling)
        inputs.returns = est.returns
        metrics.update(self._advantage_stats(train, inputs, it))
        # 4. mini-batches of micro-batches: backward, clip, step
        metrics.update(self._update(train, order, inputs, it))
        # 5. log
        metrics.update(_logprob_gap(inputs.old_logp, train))
        metrics["time/update"] = time.perf_counter() - start
        self._log(metrics)

    def _skip(self, iteration: int) -> dict[str, float]:
        """Count an iteration whose filter kept no group; stop after ``algo.max_empty_iterations``."""
        self.run_state.empty_streak += 1
        streak, limit = self.run_state.empty_streak, self.algo.max_empty_iterations
        if limit and streak >= limit:
            log.warning(
                "stopping: %d consecutive iterations kept no group (algo.max_empty_iterations=%d)",
                streak,
                limit,
            )
            self.trainer.should_stop = True
        else:
            log.info("iteration %d: the filter kept no group; no update this iteration", iteration)
        return {"filter/skipped": 1.0, "filter/empty_streak": float(streak)}

    def _pre_update(self, batch: RolloutBatch, order: list[list[torch.Tensor]]) -> UpdateInputs:
        """Step 1. Values (GAE) and KL in the reward need every row before the first step; otherwise the
        first mini-batch's old log-probs are its own training forward, detached."""
        n = batch.input_ids.shape[0]
        up_front = self.critic is not None or self.algo.kl_reward is not None
        first = set() if up_front else set(order[0][0].tolist())
        rest = torch.tensor(sorted(set(range(n)) - first), dtype=torch.long)
        old_logp = torch.zeros_like(batch.loss_mask)
        known = torch.zeros(n, dtype=torch.bool)
        values = None
        with torch.no_grad():
            if rest.numel():
                scored = self._scores(self.policy, batch.select(rest), self.critic)
                old_logp[rest] = _pad_to(scored[0], old_logp)
                known[rest] = True
                if self.critic is not None:  # rest = every row when there are values
                    values = _pad_to(scored[1], old_logp)
            ref_logp = self._scores(self.ref_policy, batch)[0] if self.ref_policy is not None else None
        return UpdateInputs(old_logp, known, ref_logp, values)

    def _scores(
        self, model: Any, batch: RolloutBatch, critic: Critic | None = None
    ) -> tuple[torch.Tensor, ...]:
        """[B, T] log-probs of the sampled tokens under ``model`` (and ``critic``'s values), micro-batched."""

        def score(mb: RolloutBatch) -> tuple[torch.Tensor, ...]:
            hidden = decoder_hidden(model, mb.input_ids, mb.attention_mask)
            logp, _ = sampled_logprobs(hidden, mb.input_ids, mb.loss_mask, lm_head(model), self.temperature)
            if critic is None:
                return (logp,)
            return logp, critic(hidden, mb.input_ids, mb.attention_mask, mb.loss_mask)

        return self._per_micro_batch(batch, score)

    def _per_micro_batch(
        self, batch: RolloutBatch, fn: Callable[[RolloutBatch], tuple[torch.Tensor, ...]]
    ) -> tuple[torch.Tensor, ...]:
        """``fn``'s [b, T] outputs over token-budget micro-batches of ``batch``, joined to [B, T] each."""
        lengths = batch.attention_mask.sum(-1).tolist()
        parts = [
            fn(batch.select(torch.tensor(rows)))
            for rows in micro_batches(lengths, self.algo.max_tokens_per_micro_batch)
        ]
        return tuple(torch.cat([_pad_to(p, batch.input_ids) for p in outs]) for outs in zip(*parts))

    def _advantage_stats(self, batch: RolloutBatch, inputs: UpdateInputs, iteration: int) -> dict[str, float]:
        assert inputs.advantages is not None
        mask = batch.loss_mask
        out = {
            "train/advantage_mean": float(masked_mean(inputs.advantages, mask)),
            "train/advantage_abs": float(masked_mean(inputs.advantages.abs(), mask)),
        }
        if self.critic is not None:
            assert inputs.returns is not None and inputs.values is not None
            out.update(self.critic.stats(inputs.returns, inputs.values, mask, iteration))
        return out

    def _update(
        self, batch: RolloutBatch, order: list[list[torch.Tensor]], inputs: UpdateInputs, iteration: int
    ) -> dict[str, float]:
        """Step 4: every mini-batch of every epoch is one optimizer step; returns step-averaged stats."""
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        token_level = self.algo.loss_agg == "token-mean"
        freeze_policy = self.critic is not None and not self.critic.trains_policy(iteration)
        sums: dict[str, float] = {}
        steps = 0
        progress = bar(sum(len(m) for m in order), "update", "step")
        for minibatches in order:
            for mini in minibatches:
                optimizer.zero_grad(set_to_none=True)
                lengths = batch.attention_mask[mini].sum(-1).tolist()
                for rows in micro_batches(lengths, self.algo.max_tokens_per_micro_batch):
                    idx = mini[torch.tensor(rows)]
                    share = micro_batch_share(batch.loss_mask, idx, mini, token_level)
                    terms = self.loss_terms(batch, idx, inputs, iteration)
                    self.manual_backward(terms.total * share)
                    for k, v in terms.logged().items():
                        sums[k] = sums.get(k, 0.0) + v * share
                if freeze_policy:  # the critic's warm-up: the policy (a shared trunk too) stays as sampled
                    for p in self.policy.parameters():
                        p.grad = None
                for k, v in self._clip().items():
                    sums[k] = sums.get(k, 0.0) + v
                optimizer.step()
                scheduler.step()
                steps += 1
                progress.update()
                progress.set_postfix_str(f"loss {sums.get('loss', 0.0) / steps:+.4f}")
        progress.close()
        out = {f"train/{k}": v / max(steps, 1) for k, v in sums.items()}
        out["train/optimizer_steps"] = float(steps)
        for group, lr in zip(optimizer.optimizer.param_groups, scheduler.get_last_lr()):
            out["train/lr" if group["name"] == "policy" else f"train/{group['name']}/lr"] = float(lr)
        return out

    def loss_terms(
        self, batch: RolloutBatch, rows: torch.Tensor, inputs: UpdateInputs, iteration: int
    ) -> LossTerms:
        """The loss terms of ``rows`` of the kept batch under the current weights (one forward).

        The update back-propagates their sum; a diagnostic can back-propagate each term alone.
        """
        mb = batch.select(rows)
        width, mask, agg, norm = mb.input_ids.shape[1], mb.loss_mask, self.algo.loss_agg, self.algo.loss_norm
        hidden = decoder_hidden(self.policy, mb.input_ids, mb.attention_mask)
        logp, entropy = sampled_logprobs(
            hidden, mb.input_ids, mask, lm_head(self.policy), self.temperature, with_entropy=True
        )
        assert entropy is not None
        fresh = ~inputs.known[rows]  # rows seen for the first time before any step: on-policy, old = current
        inputs.old_logp[rows[fresh], :width] = logp.detach()[fresh]
        inputs.known[rows] = True
        terms = LossTerms()
        if self.critic is not None:
            assert inputs.values is not None and inputs.returns is not None
            values = self.critic(hidden, mb.input_ids, mb.attention_mask, mask)
            terms.value, critic_stats = self.critic.loss(
                values, inputs.values[rows, :width], inputs.returns[rows, :width], mask, agg, norm
            )
            terms.stats.update(critic_stats)
        if self.critic is not None and not self.critic.trains_policy(iteration):
            return terms
        assert inputs.advantages is not None
        terms.policy, pg_stats = self.algo.policy_loss(
            logp, inputs.old_logp[rows, :width], inputs.advantages[rows, :width], mask, mb.turn_index
        )
        ent = entropy_loss(entropy, mask, agg, norm)
        terms.entropy = -self.algo.entropy_coef * ent
        terms.stats.update(entropy=float(ent.detach()), **{k: float(v) for k, v in pg_stats.items()})
        if inputs.ref_logp is not None and self.algo.kl_coef > 0:
            kl = aggregate(
                kl_penalty(logp, inputs.ref_logp[rows, :width], self.algo.kl_kind), mask, agg, norm
            )
            terms.kl = self.algo.kl_coef * kl
            terms.stats["kl"] = float(kl.detach())
        return terms

    def _clip(self) -> dict[str, float]:
        """Clip each parameter group to its own ``max_norm``; returns the pre-clip norms."""
        out = {}
        for group in self.optimizers().optimizer.param_groups:
            grads = [p for p in group["params"] if p.grad is not None]
            max_norm = group.get("max_norm") or 0.0
            if not grads:
                norm = 0.0
            elif max_norm > 0:
                norm = float(torch.nn.utils.clip_grad_norm_(grads, max_norm))
            else:
                norm = float(torch.nn.utils.get_total_norm([p.grad for p in grads]))
            out["grad_norm" if group["name"] == "policy" else f"{group['name']}/grad_norm"] = norm
        return out

    def _log(self, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        self.log_dict(clean, on_step=True, on_epoch=False, batch_size=1)
        self.last_metrics = clean

    # ---- validation -------------------------------------------------------------------------
    def validation_step(self, batch: dict[str, float], batch_idx: int) -> None:
        self.log_dict(batch, on_step=False, on_epoch=True, batch_size=1)


def _logprob_gap(old_logp: torch.Tensor, batch: RolloutBatch) -> dict[str, float]:
    """How far the sampler's log-probs are from the training model's recomputed ones, on sampled tokens."""
    sampled = batch.sampler_logprobs
    compared = batch.loss_mask.bool() & ~torch.isnan(sampled)
    if not bool(compared.any()):
        return {}
    gap = (old_logp - sampled)[compared].abs()
    return {"rollout/logprob_gap_abs": float(gap.mean()), "rollout/logprob_gap_max": float(gap.max())}
