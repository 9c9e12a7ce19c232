"""PolicyModule: the critic-free policy-gradient update (GRPO and its relatives) with manual optimization.

Per iteration (one batch = one epoch): old log-probs recomputed by the training model (never trusted
from the sampler), reference log-probs only when a KL term is on, MI diagnostics on the unfiltered
batch every ``diagnostics.every_n_iterations``, advantages on the kept groups, then ``epochs`` passes
of fixed-size mini-batches (fewer kept groups ⇒ fewer optimizer steps, as the reference), each split
into micro-batches under a token budget. Log-probs are computed only at sampled positions, with the
LM head applied in chunks: the 49k vocabulary makes full-batch logits gigabytes.
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import lightning as L
import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from ragen2.algos.filters import loss_scale
from ragen2.algos.kl import kl_penalty
from ragen2.algos.logprobs import masked_mean
from ragen2.algos.losses import AGG_MODES, aggregate
from ragen2.data.batch import RolloutBatch
from ragen2.diagnostics.cross_scoring import cross_score
from ragen2.diagnostics.metric import MIMetric
from ragen2.models.loading import load_model
from ragen2.modules.estimators import AdvantageEstimator, KLInReward
from ragen2.modules.objectives import PolicyObjective


def trunk_hidden(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[b, T] ids -> [b, T, H] last hidden states of the causal LM's decoder (no LM head)."""
    return model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def head_logprobs(
    model: Any,
    hidden: torch.Tensor,  # [b, T, H]
    input_ids: torch.Tensor,  # [b, T]
    loss_mask: torch.Tensor,  # [b, T]
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the tokens at loss-masked positions -> [b, T] (0 elsewhere).

    The LM head runs only on positions that predict a sampled token, in checkpointed chunks, so no
    [b, T, V] tensor ever exists.
    """
    head = model.get_output_embeddings()
    target = loss_mask[:, 1:].bool()  # position p predicts token p+1
    h = hidden[:, :-1][target]  # [N, H]
    ids = input_ids[:, 1:][target]  # [N]
    scale = 1.0 / temperature if temperature > 0 else 1.0

    def head_stats(h_chunk: torch.Tensor, id_chunk: torch.Tensor) -> torch.Tensor:
        logits = head(h_chunk).float() * scale  # [n, V]
        lse = torch.logsumexp(logits, dim=-1)
        lp = logits.gather(-1, id_chunk[:, None]).squeeze(-1) - lse
        if not with_entropy:
            return lp[:, None]
        ent = lse - (logits.softmax(-1) * logits).sum(-1)
        return torch.stack([lp, ent], dim=-1)

    use_ckpt = torch.is_grad_enabled()
    parts = [
        checkpoint(head_stats, h[s : s + chunk], ids[s : s + chunk], use_reentrant=False)
        if use_ckpt
        else head_stats(h[s : s + chunk], ids[s : s + chunk])
        for s in range(0, h.shape[0], chunk)
    ]
    stats = torch.cat(parts) if parts else h.new_zeros((0, 2 if with_entropy else 1))
    out = hidden.new_zeros(input_ids.shape, dtype=torch.float32)
    logp = out.clone()
    logp[:, 1:][target] = stats[:, 0]
    entropy = None
    if with_entropy:
        entropy = out.clone()
        entropy[:, 1:][target] = stats[:, 1]
    return logp, entropy


def sampled_logprobs(
    model: Any,
    input_ids: torch.Tensor,  # [b, T]
    attention_mask: torch.Tensor,  # [b, T]
    loss_mask: torch.Tensor,  # [b, T]
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the sampled tokens: the trunk once, then ``head_logprobs``."""
    hidden = trunk_hidden(model, input_ids, attention_mask)
    return head_logprobs(model, hidden, input_ids, loss_mask, temperature, with_entropy, chunk)


def micro_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Split rows (in order) into groups whose padded size (rows × longest) fits ``max_tokens``."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if current and max(longest, n) * (len(current) + 1) > max_tokens:
            groups.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        groups.append(current)
    return groups


REF_PREFIX = "ref_policy."


@dataclass
class UpdateInputs:
    """What every mini-batch of one iteration reads: [B, T] tensors over the kept rows."""

    old_logp: torch.Tensor  # filled lazily for first-mini-batch rows (see ``known``)
    known: torch.Tensor  # [B] bool: old_logp is set for the row
    ref_logp: torch.Tensor | None
    advantages: torch.Tensor
    values: torch.Tensor | None = None  # the critic's values before the update (PPO)
    returns: torch.Tensor | None = None  # value targets (PPO)


class PolicyModule(L.LightningModule):
    """The critic-free policy-gradient module: GRPO, Dr.GRPO, DAPO, RLOO, REINFORCE++ and GSPO.

    Each algorithm is this module plus an advantage estimator and a policy objective from its
    ``conf/algo/<name>.yaml``. Where it departs from the paper's code: old log-probs are recomputed by
    the training model, never taken from the sampler; group statistics come from whole kept groups;
    an empty filtered batch skips the update instead of failing; KL in the reward and KL in the loss
    are separate terms, and the reference model exists only when one of them is on.
    """

    uses_critic: ClassVar[bool] = False

    def __init__(
        self,
        model: dict[str, Any],
        advantage: AdvantageEstimator,
        policy_loss: PolicyObjective,
        optim: dict[str, Any],
        loss_agg: str = "token-mean",
        loss_norm: float | None = None,
        entropy_coef: float = 0.001,
        kl_coef: float = 0.0,
        kl_kind: str = "low_var_kl",
        kl_reward: KLInReward | None = None,
        epochs: int = 1,
        mini_batch_size: int = 8,
        max_tokens_per_micro_batch: int = 4096,
        temperature: float = 1.0,
        loss_scaling: str = "none",
        max_empty_iterations: int = 10,
        diagnostics: dict[str, Any] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        if advantage.needs_values != self.uses_critic:
            raise ValueError(
                f"algo.advantage={type(advantage).__name__} "
                + (
                    "needs a critic's values: use algo=ppo (ragen2.modules.ActorCriticModule)"
                    if advantage.needs_values
                    else f"does not use a critic, but the module is {type(self).__name__}: use GAEAdvantage"
                )
            )
        if loss_agg not in AGG_MODES:
            raise ValueError(f"algo.loss_agg={loss_agg!r} is unknown; choose one of {AGG_MODES}")
        if loss_norm is not None and loss_norm <= 0:
            raise ValueError(f"algo.loss_norm={loss_norm} must be > 0, or null for the mask width")
        self.model_cfg = dict(model)
        self.advantage = advantage
        self.policy_loss = policy_loss
        self.optim_cfg = dict(optim)
        self.loss_agg = loss_agg
        self.loss_norm = loss_norm
        self.entropy_coef = entropy_coef
        self.kl_coef = kl_coef
        self.kl_kind = kl_kind
        self.kl_reward = kl_reward
        if epochs < 1 or mini_batch_size < 1:
            raise ValueError(f"algo.epochs={epochs} and algo.mini_batch_size={mini_batch_size} must be ≥ 1")
        self.epochs = epochs
        self.mini_batch_size = mini_batch_size
        self.max_tokens = max_tokens_per_micro_batch
        self.temperature = temperature
        self.loss_scaling = loss_scaling
        self.max_empty_iterations = max_empty_iterations
        self.diag = {"every_n_iterations": 5, "num_samples": 64, "enabled": True, **(diagnostics or {})}
        self.seed = seed
        self.empty_streak = 0
        self.policy: Any = None
        self.ref_policy: Any = None
        self.mi_first_turn = MIMetric()

    # ---- model ------------------------------------------------------------------------------
    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0 or self.kl_reward is not None

    def configure_model(self) -> None:
        if self.policy is not None:
            return
        self.policy = load_model(self.model_cfg["name_or_path"], self.model_cfg.get("dtype", "float32"))
        if self.model_cfg.get("gradient_checkpointing", False):
            self.policy.gradient_checkpointing_enable()
        self.policy.config.use_cache = False
        self.policy.train()
        if self.needs_reference:  # the frozen reference exists only when a KL term uses it
            self.ref_policy = copy.deepcopy(self.policy).eval().requires_grad_(False)

    def _param_groups(self) -> list[dict[str, Any]]:
        """One optimizer, one parameter group per trained part (two optimizers would double global_step)."""
        cfg = self.optim_cfg
        return [
            {
                "name": "policy",
                "params": [p for p in self.policy.parameters() if p.requires_grad],
                "lr": cfg["lr"],
                "weight_decay": cfg.get("weight_decay", 0.0),
                "max_norm": cfg.get("grad_clip", 1.0),
            }
        ]

    def configure_optimizers(self) -> Any:
        cfg = self.optim_cfg
        optimizer = torch.optim.AdamW(self._param_groups(), betas=tuple(cfg.get("betas", (0.9, 0.999))))
        warmup = int(cfg.get("warmup_steps", 0))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (warmup + 1)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ---- checkpointed run state -------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The frozen reference is the base model, rebuilt by configure_model: saving it would double the file.
        weights = checkpoint.get("state_dict", {})
        for key in [k for k in weights if k.startswith(REF_PREFIX)]:
            del weights[key]
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        # plain tensors and numbers only: Lightning loads checkpoints with torch.load(weights_only=True)
        checkpoint["ragen2"] = {
            "empty_streak": self.empty_streak,
            "kl_reward_coef": None if self.kl_reward is None else self.kl_reward.controller.value,
            "rng": {
                "torch": torch.get_rng_state(),
                "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
                "python": random.getstate(),
            },
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.ref_policy is not None:  # runs before the weights load: supply the reference left out above
            ref = {f"{REF_PREFIX}{k}": v for k, v in self.ref_policy.state_dict().items()}
            checkpoint.setdefault("state_dict", {}).update(ref)
        state = checkpoint.get("ragen2", {})
        self.empty_streak = int(state.get("empty_streak", 0))
        if self.kl_reward is not None and state.get("kl_reward_coef") is not None:
            self.kl_reward.controller.value = float(state["kl_reward_coef"])
        rng = state.get("rng")
        if rng is not None:
            torch.set_rng_state(rng["torch"])
            kind, keys, pos, has_gauss, gauss = rng["numpy"]
            np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
            random.setstate(rng["python"])

    # ---- the update -------------------------------------------------------------------------
    def _per_micro_batch(
        self, batch: RolloutBatch, fn: Callable[[RolloutBatch], tuple[torch.Tensor, ...]]
    ) -> tuple[torch.Tensor, ...]:
        """``fn``'s [b, T] outputs over token-budget micro-batches of ``batch``, joined to [B, T] each."""
        parts = [
            fn(batch.select(torch.tensor(rows)))
            for rows in micro_batches(batch.attention_mask.sum(-1).tolist(), self.max_tokens)
        ]
        return tuple(torch.cat([self._pad_to(p, batch.input_ids) for p in outs]) for outs in zip(*parts))

    def _logprobs(self, model: Any, batch: RolloutBatch) -> torch.Tensor:
        """[B, T] log-probs of the sampled tokens under ``model``, micro-batched (no grad by the caller)."""

        def score(mb: RolloutBatch) -> tuple[torch.Tensor]:
            return (
                sampled_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, self.temperature)[0],
            )

        return self._per_micro_batch(batch, score)[0]

    def _score_rollouts(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Pre-update [B, T] log-probs of the rows (and the critic's values: ``ActorCriticModule``)."""
        return self._logprobs(self.policy, batch), None

    @property
    def _old_logp_up_front(self) -> bool:
        """Whether every row's old log-probs are needed before the first step (KL in the reward reads them)."""
        return self.kl_reward is not None

    def training_step(self, batch: RolloutBatch, batch_idx: int) -> None:
        start = time.perf_counter()
        it = batch.iteration
        metrics: dict[str, float] = dict(batch.metrics)
        metrics["train/iteration"] = float(it)
        if self._diagnostics_due(it):
            metrics.update(self._diagnose(batch, it))
        kept = batch.kept_rows
        if kept.numel() == 0:
            self.empty_streak += 1
            metrics.update({"filter/skipped": 1.0, "filter/empty_streak": float(self.empty_streak)})
            self._log(metrics)
            if self.max_empty_iterations and self.empty_streak >= self.max_empty_iterations:
                print(
                    f"[ragen2] stopping: {self.empty_streak} consecutive iterations kept no group "
                    f"(filter.max_empty_iterations={self.max_empty_iterations})"
                )
                self.trainer.should_stop = True
            else:
                print(f"[ragen2] iteration {it}: the filter kept no group; no update this iteration")
            return
        self.empty_streak = 0
        metrics["filter/skipped"] = 0.0
        train = batch.select(kept)
        n = train.input_ids.shape[0]
        order = self._minibatch_order(n, it)
        # The first mini-batch is trained before any step: its old log-probs are the training forward's own,
        # detached. Only rows trained after a step need a separate pre-update forward.
        first = set() if self._old_logp_up_front else set(order[0][0].tolist())
        rest = torch.tensor(sorted(set(range(n)) - first), dtype=torch.long)
        old_logp = torch.zeros_like(train.loss_mask)
        known = torch.zeros(n, dtype=torch.bool)
        values = None
        with torch.no_grad():
            if rest.numel():
                lp, v = self._score_rollouts(train.select(rest))
                old_logp[rest] = self._pad_to(lp, old_logp)
                known[rest] = True
                values = (
                    None if v is None else self._pad_to(v, old_logp)
                )  # rest = every row when values exist
            ref_logp = self._logprobs(self.ref_policy, train) if self.ref_policy is not None else None
        if self.kl_reward is not None:
            assert ref_logp is not None
            train, kl_stats = self.kl_reward(train, old_logp, ref_logp)
            metrics.update({f"train/{k}": v for k, v in kl_stats.items()})
        est = self.advantage(train, values)
        scale = loss_scale(float(metrics.get("filter/kept_ratio", 1.0)), self.loss_scaling)
        inputs = UpdateInputs(old_logp, known, ref_logp, est.advantages * scale, values, est.returns)
        metrics.update(self._advantage_stats(train, inputs))
        metrics.update(self._update(train, order, inputs, it))
        sampled = train.sampler_logprobs
        compared = train.loss_mask.bool() & ~torch.isnan(sampled)
        if bool(compared.any()):
            gap = (old_logp - sampled)[compared]
            metrics["rollout/logprob_gap_abs"] = float(gap.abs().mean())
            metrics["rollout/logprob_gap_max"] = float(gap.abs().max())
        metrics["time/update"] = time.perf_counter() - start
        self._log(metrics)

    def _advantage_stats(self, batch: RolloutBatch, inputs: UpdateInputs) -> dict[str, float]:
        mask = batch.loss_mask
        adv = inputs.advantages
        return {
            "train/advantage_mean": float(masked_mean(adv, mask)),
            "train/advantage_abs": float(masked_mean(adv.abs(), mask)),
        }

    def _minibatch_order(self, n: int, iteration: int) -> list[list[torch.Tensor]]:
        """Per epoch, a seeded shuffle of the kept rows split into fixed-size mini-batches."""
        gen = torch.Generator().manual_seed(self.seed * 31 + iteration)
        return [
            list(torch.randperm(n, generator=gen).split(self.mini_batch_size)) for _ in range(self.epochs)
        ]

    @staticmethod
    def _pad_to(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, like.shape[1] - x.shape[1]))

    def _share(self, batch: RolloutBatch, idx: torch.Tensor, mini: torch.Tensor) -> float:
        """The micro-batch's weight in its mini-batch's loss: its tokens (token-mean) or its non-empty rows."""
        mask = batch.loss_mask
        if self.loss_agg == "token-mean":
            return float(mask[idx].sum()) / max(float(mask[mini].sum()), 1.0)
        rows = (mask.sum(-1) > 0).float()
        return float(rows[idx].sum()) / max(float(rows[mini].sum()), 1.0)

    def _update(
        self, batch: RolloutBatch, order: list[list[torch.Tensor]], inputs: UpdateInputs, iteration: int
    ) -> dict[str, float]:
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        sums: dict[str, float] = {}
        steps = 0
        for minibatches in order:
            for mini in minibatches:
                optimizer.zero_grad(set_to_none=True)
                lengths = batch.attention_mask[mini].sum(-1).tolist()
                for rows in micro_batches(lengths, self.max_tokens):
                    idx = mini[torch.tensor(rows)]
                    share = self._share(batch, idx, mini)
                    stats = self._micro_step(batch, idx, inputs, share, iteration)
                    for k, v in stats.items():
                        sums[k] = sums.get(k, 0.0) + v * share
                self._before_step(iteration)
                for k, v in self._clip().items():
                    sums[k] = sums.get(k, 0.0) + v
                optimizer.step()
                scheduler.step()
                steps += 1
        out = {f"train/{k}": v / max(steps, 1) for k, v in sums.items()}
        out["train/optimizer_steps"] = float(steps)
        for group, lr in zip(optimizer.optimizer.param_groups, scheduler.get_last_lr()):
            out["train/lr" if group["name"] == "policy" else f"train/{group['name']}/lr"] = float(lr)
        return out

    def _before_step(self, iteration: int) -> None:
        """Last look at the gradients before the optimizer step (the critic warm-up freezes the policy here)."""

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

    def _actor_active(self, iteration: int) -> bool:
        """Whether the policy loss is trained this iteration (``ActorCriticModule`` warms its critic up first)."""
        return True

    def _micro_step(
        self, batch: RolloutBatch, idx: torch.Tensor, inputs: UpdateInputs, share: float, iteration: int
    ) -> dict[str, float]:
        mb = batch.select(idx)
        width = mb.input_ids.shape[1]
        mask = mb.loss_mask
        hidden = trunk_hidden(self.policy, mb.input_ids, mb.attention_mask)
        logp, entropy = head_logprobs(
            self.policy, hidden, mb.input_ids, mask, self.temperature, with_entropy=True
        )
        assert entropy is not None
        fresh = ~inputs.known[idx]  # rows seen for the first time before any step: on-policy, old = current
        inputs.old_logp[idx[fresh], :width] = logp.detach()[fresh]
        inputs.known[idx] = True
        loss, stats = self._auxiliary_loss(mb, idx, hidden, inputs)
        if self._actor_active(iteration):
            pg_loss, pg_stats = self.policy_loss(
                logp, inputs.old_logp[idx, :width], inputs.advantages[idx, :width], mask, mb.turn_index
            )
            ent = aggregate(entropy, mask, self.loss_agg, self.loss_norm)
            loss = loss + pg_loss - self.entropy_coef * ent
            stats.update(pg_loss=float(pg_loss.detach()), entropy=float(ent.detach()))
            stats.update({k: float(v) for k, v in pg_stats.items()})
            if inputs.ref_logp is not None and self.kl_coef > 0:
                kl_tokens = kl_penalty(logp, inputs.ref_logp[idx, :width], self.kl_kind)
                kl = aggregate(kl_tokens, mask, self.loss_agg, self.loss_norm)
                loss = loss + self.kl_coef * kl
                stats["kl"] = float(kl.detach())
        self.manual_backward(loss * share)
        stats["loss"] = float(loss.detach())
        return stats

    def _auxiliary_loss(
        self, mb: RolloutBatch, idx: torch.Tensor, hidden: torch.Tensor, inputs: UpdateInputs
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss terms beside the policy's (the value loss in ``ActorCriticModule``); none here."""
        return hidden.new_zeros((), dtype=torch.float32), {}

    # ---- diagnostics ------------------------------------------------------------------------
    def _diagnostics_due(self, iteration: int) -> bool:
        every = int(self.diag["every_n_iterations"])
        return bool(self.diag["enabled"]) and every > 0 and iteration % every == 0

    def _diagnose(self, batch: RolloutBatch, iteration: int) -> dict[str, float]:
        """First-turn MI proxies on the unfiltered batch (METHOD.md §3)."""
        start = time.perf_counter()
        rows = [
            (ep.turns[0].prompt_ids, ep.turns[0].reasoning_ids)
            for ep in batch.episodes
            if ep.turns and ep.turns[0].reasoning_ids
        ]
        out = {"diag/first_turn/valid_rows": float(len(rows))}
        if len({tuple(x) for x, _ in rows}) < 2:
            return out  # MI needs at least two distinct prompts with a valid Z
        rng = random.Random(self.seed * 131 + iteration)
        if len(rows) > int(self.diag["num_samples"]):
            rows = rng.sample(rows, int(self.diag["num_samples"]))
        scores = cross_score(self.policy, rows)
        self.mi_first_turn.update(scores.logp_sum, scores.prompt_index, scores.num_tokens)
        out.update({f"diag/first_turn/{k}": float(v) for k, v in self.mi_first_turn.compute().items()})
        out["diag/first_turn/columns"] = float(scores.logp_sum.shape[1])
        out["time/diagnostics"] = time.perf_counter() - start
        return out

    def _log(self, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        self.log_dict(clean, on_step=True, on_epoch=False, batch_size=1)
        self.last_metrics = clean

    # ---- validation -------------------------------------------------------------------------
    def validation_step(self, batch: dict[str, float], batch_idx: int) -> None:
        self.log_dict(batch, on_step=False, on_epoch=True, batch_size=1)
