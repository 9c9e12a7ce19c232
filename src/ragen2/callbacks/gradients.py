"""Gradients by reward-variance bucket as a callback (docs/method.md §5, the paper's SNR evidence).

Before the update of iteration 0 and of every ``every_n_iterations``-th iteration, on the unfiltered
batch (every group, kept or not) and with no optimizer step: the groups are split into quantile buckets
of within-group reward variance (``ragen2.diagnostics.gradients``: buckets, norm definitions, figure),
and for each bucket the task term (the policy objective), the entropy term and the KL term (only when
the loss has one: ``algo.kl_coef`` > 0 with its reference model) are back-propagated one at a time, each
giving its pre-clip global gradient norm over the policy's parameters. The numbers (``grad/<bucket>/<term>``
and ``_per_sample``, ``_per_token``; ``grad/<bucket>/{groups, samples, tokens, rv_mean, rv_min, rv_max}``;
``time/gradient_buckets``) are a ``GradientPass`` left in the module's ``Findings``, which the module logs
with its own, and rank zero draws ``<run>/gradients/iteration_<n>.png``.

The loss terms are the update's own (``ragen2.modules.update``: ``Update.prepare`` then
``Update.loss_terms``) under the weights that sampled the batch: every row is prepared as the first
mini-batch's (old log-probs are the current ones: on-policy, ratio 1), the reference and the critic's
values come from the same pre-update pass, KL in the reward is applied with a copy of its controller,
and the advantages are the algorithm's (``algo.advantage``) over all groups. Departures from the update:
no ``algo.loss_scaling`` (it depends on the filter, which the buckets ignore), and a bucket is one
mini-batch (micro-batched under the update's token budget, ``Update.plan``).

Nothing of the run changes: gradients already held by the parameters are set aside and put back, the
optimizer is never touched, and the torch (CPU and CUDA), Python and NumPy random states are restored,
so a run gives the same ``train/*`` numbers with the callback on or off. One process only: under several
ranks the pass is skipped with a warning (buckets would hold one rank's groups, and FSDP's sharded
forwards must run in step on every rank).

Cost: per pass, one forward and one backward over every row of the batch per term (two terms, three with
KL in the loss), against the update's one over the kept rows; one extra gradient-sized buffer.
"""

from __future__ import annotations

import contextlib
import copy
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from ragen2 import plugins
from ragen2.algos.batching import micro_batch_share
from ragen2.data.batch import RolloutBatch
from ragen2.diagnostics.findings import held_findings
from ragen2.diagnostics.gradients import (
    ALL,
    Bucket,
    GradientPass,
    TermNorm,
    bucket_names,
    group_reward_variance,
    plot_buckets,
    rv_buckets,
)
from ragen2.errors import ConfigError
from ragen2.log import log
from ragen2.modules.policy import PolicyModule
from ragen2.modules.update import Update, UpdateInputs

# the task name of each LossTerms field
_FIELDS = {"task": "policy", "entropy": "entropy", "kl": "kl"}


class GradientBuckets(L.Callback):
    """Task, entropy and KL gradient norms per reward-variance bucket of the unfiltered batch."""

    def __init__(self, every_n_iterations: int = 0, num_buckets: int = 6, plot: bool = True) -> None:
        if (
            isinstance(every_n_iterations, bool)
            or not isinstance(every_n_iterations, int)
            or every_n_iterations < 0
        ):
            raise ConfigError(
                f"callbacks.gradient_buckets.every_n_iterations={every_n_iterations!r} must be an integer ≥ 0 "
                "(0 = never). Fix: callbacks.gradient_buckets.every_n_iterations=5"
            )
        if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 1:
            raise ConfigError(
                f"callbacks.gradient_buckets.num_buckets={num_buckets!r} must be an integer ≥ 1 "
                "(quantile buckets of reward variance). Fix: callbacks.gradient_buckets.num_buckets=6"
            )
        self.every_n_iterations = every_n_iterations
        self.num_buckets = num_buckets
        self.plot = plot
        self._warned = False

    def due(self, iteration: int) -> bool:
        every = self.every_n_iterations
        return every > 0 and iteration % every == 0

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        findings = held_findings(pl_module)
        if not (
            isinstance(batch, RolloutBatch)
            and isinstance(pl_module, PolicyModule)
            and findings is not None
            and self.due(batch.iteration)
        ):
            return
        if trainer.world_size > 1:
            if not self._warned:
                log.warning(
                    "callbacks.gradient_buckets: skipped under %d ranks (each rank would bucket only its own "
                    "groups, and sharded forwards must run in step on every rank); run it on one device",
                    trainer.world_size,
                )
                self._warned = True
            return
        findings.gradients = found = self.measure(pl_module, batch)
        if self.plot and trainer.is_global_zero and found.buckets:
            png = Path(trainer.default_root_dir) / "gradients" / f"iteration_{batch.iteration:05d}.png"
            plot_buckets(found, png, f"iteration {batch.iteration} · {pl_module.algo.name or 'algo'}")
            log.info("gradients by reward-variance bucket: %s", png)

    def measure(self, module: PolicyModule, batch: RolloutBatch) -> GradientPass:
        """The gradients by bucket of one unfiltered batch under the module's current weights (also callable
        from a notebook); leaves parameters, gradients and random states as they were."""
        start = time.perf_counter()
        with _untouched(module), torch.enable_grad():
            buckets = self._measure(module, batch)
        seconds = time.perf_counter() - start
        return GradientPass(batch.iteration, tuple(buckets[:-1]), buckets[-1] if buckets else None, seconds)

    def _measure(self, module: PolicyModule, batch: RolloutBatch) -> list[Bucket]:
        """The quantile buckets, lowest RV first, then ``all`` (none for an empty batch)."""
        n = batch.input_ids.shape[0]
        if n == 0:
            return []
        update = module.update
        assert update is not None, "the module's models are not built (configure_model)"
        # steps 1–3 of the update on every row, as its first mini-batch, with β left where it is
        kl_reward = copy.deepcopy(module.algo.kl_reward)
        everything = torch.arange(n)
        inputs = update.prepare(batch, everything, everything, kl_reward=kl_reward)
        variance = group_reward_variance(batch.returns, batch.group_index)
        groups = rv_buckets(variance, self.num_buckets)
        token_level = plugins.LOSS_AGGREGATIONS[module.algo.loss_agg].token_level
        mask = batch.loss_mask
        non_empty = mask.sum(-1) > 0
        rows_of: list[torch.Tensor] = []
        found: list[Bucket] = []
        for name, ids in zip(bucket_names(len(groups)), groups):
            rows = torch.nonzero(torch.isin(batch.group_index, ids)).squeeze(-1)
            rv = variance[ids]
            rows_of.append(rows)
            counts = _counts(rows, ids.numel(), mask, non_empty)
            found.append(Bucket(name, *counts, float(rv.mean()), float(rv.min()), float(rv.max())))
        rows_of.append(everything)
        found.append(
            Bucket(ALL, *_counts(everything, len(variance), mask, non_empty), float(variance.mean()))
        )
        params = [p for p in module.policy.parameters() if p.requires_grad]
        present: set[str] | None = None  # the LossTerms fields this configuration has, from the first forward
        for term, field in _FIELDS.items():
            if present is not None and field not in present:
                continue  # no such term (no KL in the loss; a critic warm-up has no policy terms)
            total: list[torch.Tensor] | None = None  # Σ_b ∇S_b, the summed term of all groups
            for bucket, rows in zip(found[:-1], rows_of):
                fields = _backward_bucket(update, rows, inputs, field, token_level)
                present = fields if present is None else present
                if field not in present:
                    break
                units = _units(mask, rows, non_empty, token_level)
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
                summed = units * _global_norm(grads)
                bucket.norms[term] = TermNorm.of(summed, units, bucket.samples, bucket.tokens)
                if total is None:
                    total = [g.mul(units) for g in grads]
                else:
                    for acc, g in zip(total, grads):
                        acc.add_(g, alpha=units)
                for p in params:
                    p.grad = None
            if total is not None:
                units = _units(mask, everything, non_empty, token_level)
                found[-1].norms[term] = TermNorm.of(
                    _global_norm(total), units, found[-1].samples, found[-1].tokens
                )
        return found


def _backward_bucket(
    update: Update, rows: torch.Tensor, inputs: UpdateInputs, field: str, token_level: bool
) -> set[str]:
    """Accumulate ∇L_b of one loss term into the parameters' ``.grad``; returns the LossTerms fields that
    the update's loss has (when ``field`` is not among them, nothing was back-propagated)."""
    (step,) = update.plan(inputs.batch, [rows])
    present: set[str] = set()
    for idx in step.micro:
        terms, _ = update.loss_terms(inputs, idx)
        present = {f for f in _FIELDS.values() if getattr(terms, f) is not None}
        if field not in present:
            return present
        (getattr(terms, field) * micro_batch_share(inputs.batch.loss_mask, idx, rows, token_level)).backward()
    return present


def _units(mask: torch.Tensor, rows: torch.Tensor, non_empty: torch.Tensor, token_level: bool) -> float:
    """W_b: the aggregation's normaliser over ``rows`` (sampled tokens, or non-empty samples)."""
    return float(mask[rows].sum()) if token_level else float(non_empty[rows].sum())


def _counts(
    rows: torch.Tensor, groups: int, mask: torch.Tensor, non_empty: torch.Tensor
) -> tuple[int, float, float]:
    """A bucket's groups, non-empty samples and sampled tokens."""
    return groups, float(non_empty[rows].sum()), float(mask[rows].sum())


def _global_norm(tensors: list[torch.Tensor]) -> float:
    return float(torch.nn.utils.get_total_norm(tensors)) if tensors else 0.0


@contextlib.contextmanager
def _untouched(module: L.LightningModule) -> Iterator[None]:
    """Set the parameters' gradients aside and restore them, and every random state, on exit."""
    params = [p for p in module.parameters() if p.requires_grad]
    held = [p.grad for p in params]
    py_state, np_state = random.getstate(), np.random.get_state()
    devices = (
        [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    )
    try:
        with torch.random.fork_rng(devices=devices):
            for p in params:
                p.grad = None
            yield
    finally:
        for p, g in zip(params, held):
            p.grad = g
        random.setstate(py_state)
        np.random.set_state(np_state)
