"""Policy, value and entropy losses, loss aggregation and DAPO's soft overlong penalty.

Implements verl's `agg_loss`, `compute_policy_loss` (clip-higher + dual clip), `compute_policy_loss_gspo`
and `compute_value_loss`, plus DAPO's overlong reward shaping. Departures from verl:
- `aggregate` excludes fully masked sequences from sequence means (verl divides by the batch size, or
  gets NaN from 0/0 in `seq-mean-token-mean`), and an all-masked batch gives 0 that still has a graph.
- `seq-mean-token-sum-norm` is Dr.GRPO's (1/G)·Σ_i Σ_t ℓ_{i,t} / norm: a mean over sequences of token
  sums divided by a constant (default the mask's width T, verl's choice). verl's version sums over
  sequences without the 1/G, so its loss grows with the batch size.
- `clipped_surrogate` splits verl's `pg_clipfrac` into `clipfrac_high` (A > 0, ratio above 1+ε_high)
  and `clipfrac_low` (A < 0, ratio below 1−ε_low); `clipfrac` is their sum, verl's number.
- `gspo_surrogate` computes the sequence ratio per *segment* (per turn) rather than per row: GSPO
  assumes one response per sequence, a multi-turn row holds several.
- `tis_weights` is verl's truncated importance sampling (`tis_imp_ratio_cap`) as a weight on the
  advantages: every objective here is linear in the advantage with a positive factor, so scaling the
  advantage scales the token's loss (docs/method.md §6).
"""

from __future__ import annotations

import math

import torch

from ragen2 import plugins
from ragen2.algos.logprobs import masked_mean

__all__ = [
    "AGG_MODES",
    "aggregate",
    "clipped_surrogate",
    "entropy_loss",
    "gspo_surrogate",
    "overlong_penalty",
    "tis_weights",
    "value_loss",
]

#: algo.loss_agg's choices (``ragen2.plugins.LOSS_AGGREGATIONS``)
AGG_MODES = plugins.LOSS_AGGREGATIONS


def _check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"shape mismatch, all must be [B, T]: {shapes}")
    if len(next(iter(shapes.values()))) != 2:
        raise ValueError(f"expected [B, T] tensors, got {shapes}")


def aggregate(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, norm: float | None = None
) -> torch.Tensor:
    """Reduce a [B, T] loss matrix over masked tokens to a scalar (``algo.loss_agg``: modes in `AGG_MODES`)."""
    _check_same_shape(loss_mat=loss_mat, mask=mask)
    if mode not in AGG_MODES:
        raise ValueError(
            f"unknown loss aggregation agg={mode!r} (algo.loss_agg). Fix: choose one of {AGG_MODES}"
        )
    if norm is not None and norm <= 0:
        raise ValueError(f"aggregate: norm must be > 0 (or None for the mask width), got {norm}")
    return AGG_MODES[mode].reduce(loss_mat, mask.to(loss_mat.dtype), norm)


@plugins.loss_aggregation("token-mean", token_level=True)
def _token_mean(loss_mat: torch.Tensor, m: torch.Tensor, norm: float | None) -> torch.Tensor:
    """The mean over every masked token of the batch."""
    return masked_mean(loss_mat, m)


def _sequence_mean(per_seq: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """[B] per-sequence losses -> their mean over the sequences with a masked token: an empty sequence
    contributes nothing and is not counted; an empty batch yields 0 with a graph."""
    return masked_mean(per_seq, (counts > 0).to(per_seq.dtype))


@plugins.loss_aggregation("seq-mean-token-mean", token_level=False)
def _seq_mean_token_mean(loss_mat: torch.Tensor, m: torch.Tensor, norm: float | None) -> torch.Tensor:
    """The mean over sequences of each sequence's token mean."""
    counts = m.sum(-1)  # [B]
    per_seq = (loss_mat * m).sum(-1) / torch.where(counts > 0, counts, torch.ones_like(counts))  # [B]
    return _sequence_mean(per_seq, counts)


@plugins.loss_aggregation("seq-mean-token-sum", token_level=False)
def _seq_mean_token_sum(loss_mat: torch.Tensor, m: torch.Tensor, norm: float | None) -> torch.Tensor:
    """The mean over sequences of each sequence's token sum."""
    return _sequence_mean((loss_mat * m).sum(-1), m.sum(-1))


@plugins.loss_aggregation("seq-mean-token-sum-norm", token_level=False)
def _seq_mean_token_sum_norm(loss_mat: torch.Tensor, m: torch.Tensor, norm: float | None) -> torch.Tensor:
    """Dr.GRPO's: the mean over sequences of each sequence's token sum over ``norm`` (None: the width T)."""
    per_seq = (loss_mat * m).sum(-1) / (float(loss_mat.shape[-1]) if norm is None else norm)  # [B]
    return _sequence_mean(per_seq, m.sum(-1))


def _check_clip(clip_low: float, clip_high: float) -> None:
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low={clip_low} must be in [0, 1). Fix: e.g. clip_low=0.2")
    if clip_high < 0.0:
        raise ValueError(f"clip_high={clip_high} must be ≥ 0. Fix: e.g. clip_high=0.28")


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = 3.0,
    agg: str = "token-mean",
    norm: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with clip-higher and dual clip (verl `compute_policy_loss`).

    Stats (detached scalars): clipfrac, clipfrac_high, clipfrac_low, clipfrac_dual, approx_kl
    (masked mean of old − new log-prob, verl's `ppo_kl`), ratio_mean.
    """
    _check_same_shape(logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    _check_clip(clip_low, clip_high)
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip={dual_clip} must be > 1, or null to disable it. Fix: e.g. dual_clip=3.0")
    log_ratio = torch.clamp(logp - old_logp, -20.0, 20.0)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    loss1 = -advantages * ratio  # [B, T]
    loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)  # [B, T]
    clipped = torch.maximum(loss1, loss2)  # [B, T]
    neg = advantages < 0  # [B, T]
    if dual_clip is None:
        losses = clipped
        dual_hit = torch.zeros_like(neg)
    else:
        loss3 = -advantages * dual_clip  # [B, T]
        # For A < 0 an unbounded ratio would make the loss unbounded: cap it at −A·c.
        losses = torch.where(neg, torch.minimum(clipped, loss3), clipped)
        dual_hit = (clipped > loss3) & neg
    loss = aggregate(losses, mask, agg, norm)
    clip_hit = loss2 > loss1
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean(clip_hit.to(logp.dtype), mask.to(logp.dtype)),
            "clipfrac_high": masked_mean((clip_hit & (advantages > 0)).to(logp.dtype), mask.to(logp.dtype)),
            "clipfrac_low": masked_mean((clip_hit & neg).to(logp.dtype), mask.to(logp.dtype)),
            "clipfrac_dual": masked_mean(dual_hit.to(logp.dtype), mask.to(logp.dtype)),
            "approx_kl": masked_mean(-log_ratio, mask.to(logp.dtype)),
            "ratio_mean": masked_mean(ratio, mask.to(logp.dtype)),
        }
    return loss, {k: v.detach() for k, v in stats.items()}


def _segment_mean(x: torch.Tensor, mask: torch.Tensor, segment_index: torch.Tensor) -> torch.Tensor:
    """Per-token mean of x over the token's (row, segment) among masked tokens: [B, T] -> [B, T]."""
    m = mask.to(torch.bool)
    if (segment_index[m] < 0).any():
        raise ValueError("gspo_surrogate: segment_index must be >= 0 on every masked (response) token")
    seg = torch.where(m, segment_index, torch.zeros_like(segment_index)).long()  # [B, T]
    n_seg = int(seg.max().item()) + 1 if seg.numel() else 1
    rows = torch.arange(seg.shape[0], device=seg.device).unsqueeze(-1)  # [B, 1]
    key = (rows * n_seg + seg).reshape(-1)  # [B*T] flat (row, segment) id
    mf = m.to(x.dtype).reshape(-1)
    sums = torch.zeros(seg.shape[0] * n_seg, dtype=x.dtype, device=x.device)
    counts = torch.zeros_like(sums)
    sums.index_add_(0, key, x.reshape(-1) * mf)
    counts.index_add_(0, key, mf)
    means = sums / counts.clamp(min=1.0)
    return means[key].reshape(x.shape)


def gspo_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    segment_index: torch.Tensor,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    agg: str = "seq-mean-token-mean",
    norm: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO loss with one sequence-level ratio per segment (turn) of each row.

    s_seg = exp(mean log-ratio over the segment's masked tokens); token form
    s_{i,t} = sg[s_seg] · π(y_t)/sg[π(y_t)], so the value is s_seg and the gradient of each token is
    s_seg·∇log π(y_t) (GSPO eq. 10, verl `compute_policy_loss_gspo`; log-ratio clamped at 10 as verl).
    `segment_index` [B, T] labels each masked token with its turn (any ids >= 0, unique per row).
    Stats as `clipped_surrogate` (clipfrac_dual is 0: GSPO has no dual clip).
    """
    _check_same_shape(
        logp=logp, old_logp=old_logp, advantages=advantages, mask=mask, segment_index=segment_index
    )
    _check_clip(clip_low, clip_high)
    seg_log_ratio = _segment_mean((logp - old_logp).detach(), mask, segment_index)  # [B, T]
    log_ratio = torch.clamp(logp - logp.detach() + seg_log_ratio, max=10.0)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = aggregate(torch.maximum(loss1, loss2), mask, agg, norm)
    clip_hit = loss2 > loss1
    mf = mask.to(logp.dtype)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean(clip_hit.to(logp.dtype), mf),
            "clipfrac_high": masked_mean((clip_hit & (advantages > 0)).to(logp.dtype), mf),
            "clipfrac_low": masked_mean((clip_hit & (advantages < 0)).to(logp.dtype), mf),
            "clipfrac_dual": torch.zeros((), dtype=logp.dtype, device=logp.device),
            "approx_kl": masked_mean(old_logp - logp, mf),
            "ratio_mean": masked_mean(ratio, mf),
        }
    return loss, {k: v.detach() for k, v in stats.items()}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = 0.5,
    agg: str = "token-mean",
    norm: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """0.5 · agg(max((v − R)², (clip(v, v_old ± clip) − R)²)) (verl `compute_value_loss`).

    `clip=None` disables value clipping. Stats: vf_clipfrac (clipped term larger), vpred_mean.
    """
    _check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    if clip is not None and clip <= 0:
        raise ValueError(
            f"value clip={clip} must be > 0, or null to disable it. Fix: e.g. algo.critic.value_clip=0.5"
        )
    loss1 = (values - returns).square()  # [B, T]
    if clip is None:
        losses, loss2 = loss1, loss1
    else:
        v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)  # [B, T]
        loss2 = (v_clipped - returns).square()
        losses = torch.maximum(loss1, loss2)
    loss = 0.5 * aggregate(losses, mask, agg, norm)
    mf = mask.to(values.dtype)
    with torch.no_grad():
        stats = {
            "vf_clipfrac": masked_mean((loss2 > loss1).to(values.dtype), mf),
            "vpred_mean": masked_mean(values, mf),
        }
    return loss, {k: v.detach() for k, v in stats.items()}


def entropy_loss(
    entropy: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean", norm: float | None = None
) -> torch.Tensor:
    """Aggregated token entropy [B, T] -> scalar; the bonus enters the loss as −coef · this."""
    return aggregate(entropy, mask, agg, norm)


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, cache_len: int, penalty: float = 1.0
) -> torch.Tensor:
    """DAPO soft overlong punishment per response length [B] -> [B] (≤ 0).

    0 for L ≤ max_len − cache_len, ((max_len − cache_len) − L)/cache_len · penalty up to max_len,
    −penalty beyond. cache_len = 0 is the hard cut (−penalty only above max_len).
    """
    if max_len <= 0 or not 0 <= cache_len <= max_len:
        raise ValueError(
            f"overlong_penalty needs max_len > 0 and 0 <= cache_len <= max_len, got max_len={max_len}, "
            f"cache_len={cache_len}"
        )
    if penalty < 0:
        raise ValueError(f"overlong_penalty: penalty must be >= 0 (it is subtracted), got {penalty}")
    lengths = lengths.to(torch.float32) if not lengths.is_floating_point() else lengths
    if cache_len == 0:
        return -penalty * (lengths > max_len).to(lengths.dtype)
    frac = torch.clamp((lengths - (max_len - cache_len)) / cache_len, 0.0, 1.0)  # [B]
    return -penalty * frac


def tis_weights(old_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling: per sampled token, w = min(π_old(a) / π_sampler(a), cap), detached.

    The tokens were drawn from the sampler's distribution (its own kernels, precision or engine), the loss
    is the training model's: w re-weights each token towards what π_old would have drawn, and the cap
    bounds the variance. ``old_logp``, ``sampler_logp``: [B, T]; a NaN sampler log-prob (a sampler that
    reports none) weighs 1.
    """
    _check_same_shape(old_logp=old_logp, sampler_logp=sampler_logp)
    if not cap > 0:
        raise ValueError(f"tis_weights: cap={cap} must be > 0 (the largest weight). Fix: e.g. cap=2.0")
    log_ratio = (old_logp - sampler_logp).detach()
    weights = torch.exp(log_ratio.clamp(max=math.log(cap)))  # exp(min(Δ, log cap)) = min(e^Δ, cap)
    return torch.where(torch.isnan(sampler_logp), torch.ones_like(weights), weights)
