"""One RL iteration's update, for every algorithm in conf/algo/: plain torch, no Lightning.

``Update.run`` is the algorithm, read top to bottom (docs/method.md §6):

1. ``prepare``: old log-probs of the kept rows (and the critic's values), and reference log-probs when
   a KL term is on: no grad, recomputed by the training model (the sampler's are only compared,
   ``rollout/logprob_gap_*``). Rows trained before the first optimizer step get theirs from that
   step's own forward instead (on-policy: old = current).
2. ``prepare``: KL in the reward (``algo.kl_reward``).
3. ``prepare``: advantages of the kept rows (``algo.advantage``): a group-level filter keeps whole
   groups, so group statistics are those of whole groups; a trajectory-level one
   (``filter.trajectory_fraction``) leaves those of the rows it keeps (``ragen2.data.group_filter``
   says why). Scaled by the kept share of the iteration's rows if ``algo.loss_scaling`` asks.
4. ``algo.epochs`` passes of fixed-size mini-batches (fewer kept groups, fewer steps), each split into
   token-budget micro-batches (``plan``): ``loss_terms`` (policy objective, entropy, KL, value),
   backward, a gradient clip per parameter group, one optimizer step. A step whose loss or gradient
   norm is not finite on any rank is skipped (``train/nonfinite_steps``); ``algo.max_nonfinite_steps``
   such steps in a row stop the run with ``NonFiniteUpdate``.
5. ``train/*`` numbers: each loss term on its own, advantages, the critic's view, learning rates.

``PolicyModule`` (``ragen2.modules.policy``) builds the models and the optimizer and hands this class
Lightning's backward; a test or a notebook can hand it ``Tensor.backward`` and a plain optimizer.
Log-probs are computed only at sampled positions, with the LM head in chunks
(``ragen2.algos.logprobs``): the 49k vocabulary makes full-batch logits gigabytes.

Across data-parallel ranks (DDP, FSDP: ``ragen2.distributed``) each rank trains on its own kept rows,
and 2 ranks update exactly as 1 rank on the same episodes: the mini-batches are one seeded permutation
of every rank's kept rows (``RolloutBatch.kept_share`` places this rank's among them), each
micro-batch's loss is weighted by its share of the whole mini-batch's tokens (times the world size,
which the strategies' gradient averaging divides out), a rank with fewer micro-batches pads with
zero-weight passes so that every rank runs the same forwards, backwards and optimizer steps
(``plan``: one place for both the scoring pass and the update), and whitening, the kept ratio, the
skip of a non-finite step and the logged numbers are global.

Departures from the paper's code: old log-probs are always recomputed; KL in the reward and KL in the
loss are separate terms; a non-finite step is skipped rather than applied.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import MethodType
from typing import Any

import torch

from ragen2 import plugins
from ragen2.algos.batching import local_rows, micro_batches, minibatch_order, row_weights
from ragen2.algos.filters import loss_scale
from ragen2.algos.kl import kl_penalty
from ragen2.algos.logprobs import sampled_logprobs
from ragen2.algos.losses import aggregate, entropy_loss, tis_weights
from ragen2.data.batch import RolloutBatch
from ragen2.distributed import ONE_PROCESS, Ranks
from ragen2.log import log
from ragen2.models.forward import decoder_hidden, lm_head
from ragen2.modules.algo_config import AlgoConfig
from ragen2.modules.critic import Critic, CriticStats
from ragen2.modules.estimators import KLInReward, KLRewardStats
from ragen2.modules.objectives import LossTerms
from ragen2.modules.run_state import RunState
from ragen2.progress import bar

Backward = Callable[[torch.Tensor], None]
LARGE_GAP = 0.1  # |Δ log p| above which a sampled token counts in rollout/logprob_gap_large_share


def _group_block(batch: RolloutBatch, kept: torch.Tensor, ranks: Ranks) -> int:
    """The kept rows per kept group, when every kept group on every rank keeps as many (a group-level filter's
    whole groups; the rows come group after group), else 1: then mini-batches are drawn row by row."""
    sizes = {c for c in torch.bincount(batch.group_index[kept]).tolist() if c}
    local = next(iter(sizes)) if len(sizes) == 1 else (-1 if sizes else 0)  # 0: nothing kept here
    every = {size for size in ranks.gather(local) if size != 0}
    return every.pop() if len(every) == 1 and min(every) > 0 else 1


def _sampler_logprobs(batch: RolloutBatch) -> torch.Tensor:
    """[B, T] the sampler's log-probs on the sampled tokens (0 elsewhere); a sampled token without one (NaN:
    a scripted sampler's) is refused."""
    sampled = batch.loss_mask.bool()
    logp = batch.sampler_logprobs
    if bool(torch.isnan(logp[sampled]).any()):
        raise ValueError(
            "algo.old_logprobs=sampler: the sampler recorded no log-probs for some sampled tokens. Fix: "
            "algo.old_logprobs=recompute, or rollout=hf"
        )
    return torch.where(sampled, logp, torch.zeros_like(logp)).to(batch.loss_mask.dtype)


class NonFiniteUpdate(RuntimeError):
    """``algo.max_nonfinite_steps`` optimizer steps in a row had a non-finite loss or gradient norm."""


@dataclass
class UpdateInputs:
    """Steps 1–3's output, what every micro-batch of the update reads: [B, T] over the rows trained."""

    batch: RolloutBatch  # the rows trained, KL in the reward applied to their rewards
    pad: RolloutBatch  # one row of the iteration's batch: the zero-weight passes' input
    advantages: torch.Tensor  # [B, T], × the loss scaling
    returns: torch.Tensor | None  # [B, T] the critic's targets
    values: torch.Tensor | None  # [B, T] the critic's values before the update
    ref_logp: torch.Tensor | None  # [B, T] the frozen reference's log-probs
    old_logp: torch.Tensor  # [B, T] the rows' log-probs before the update: set where ``known``
    known: torch.Tensor  # [B] bool; the other rows get theirs from their first training forward
    kl_reward: KLRewardStats | None = None  # what KL in the reward did (None without it)

    def remember(self, rows: torch.Tensor, old_logp: torch.Tensor) -> None:
        """Record the old log-probs ``loss_terms`` used for ``rows`` ([b, T']), so later steps reuse them."""
        self.old_logp[rows, : old_logp.shape[1]] = old_logp
        self.known[rows] = True


@dataclass(frozen=True)
class Step:
    """One optimizer step's passes on this rank: its micro-batches and the zero-weight passes that make
    its forwards and backwards as many as the busiest rank's (DDP's all-reduce and FSDP's gathers are
    collectives: a rank that ran fewer would leave the others waiting)."""

    micro: list[torch.Tensor]  # [b_i] rows of each micro-batch
    padding: int  # zero-weight passes after them


@dataclass(frozen=True)
class AdvantageStats:
    """The advantages over every rank's sampled tokens (``_advantage_stats``)."""

    mean: float
    abs: float  # mean magnitude
    effective_rows: int  # rows with a non-zero advantage on some sampled token
    effective_reward: float | None  # their mean return (before KL in the reward); None when there are none

    def as_metrics(self) -> dict[str, float]:
        out = {
            "train/advantage_mean": self.mean,
            "train/advantage_abs": self.abs,
            "train/effective_rows": float(self.effective_rows),
        }
        return out | (
            {} if self.effective_reward is None else {"train/effective_reward": self.effective_reward}
        )


@dataclass(frozen=True)
class LogprobGap:
    """How far the sampler's log-probs were from the training model's, on sampled tokens (``_logprob_gap``)."""

    abs: float  # mean |Δ log p|
    max: float
    k3: float  # k3 estimate of KL(π_sampler ‖ π_old)
    large_share: float  # share of tokens with |Δ| > LARGE_GAP

    def as_metrics(self) -> dict[str, float]:
        return {f"rollout/logprob_gap_{k}": v for k, v in vars(self).items()}


@dataclass(frozen=True)
class UpdateStats:
    """What one iteration's update did (``Update.run``); ``as_metrics`` gives its train/* and
    rollout/logprob_gap_* numbers."""

    kl_reward: KLRewardStats | None  # KL in the reward (``KLInReward``); None without it
    advantage: AdvantageStats
    critic: CriticStats | None  # the critic's view before the update; None without a critic
    terms: Mapping[str, float]  # loss terms, their statistics, each group's gradient norm: step averages
    steps: int  # optimizer steps taken
    nonfinite: int  # steps skipped on a non-finite loss or gradient
    lr: Mapping[str, float]  # each parameter group's learning rate after the update
    logprob_gap: LogprobGap | None  # None: no sampled token had the sampler's log-prob

    def as_metrics(self) -> dict[str, float]:
        out = {} if self.kl_reward is None else self.kl_reward.as_metrics()
        out |= self.advantage.as_metrics() | ({} if self.critic is None else self.critic.as_metrics())
        out |= {f"train/{k}": v for k, v in self.terms.items()}
        out |= {"train/optimizer_steps": float(self.steps), "train/nonfinite_steps": float(self.nonfinite)}
        out |= {"train/lr" if name == "policy" else f"train/{name}/lr": lr for name, lr in self.lr.items()}
        return out | ({} if self.logprob_gap is None else self.logprob_gap.as_metrics())


def token_scores(
    model: Any,
    input_ids: torch.Tensor,  # [b, T]
    attention_mask: torch.Tensor,  # [b, T]
    loss_mask: torch.Tensor,  # [b, T]
    temperature: float,
    with_entropy: bool,
    share_prefix: bool = False,
    sequence_index: torch.Tensor | None = None,  # [b, T] rows packing several sequences
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(hidden [b, T, H], log-probs of the sampled tokens [b, T], entropies [b, T] or None): one forward;
    ``share_prefix`` runs a prompt that several rows share once (``algo.share_prompt_prefix``).

    Bound to each model as ``ragen2_token_scores`` so that FSDP2 can treat it as the model's forward
    (``register_fsdp_forward_method``): the decoder and the LM head are called directly, which would
    otherwise skip the root's all-gather of the embeddings, final norm and head.
    """
    hidden = decoder_hidden(model, input_ids, attention_mask, share_prefix, sequence_index)
    logp, entropy = sampled_logprobs(
        hidden, input_ids, loss_mask, lm_head(model), temperature, with_entropy=with_entropy
    )
    return hidden, logp, entropy


def build_optimizer(
    algo: AlgoConfig, policy: Any, critic: Critic | None
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """One AdamW with a parameter group per trained part (two optimizers would double Lightning's
    global_step), each group with its own ``max_norm``, and the linear warm-up of ``algo.optim``."""
    opt = algo.optim
    groups = [
        {
            "name": "policy",
            "params": [p for p in policy.parameters() if p.requires_grad],
            "lr": opt.lr,
            "weight_decay": opt.weight_decay,
            "max_norm": opt.grad_clip,
        }
    ]
    if critic is not None:
        groups.append(critic.param_group())
    optimizer = torch.optim.AdamW(groups, betas=opt.betas)
    warmup = opt.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (warmup + 1)))
    return optimizer, scheduler


class Update:
    """The update of every algorithm: configured by ``algo`` (``AlgoConfig``), not subclassed.

    ``policy`` is the causal LM trained, ``ref_policy`` the frozen reference (when a KL term needs it),
    scored inside ``ref_scope()`` (under LoRA the policy itself, its adapters off: ``ragen2.models.lora``),
    ``critic`` PPO's critic: the caller owns them (their parameters, devices, sharding); this class binds
    ``token_scores`` to the two models as ``ragen2_token_scores``.
    """

    def __init__(
        self,
        algo: AlgoConfig,
        policy: Any,
        ref_policy: Any = None,
        critic: Critic | None = None,
        temperature: float = 1.0,
        seed: int = 0,
        ref_scope: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        self.algo = algo
        self.policy = policy
        self.ref_policy = ref_policy
        self.ref_scope = ref_scope
        self.critic = critic
        self.temperature = temperature
        self.seed = seed
        for model in (policy, ref_policy):
            if model is not None:
                model.ragen2_token_scores = MethodType(token_scores, model)

    def run(
        self,
        batch: RolloutBatch,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        backward: Backward,
        state: RunState,
        ranks: Ranks = ONE_PROCESS,
    ) -> UpdateStats:
        """Steps 1–5 on the batch's kept rows (some rank must have one)."""
        share = batch.kept_share()
        kept = batch.kept_rows
        block = _group_block(batch, kept, ranks) if self.algo.minibatch == "groups" else 1
        order = [  # per epoch, this rank's rows of each mini-batch of every rank's kept rows
            [local_rows(mini, share.first, kept.numel()) for mini in epoch]
            for epoch in minibatch_order(
                share.kept,
                self.algo.mini_batch_size,
                self.algo.epochs,
                self.seed * 31 + batch.iteration,
                block,
            )
        ]
        # 1–3. old and reference log-probs, the critic's values, KL in the reward, advantages
        inputs = self.prepare(
            batch, kept, order[0][0], kl_reward=self.algo.kl_reward, kept_ratio=share.ratio, ranks=ranks
        )
        advantage = _advantage_stats(inputs, batch.returns[kept], ranks)
        critic = None if self.critic is None else self._critic_stats(inputs)
        # 4. mini-batches of micro-batches: backward, clip, step
        terms, steps, nonfinite = self._train(inputs, order, optimizer, scheduler, backward, state, ranks)
        lr = {group["name"]: float(lr) for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr())}
        # 5. how far the sampler's log-probs were from the training model's
        gap = _logprob_gap(inputs.old_logp, inputs.batch, ranks)
        return UpdateStats(inputs.kl_reward, advantage, critic, terms, steps, nonfinite, lr, gap)

    def _critic_stats(self, inputs: UpdateInputs) -> CriticStats:
        assert self.critic is not None and inputs.returns is not None and inputs.values is not None
        return self.critic.stats(
            inputs.returns, inputs.values, inputs.batch.loss_mask, inputs.batch.iteration
        )

    def prepare(
        self,
        batch: RolloutBatch,
        rows: torch.Tensor,
        on_policy: torch.Tensor,
        *,
        kl_reward: KLInReward | None,
        kept_ratio: float = 1.0,
        ranks: Ranks = ONE_PROCESS,
    ) -> UpdateInputs:
        """Steps 1–3 for ``rows`` of ``batch``, before any optimizer step.

        ``on_policy`` (ids among ``rows``) are the rows of the first step: their old log-probs are left
        to ``loss_terms`` (their own training forward), unless the critic's values or KL in the reward
        need every row's up front. ``kl_reward`` is applied and moves its controller (a diagnostic
        passes a copy, or None); ``kept_ratio`` is the share of the iteration's rows trained.
        """
        train = batch.select(rows)
        n = train.input_ids.shape[0]
        up_front = self.critic is not None or kl_reward is not None
        first = set() if up_front else set(on_policy.tolist())
        rest = torch.tensor(sorted(set(range(n)) - first), dtype=torch.long)
        pad = batch.select(torch.zeros(1, dtype=torch.long))
        old_logp = torch.zeros_like(train.loss_mask)
        known = torch.zeros(n, dtype=torch.bool, device=old_logp.device)
        if self.algo.old_logprobs == "sampler" and self.critic is None:
            # the sampler's own log-probs are the old ones: no forward (``AlgoConfig.old_logprobs``)
            old_logp, known = _sampler_logprobs(train), torch.ones_like(known)
            rest = rest[:0]
        values = ref_logp = None
        with torch.no_grad():  # every rank scores (padding passes included), even with no rows to score
            scored = self._score(self.policy, train, rest, pad, ranks, self.critic)
            old_logp[rest] = scored[0]
            known[rest] = True
            if self.critic is not None:  # rest = every row when there are values
                values = scored[1]
            if self.ref_policy is not None:
                with self.ref_scope():
                    ref_logp = self._score(self.ref_policy, train, torch.arange(n), pad, ranks)[0]
        kl_stats: KLRewardStats | None = None
        if kl_reward is not None:
            assert ref_logp is not None
            train, kl_stats = kl_reward(train, old_logp, ref_logp, ranks.sum)
        est = self.algo.advantage(train, values, ranks.sum)
        advantages = est.advantages * loss_scale(kept_ratio, self.algo.loss_scaling)
        return UpdateInputs(train, pad, advantages, est.returns, values, ref_logp, old_logp, known, kl_stats)

    def plan(
        self, batch: RolloutBatch, minibatches: Sequence[torch.Tensor], ranks: Ranks = ONE_PROCESS
    ) -> list[Step]:
        """Each mini-batch (rows of ``batch``) as one step of token-budget micro-batches, padded to the
        most micro-batches any rank has in that step: one collective, before any forward."""
        lengths = batch.attention_mask.sum(-1)  # [B]
        budget = self.algo.max_tokens_per_micro_batch
        chunks = [
            [mini[torch.tensor(rows)] for rows in micro_batches(lengths[mini].tolist(), budget)]
            for mini in minibatches
        ]
        most = ranks.max([len(c) for c in chunks])
        return [Step(micro, top - len(micro)) for micro, top in zip(chunks, most, strict=True)]

    def loss_terms(self, inputs: UpdateInputs, rows: torch.Tensor) -> tuple[LossTerms, torch.Tensor]:
        """The loss terms of ``rows`` of ``inputs.batch`` under the current weights (one forward), and
        the old log-probs they used ([b, T']: a row not yet ``known`` uses its current ones, detached).

        The update back-propagates the terms' sum; a diagnostic can back-propagate each term alone.
        Reads ``inputs`` and writes nothing: the caller ``remember``s the old log-probs.
        """
        mb = inputs.batch.select(rows)
        width, mask, agg, norm = mb.input_ids.shape[1], mb.loss_mask, self.algo.loss_agg, self.algo.loss_norm
        hidden, logp, entropy = self._forward(self.policy, mb, with_entropy=True)
        assert entropy is not None
        # [b, T'] rows seen for the first time before any step: on-policy, old = current
        old_logp = torch.where(inputs.known[rows, None], inputs.old_logp[rows, :width], logp.detach())
        terms = LossTerms()
        if self.critic is not None:
            assert inputs.values is not None and inputs.returns is not None
            values = self.critic(hidden, mb.input_ids, mb.attention_mask, mask, mb.sequence_index)
            terms.value, critic_stats = self.critic.loss(
                values, inputs.values[rows, :width], inputs.returns[rows, :width], mask, agg, norm
            )
            terms.stats.update(critic_stats)
        if self.critic is not None and not self.critic.trains_policy(mb.iteration):
            return terms, old_logp
        advantages = inputs.advantages[rows, :width]
        if self.algo.tis.cap is not None:  # the sampler drew the tokens: weigh each by π_old/π_sampler
            weights = tis_weights(old_logp, mb.sampler_logprobs, self.algo.tis.cap)
            advantages = advantages * weights
            m = mask.to(weights.dtype)
            terms.stats["tis_weight"] = float((weights * m).sum() / m.sum().clamp(min=1))
            capped = (weights >= self.algo.tis.cap).to(m.dtype)
            terms.stats["tis_capped"] = float((capped * m).sum() / m.sum().clamp(min=1))
        terms.policy, pg_stats = self.algo.policy_loss(logp, old_logp, advantages, mask, mb.turn_index)
        ent = entropy_loss(entropy, mask, agg, norm)
        terms.entropy = -self.algo.entropy_coef * ent
        terms.stats.update(entropy=float(ent.detach()), **{k: float(v) for k, v in pg_stats.items()})
        if inputs.ref_logp is not None and self.algo.kl_coef > 0:
            kl = aggregate(
                kl_penalty(logp, inputs.ref_logp[rows, :width], self.algo.kl_kind), mask, agg, norm
            )
            terms.kl = self.algo.kl_coef * kl
            terms.stats["kl"] = float(kl.detach())
        return terms, old_logp

    # ---- the steps' parts ------------------------------------------------------------------
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
            mb.sequence_index,
        )

    def _score(
        self,
        model: Any,
        batch: RolloutBatch,
        rows: torch.Tensor,
        pad: RolloutBatch,
        ranks: Ranks,
        critic: Critic | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """[len(rows), T] log-probs of the sampled tokens of ``rows`` under ``model`` (and ``critic``'s
        values), micro-batched; the padding passes' results are discarded."""

        def score(mb: RolloutBatch) -> tuple[torch.Tensor, ...]:
            hidden, logp, _ = self._forward(model, mb)
            if critic is None:
                return (logp,)
            return logp, critic(hidden, mb.input_ids, mb.attention_mask, mb.loss_mask, mb.sequence_index)

        (step,) = self.plan(batch, [rows], ranks)
        parts = [score(batch.select(idx)) for idx in step.micro]
        for _ in range(step.padding):
            score(pad)
        if not parts:  # no rows here
            empty = batch.loss_mask.new_zeros((0, batch.input_ids.shape[1]))
            return (empty,) * (1 if critic is None else 2)
        return tuple(torch.cat([_pad_to(p, batch.input_ids) for p in outs]) for outs in zip(*parts))

    def _arrange(self, rows: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
        """A mini-batch's rows in micro-batch order. Sharing prompts: by group (stably), so that the rows
        that share a prompt fill micro-batches together; the mini-batch, and so the step, is the same."""
        if not self.algo.share_prompt_prefix:
            return rows
        return rows[torch.sort(batch.group_index[rows], stable=True).indices]

    def _train(
        self,
        inputs: UpdateInputs,
        order: list[list[torch.Tensor]],
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        backward: Backward,
        state: RunState,
        ranks: Ranks,
    ) -> tuple[dict[str, float], int, int]:
        """Step 4: every mini-batch of every epoch is one optimizer step; returns the loss terms' and the
        gradient norms' averages over the steps taken, the steps taken and the steps skipped.

        ``order`` holds this rank's rows of each (global) mini-batch; a micro-batch's weight is its
        share of the whole mini-batch's ``row_weights`` over every rank.
        """
        batch = inputs.batch
        freeze_policy = self.critic is not None and not self.critic.trains_policy(batch.iteration)
        token_level = plugins.LOSS_AGGREGATIONS[self.algo.loss_agg].token_level
        weights = row_weights(batch.loss_mask, token_level)  # [B]
        minibatches = [mini for epoch in order for mini in epoch]
        steps = self.plan(batch, [self._arrange(mini, batch) for mini in minibatches], ranks)
        totals = ranks.sum(torch.stack([weights[mini].sum() for mini in minibatches]))  # [steps]
        sums: dict[str, float] = {}  # share-weighted sums over the steps taken
        clips: dict[str, float] = {}
        skipped = 0
        progress = bar(len(steps), "update", "step")
        for i, step in enumerate(steps):
            optimizer.zero_grad(set_to_none=True)
            before = dict(sums)
            finite = True
            for rows in step.micro:
                share = float(weights[rows].sum()) / max(float(totals[i]), 1.0)
                terms, old_logp = self.loss_terms(inputs, rows)
                inputs.remember(rows, old_logp)
                # × world: DDP and FSDP average the ranks' gradients, the shares already sum to 1 over ranks
                backward(terms.total * share * ranks.world)
                logged = terms.logged()
                finite &= math.isfinite(logged["loss"])
                for k, v in logged.items():
                    sums[k] = sums.get(k, 0.0) + v * share
            for _ in range(step.padding):
                self._zero_pass(inputs.pad, backward)
            if freeze_policy:  # the critic's warm-up: the policy (a shared trunk too) stays as sampled
                for p in self.policy.parameters():
                    p.grad = None
            norms = clip(optimizer.param_groups)
            # every rank takes the step or every rank skips it
            if ranks.all(finite and all(math.isfinite(v) for v in norms.values())):
                optimizer.step()
                scheduler.step()
                state.nonfinite_streak = 0
                for k, v in norms.items():
                    clips[k] = clips.get(k, 0.0) + v
            else:  # a step on NaN or inf would make the weights non-finite: drop it, nothing moves
                optimizer.zero_grad(set_to_none=True)
                sums = before
                skipped += 1
                state.nonfinite_streak += 1
                _nonfinite(self.algo, batch.iteration, i, norms, state.nonfinite_streak)
            progress.update()
            progress.set_postfix_str(f"loss {sums.get('loss', 0.0) / max(i + 1 - skipped, 1):+.4f}")
        progress.close()
        taken = len(steps) - skipped
        sums = {**ranks.sum_floats(sums), **clips}  # norms are already global (reduced gradients)
        return {k: v / max(taken, 1) for k, v in sums.items()}, taken, skipped

    def _zero_pass(self, pad: RolloutBatch, backward: Backward) -> None:
        """A forward and backward of weight 0 on the padding row: a rank with fewer micro-batches in a step
        joins every collective of the others' passes (DDP's gradient all-reduce, FSDP's gathers) and
        gives every trained parameter a zero gradient."""
        hidden, logp, _ = self._forward(self.policy, pad)
        loss = logp.sum() * 0.0
        if self.critic is not None:
            loss = (
                loss
                + self.critic(
                    hidden, pad.input_ids, pad.attention_mask, pad.loss_mask, pad.sequence_index
                ).sum()
                * 0.0
            )
        backward(loss)


def _advantage_stats(inputs: UpdateInputs, returns: torch.Tensor, ranks: Ranks) -> AdvantageStats:
    """The advantages' mean and mean magnitude over every rank's sampled tokens; the rows whose advantage is
    non-zero on some sampled token (``train/effective_rows``) and their mean return (``returns`` [B], the
    episodes' before KL in the reward: ``train/effective_reward``, absent when there is none). A group-relative estimator gives a group whose returns are all equal no advantage, so
    the effective reward is that of the rollouts the task gradient learns from."""
    mask, adv = inputs.batch.loss_mask, inputs.advantages
    m = mask.to(adv.dtype)
    effective = ((adv != 0) & mask.bool()).any(-1).to(adv.dtype)  # [B]
    sums = ranks.sum(
        torch.stack(
            [
                (adv * m).sum(),
                (adv.abs() * m).sum(),
                m.sum(),
                effective.sum(),
                (returns.to(adv.dtype) * effective).sum(),
            ]
        )
    )
    count = sums[2] if float(sums[2]) > 0 else torch.ones_like(sums[2])
    return AdvantageStats(
        mean=float(sums[0] / count),
        abs=float(sums[1] / count),
        effective_rows=int(sums[3]),
        effective_reward=float(sums[4] / sums[3]) if float(sums[3]) > 0 else None,
    )


def _nonfinite(algo: AlgoConfig, iteration: int, step: int, norms: dict[str, float], streak: int) -> None:
    """Report a skipped step; raise ``NonFiniteUpdate`` at ``algo.max_nonfinite_steps`` in a row."""
    limit = algo.max_nonfinite_steps
    shown = ", ".join(f"{k} {v:.4g}" for k, v in norms.items())
    log.warning(
        "iteration %d, step %d: non-finite loss or gradient (%s); step skipped, weights unchanged "
        "(%d in a row, algo.max_nonfinite_steps=%d)",
        iteration,
        step,
        shown,
        streak,
        limit,
    )
    if limit and streak >= limit:
        raise NonFiniteUpdate(
            f"iteration {iteration}: {streak} optimizer steps in a row had a non-finite loss or gradient "
            f"norm (algo.max_nonfinite_steps={limit}); each was skipped, so the weights and the last "
            "checkpoint are those of the last finite step. Likely causes: a learning rate too high "
            f"(algo.optim.lr={algo.optim.lr:g}), fp16 overflow (trainer.precision=16-mixed), or a "
            "degenerate batch (non-finite rewards or advantages). Fix: lower algo.optim.lr or raise "
            "algo.optim.warmup_steps, train in trainer.precision=bf16-mixed, check the env's rewards; "
            "then resume with ckpt_path=last, the newest checkpoint that loads (algo.max_nonfinite_steps=0 skips such steps without stopping)"
        )


def clip(param_groups: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Clip each parameter group to its own ``max_norm``; returns the pre-clip norms (``grad_norm`` for
    the policy, ``<name>/grad_norm`` for the others)."""
    out = {}
    for group in param_groups:
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


def _scalar(x: Any) -> float:
    """A norm as a float; under FSDP2 clip_grad_norm_ returns a DTensor."""
    return float(x.full_tensor() if hasattr(x, "full_tensor") else x)


def _pad_to(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, like.shape[1] - x.shape[1]))


def _logprob_gap(old_logp: torch.Tensor, batch: RolloutBatch, ranks: Ranks) -> LogprobGap | None:
    """How far the sampler's log-probs are from the training model's recomputed ones, on sampled tokens
    (every rank's kept rows): the mean and largest |Δ log p|, the share of tokens with |Δ| > 0.1, and the
    k3 estimate of KL(π_sampler ‖ π_old) over the sampler's own draws, E[r − 1 − log r] with r = π_old/π_sampler."""
    sampled = batch.sampler_logprobs
    compared = batch.loss_mask.bool() & ~torch.isnan(sampled)
    delta = (old_logp - sampled)[compared]
    gap = delta.abs()
    k3 = torch.expm1(delta) - delta
    parts = ranks.gather(
        (
            float(gap.sum()),
            int(gap.numel()),
            float(gap.max()) if gap.numel() else 0.0,
            float(k3.sum()),
            int((gap > LARGE_GAP).sum()),
        )
    )
    count = sum(p[1] for p in parts)
    if count == 0:
        return None
    return LogprobGap(
        abs=float(gap.mean()) if ranks.world == 1 else sum(p[0] for p in parts) / count,
        max=max(p[2] for p in parts if p[1]),
        k3=sum(p[3] for p in parts) / count,
        large_share=sum(p[4] for p in parts) / count,
    )
