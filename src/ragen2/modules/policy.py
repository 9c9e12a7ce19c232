"""PolicyModule: one RL iteration's update, with manual optimization, for every algorithm in conf/algo/.

``training_step`` is the algorithm, step by step (docs/method.md §6):

0. A batch whose filter kept no group makes no update; ``algo.max_empty_iterations`` such batches in a
   row stop the run.
1. Old log-probs of the kept rows (and the critic's values), and reference log-probs when a KL term
   is on: no grad, recomputed by the training model (the sampler's are only compared,
   ``rollout/logprob_gap_*``). Rows trained before the first optimizer step reuse their training
   forward instead (on-policy: old = current).
2. KL in the reward (``algo.kl_reward``).
3. Advantages of the kept rows (``algo.advantage``): a group-level filter keeps whole groups, so group
   statistics are those of whole groups; a trajectory-level one (``filter.trajectory_fraction``) leaves
   those of the rows it keeps (``ragen2.data.group_filter`` says why). Scaled by the kept share of the
   iteration's rows if ``algo.loss_scaling`` asks.
4. ``algo.epochs`` passes of fixed-size mini-batches (fewer kept groups, fewer steps), each split into
   token-budget micro-batches: ``loss_terms`` (policy objective, entropy, KL, value), manual_backward,
   a gradient clip per parameter group, one optimizer step.
5. Log ``train/*`` (each loss term on its own) with the batch's ``rollout/``, ``filter/``, ``diag/`` metrics.

An algorithm is this module plus the objects its ``conf/algo/<name>.yaml`` names (``AlgoConfig``): an
advantage estimator, a policy objective and, for PPO, a critic (``ragen2.modules.critic``). Log-probs
are computed only at sampled positions, with the LM head in chunks (``ragen2.algos.logprobs``): the
49k vocabulary makes full-batch logits gigabytes.

Across data-parallel ranks (DDP, FSDP: ``ragen2.distributed``) each rank trains on its own kept rows,
and 2 ranks update exactly as 1 rank on the same episodes: the mini-batches are one seeded
permutation of every rank's kept rows, each micro-batch's loss is weighted by its share of the whole
mini-batch's tokens (times the world size, which the strategies' gradient averaging divides out), a
rank with fewer micro-batches pads with zero-weight passes so that every rank runs the same forwards,
backwards and optimizer steps, and whitening, the kept ratio and the logged numbers are global.

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
from types import MethodType
from typing import Any

import lightning as L
import torch

from ragen2.algos.batching import local_rows, micro_batches, minibatch_order, row_weights
from ragen2.algos.filters import loss_scale
from ragen2.algos.kl import kl_penalty
from ragen2.algos.logprobs import sampled_logprobs
from ragen2.algos.losses import aggregate, entropy_loss
from ragen2.config import settings
from ragen2.data.batch import RolloutBatch
from ragen2.distributed import Ranks
from ragen2.log import log
from ragen2.models.forward import decoder_hidden, lm_head
from ragen2.models.loading import ModelConfig
from ragen2.modules.algo_config import AlgoConfig
from ragen2.modules.critic import Critic
from ragen2.modules.objectives import LossTerms
from ragen2.modules.run_state import KEY, RunState, migrate
from ragen2.perf import phase_metrics, start_phase
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


def _token_scores(
    model: Any,
    input_ids: torch.Tensor,  # [b, T]
    attention_mask: torch.Tensor,  # [b, T]
    loss_mask: torch.Tensor,  # [b, T]
    temperature: float,
    with_entropy: bool,
    share_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(hidden [b, T, H], log-probs of the sampled tokens [b, T], entropies [b, T] or None): one forward;
    ``share_prefix`` runs a prompt that several rows share once (``algo.share_prompt_prefix``).

    Bound to each model as ``ragen2_token_scores`` so that FSDP2 can treat it as the model's forward
    (``register_fsdp_forward_method``): the decoder and the LM head are called directly, which would
    otherwise skip the root's all-gather of the embeddings, final norm and head.
    """
    hidden = decoder_hidden(model, input_ids, attention_mask, share_prefix)
    logp, entropy = sampled_logprobs(
        hidden, input_ids, loss_mask, lm_head(model), temperature, with_entropy=with_entropy
    )
    return hidden, logp, entropy


def _scalar(x: Any) -> float:
    """A norm as a float; under FSDP2 clip_grad_norm_ returns a DTensor."""
    return float(x.full_tensor() if hasattr(x, "full_tensor") else x)


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
        self._pad: RolloutBatch | None = None  # one row of the iteration's batch, for zero-weight passes

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
        models = [m for m in (self.policy, self.ref_policy) if m is not None]
        for model in models:
            model.ragen2_token_scores = MethodType(_token_scores, model)
        if self._device_mesh is not None:  # ModelParallelStrategy (trainer=fsdp): shard across the ranks
            self._shard(models)

    def _shard(self, models: list[Any]) -> None:
        """FSDP2: each decoder layer its own unit, the rest of each model (embeddings, norm, head) the root."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

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
            register_fsdp_forward_method(model, "ragen2_token_scores")
        if self.critic is not None:
            fully_shard(self.critic, mesh=mesh, mp_policy=mp)
        # the checkpoint leaves the frozen reference out, and this strategy loads weights before
        # on_load_checkpoint could supply them: load the rest non-strictly
        self.strict_loading = self.ref_policy is None

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
        # every rank calls this hook (rank 0 writes): gather each rank's RNG states
        state = self.run_state.state_dict(Ranks.current())
        checkpoint[KEY] = {**state, "model": asdict(self.model_cfg)}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        for change in migrate(checkpoint):
            log.info("checkpoint of an older layout: %s", change)
        if self.ref_policy is not None:  # runs before the weights load: supply the reference left out
            ref = {f"{REF_PREFIX}{k}": v for k, v in self.ref_policy.state_dict().items()}
            checkpoint.setdefault("state_dict", {}).update(ref)
        self.run_state.load_state_dict(checkpoint.get(KEY, {}), Ranks.current())

    # ---- one iteration ----------------------------------------------------------------------
    def training_step(self, batch: RolloutBatch, batch_idx: int) -> None:
        start = time.perf_counter()
        start_phase(self.device)
        it = batch.iteration
        metrics = {**batch.metrics, "train/iteration": float(it)}
        ranks = Ranks.current()
        kept = batch.kept_rows
        first, total = ranks.offset(kept.numel())  # this rank's rows among every rank's kept rows
        # 0. nothing kept on any rank, nothing to learn from
        if total == 0:
            self._log({**metrics, **self._skip(it)})
            return
        self.run_state.empty_streak = 0
        metrics["filter/skipped"] = 0.0
        train = batch.select(kept)
        self._pad = batch.select(torch.zeros(1, dtype=torch.long))  # the zero-weight passes' row
        order = [
            [local_rows(mini, first, kept.numel()) for mini in epoch]
            for epoch in minibatch_order(
                total, self.algo.mini_batch_size, self.algo.epochs, self.seed * 31 + it
            )
        ]
        # 1. old log-probs, the critic's values and reference log-probs, before any step
        inputs = self._pre_update(train, order)
        # 2. KL in the reward
        if self.algo.kl_reward is not None:
            assert inputs.ref_logp is not None
            train, kl_stats = self.algo.kl_reward(train, inputs.old_logp, inputs.ref_logp, ranks.sum)
            metrics.update({f"train/{k}": v for k, v in kl_stats.items()})
        # 3. advantages of the kept rows
        est = self.algo.advantage(train, inputs.values, ranks.sum)
        # the share of rows trained: for a group-level filter the kept group ratio (groups are equal-sized)
        kept_share = ranks.sum(torch.tensor([float(kept.numel()), float(batch.input_ids.shape[0])]))
        kept_ratio = float(kept_share[0]) / float(kept_share[1])
        inputs.advantages = est.advantages * loss_scale(kept_ratio, self.algo.loss_scaling)
        inputs.returns = est.returns
        metrics.update(self._advantage_stats(train, inputs, it, ranks))
        # 4. mini-batches of micro-batches: backward, clip, step
        metrics.update(self._update(train, order, inputs, it, ranks))
        # 5. log
        metrics.update(_logprob_gap(inputs.old_logp, train, ranks))
        metrics["time/update"] = time.perf_counter() - start
        tokens = int(train.attention_mask.sum()) * self.algo.epochs  # forwarded once per epoch
        metrics.update(phase_metrics("update", tokens, metrics["time/update"], self.device, ranks))
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

    def update_inputs(self, batch: RolloutBatch) -> UpdateInputs:
        """Step 1 for a batch trained as one mini-batch (a diagnostic's view before the update): old
        log-probs are left to ``loss_terms`` (on-policy), unless values or KL in the reward need them."""
        return self._pre_update(batch, [[torch.arange(batch.input_ids.shape[0])]])

    def _pre_update(self, batch: RolloutBatch, order: list[list[torch.Tensor]]) -> UpdateInputs:
        """Step 1. Values (GAE) and KL in the reward need every row before the first step; otherwise the
        first mini-batch's old log-probs are its own training forward, detached."""
        n = batch.input_ids.shape[0]
        up_front = self.critic is not None or self.algo.kl_reward is not None
        first = set() if up_front else set(order[0][0].tolist())  # this rank's rows of the first step
        rest = torch.tensor(sorted(set(range(n)) - first), dtype=torch.long)
        old_logp = torch.zeros_like(batch.loss_mask)
        known = torch.zeros(n, dtype=torch.bool)
        values = None
        with torch.no_grad():  # every rank scores (padding passes included), even with no rows to score
            scored = self._scores(self.policy, batch.select(rest), self.critic)
            old_logp[rest] = _pad_to(scored[0], old_logp)
            known[rest] = True
            if self.critic is not None:  # rest = every row when there are values
                values = _pad_to(scored[1], old_logp)
            ref_logp = self._scores(self.ref_policy, batch)[0] if self.ref_policy is not None else None
        return UpdateInputs(old_logp, known, ref_logp, values)

    def _forward(
        self, model: Any, mb: RolloutBatch, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One forward of ``model`` (the policy or the reference) on a micro-batch: hidden states, the
        sampled tokens' log-probs and, with ``with_entropy``, their entropies."""
        return model.ragen2_token_scores(
            mb.input_ids,
            mb.attention_mask,
            mb.loss_mask,
            self.temperature,
            with_entropy,
            self.algo.share_prompt_prefix,
        )

    def _scores(
        self, model: Any, batch: RolloutBatch, critic: Critic | None = None
    ) -> tuple[torch.Tensor, ...]:
        """[B, T] log-probs of the sampled tokens under ``model`` (and ``critic``'s values), micro-batched."""

        def score(mb: RolloutBatch) -> tuple[torch.Tensor, ...]:
            hidden, logp, _ = self._forward(model, mb)
            if critic is None:
                return (logp,)
            return logp, critic(hidden, mb.input_ids, mb.attention_mask, mb.loss_mask)

        return self._per_micro_batch(batch, score, 1 if critic is None else 2)

    def _per_micro_batch(
        self, batch: RolloutBatch, fn: Callable[[RolloutBatch], tuple[torch.Tensor, ...]], outputs: int = 1
    ) -> tuple[torch.Tensor, ...]:
        """``fn``'s [b, T] outputs over token-budget micro-batches of ``batch``, joined to [B, T] each.

        A rank with fewer micro-batches than another runs ``fn`` on the padding row too, discarding the
        result: under FSDP every forward is a collective.
        """
        lengths = batch.attention_mask.sum(-1).tolist()
        chunks = micro_batches(lengths, self.algo.max_tokens_per_micro_batch)
        (most,) = Ranks.current().max([len(chunks)])  # before any forward: ranks' collectives stay in step
        parts = [fn(batch.select(torch.tensor(rows))) for rows in chunks]
        for _ in range(most - len(chunks)):
            fn(self._pad)
        if not parts:  # no rows here
            empty = batch.loss_mask.new_zeros(batch.input_ids.shape)
            return tuple(empty for _ in range(outputs))
        return tuple(torch.cat([_pad_to(p, batch.input_ids) for p in outs]) for outs in zip(*parts))

    def _advantage_stats(
        self, batch: RolloutBatch, inputs: UpdateInputs, iteration: int, ranks: Ranks
    ) -> dict[str, float]:
        assert inputs.advantages is not None
        mask = batch.loss_mask
        m = mask.to(inputs.advantages.dtype)
        sums = ranks.sum(
            torch.stack([(inputs.advantages * m).sum(), (inputs.advantages.abs() * m).sum(), m.sum()])
        )
        count = sums[2] if float(sums[2]) > 0 else torch.ones_like(sums[2])
        out = {
            "train/advantage_mean": float(sums[0] / count),
            "train/advantage_abs": float(sums[1] / count),
        }
        if self.critic is not None:
            assert inputs.returns is not None and inputs.values is not None
            out.update(self.critic.stats(inputs.returns, inputs.values, mask, iteration))
        return out

    def _arrange(self, rows: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """A mini-batch's rows in micro-batch order. Sharing prompts: by group (stably), so that the rows
        that share a prompt fill micro-batches together; the mini-batch, and so the step, is the same."""
        if not self.algo.share_prompt_prefix:
            return rows
        return rows[torch.sort(batch.group_index[rows], stable=True).indices]

    def _update(
        self,
        batch: RolloutBatch,
        order: list[list[torch.Tensor]],
        inputs: UpdateInputs,
        iteration: int,
        ranks: Ranks,
    ) -> dict[str, float]:
        """Step 4: every mini-batch of every epoch is one optimizer step; returns step-averaged stats.

        ``order`` holds this rank's rows of each (global) mini-batch; a micro-batch's weight is its
        share of the whole mini-batch's ``row_weights`` over every rank.
        """
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        token_level = self.algo.loss_agg == "token-mean"
        freeze_policy = self.critic is not None and not self.critic.trains_policy(iteration)
        weights = row_weights(batch.loss_mask, token_level)  # [B]
        budget = self.algo.max_tokens_per_micro_batch
        arranged = [self._arrange(mini, batch) for minibatches in order for mini in minibatches]
        chunks = [
            [
                mini[torch.tensor(rows)]
                for rows in micro_batches(batch.attention_mask[mini].sum(-1).tolist(), budget)
            ]
            for mini in arranged
        ]
        most = ranks.max([len(c) for c in chunks])  # per step, the most micro-batches any rank has
        totals = ranks.sum(
            torch.stack([weights[mini].sum() for minibatches in order for mini in minibatches])
        )
        sums: dict[str, float] = {}
        clips: dict[str, float] = {}
        progress = bar(len(chunks), "update", "step")
        for step, micro in enumerate(chunks):
            optimizer.zero_grad(set_to_none=True)
            for idx in micro:
                share = float(weights[idx].sum()) / max(float(totals[step]), 1.0)
                terms = self.loss_terms(batch, idx, inputs, iteration)
                # × world: DDP and FSDP average the ranks' gradients, the shares already sum to 1 over ranks
                self.manual_backward(terms.total * share * ranks.world)
                for k, v in terms.logged().items():
                    sums[k] = sums.get(k, 0.0) + v * share
            for _ in range(most[step] - len(micro)):
                self._zero_pass()
            if freeze_policy:  # the critic's warm-up: the policy (a shared trunk too) stays as sampled
                for p in self.policy.parameters():
                    p.grad = None
            for k, v in self._clip().items():
                clips[k] = clips.get(k, 0.0) + v
            optimizer.step()
            scheduler.step()
            progress.update()
            progress.set_postfix_str(f"loss {sums.get('loss', 0.0) / (step + 1):+.4f}")
        progress.close()
        steps = len(chunks)
        sums = {**ranks.sum_floats(sums), **clips}  # norms are already global (reduced gradients)
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
        hidden, logp, entropy = self._forward(self.policy, mb, with_entropy=True)
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

    def _zero_pass(self) -> None:
        """A forward and backward of weight 0 on the padding row: a rank with fewer micro-batches in a step
        joins every collective of the others' passes (DDP's gradient all-reduce, FSDP's gathers) and
        gives every trained parameter a zero gradient."""
        mb = self._pad
        hidden, logp, _ = self._forward(self.policy, mb)
        loss = logp.sum() * 0.0
        if self.critic is not None:
            loss = loss + self.critic(hidden, mb.input_ids, mb.attention_mask, mb.loss_mask).sum() * 0.0
        self.manual_backward(loss)

    def _clip(self) -> dict[str, float]:
        """Clip each parameter group to its own ``max_norm``; returns the pre-clip norms."""
        out = {}
        for group in self.optimizers().optimizer.param_groups:
            grads = [p for p in group["params"] if p.grad is not None]
            max_norm = group.get("max_norm") or 0.0
            if not grads:
                norm = 0.0
            elif max_norm > 0:
                norm = _scalar(torch.nn.utils.clip_grad_norm_(grads, max_norm))
            else:
                norm = _scalar(torch.nn.utils.get_total_norm([p.grad for p in grads]))
            out["grad_norm" if group["name"] == "policy" else f"{group['name']}/grad_norm"] = norm
        return out

    def _log(self, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        self.log_dict(clean, on_step=True, on_epoch=False, batch_size=1)
        self.last_metrics = clean

    # ---- validation -------------------------------------------------------------------------
    def validation_step(self, batch: dict[str, float], batch_idx: int) -> None:
        self.log_dict(batch, on_step=False, on_epoch=True, batch_size=1)


def _logprob_gap(old_logp: torch.Tensor, batch: RolloutBatch, ranks: Ranks) -> dict[str, float]:
    """How far the sampler's log-probs are from the training model's recomputed ones, on sampled tokens
    (every rank's kept rows)."""
    sampled = batch.sampler_logprobs
    compared = batch.loss_mask.bool() & ~torch.isnan(sampled)
    gap = (old_logp - sampled)[compared].abs()
    parts = ranks.gather((float(gap.sum()), int(gap.numel()), float(gap.max()) if gap.numel() else 0.0))
    count = sum(n for _, n, _ in parts)
    if count == 0:
        return {}
    mean = float(gap.mean()) if ranks.world == 1 else sum(s for s, _, _ in parts) / count
    return {"rollout/logprob_gap_abs": mean, "rollout/logprob_gap_max": max(m for _, n, m in parts if n)}
