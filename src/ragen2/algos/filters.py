"""SNR-aware group filtering (docs/method.md §4): score each group, keep the most informative ones.

`select_groups` mirrors `RolloutFilter._select_top_groups` of the reference (mll-lab-nu/RAGEN,
`ragen/trainer/rollout_filter.py`), edge cases included, but returns a boolean mask over groups
instead of indices:
- `include_zero=False` first drops groups with |s| ≤ 1e-10 for every strategy; nothing left → empty.
- `top_p` with value ≥ 1 keeps every remaining candidate. Linear mode sorts (descending, ascending
  when `largest=False`) and keeps the shortest prefix whose running sum of scores reaches
  p·Σs − eps, stopping early at the first score ≤ 0; if the target is never reached (Σs ≈ 0, or
  negatives) the mask is empty. Softmax mode keeps the nucleus of softmax(±s) whose mass first
  reaches p: it depends on the scale of s (rewards ×10 keep fewer groups), hence the warning.
- `random_drop` (not in the reference: the control of the organism study, docs/organism.md) keeps as many
  groups as `top_p` would at the same value, drawn uniformly from all G groups with a seeded generator:
  as few optimizer steps as the SNR filter, with no choice by signal.
- `top_k` keeps max(1, min(int(p·G), #candidates)) groups, G counting all groups; `top_k_abs`
  keeps max(1, min(int(value), #candidates)).
- `min_p` keeps s ≥ p·max(s) (`largest`), or s ≤ min(s)/p (`largest=False`, the reference's rule).
- `quantile` (not in the reference: the paper's RV-quartile ablation, §9, trains on one quartile of the
  groups) keeps band `value` of `bands` equal-count bands, 1 = the highest scores (the lowest with
  `largest=False`). The C candidates are ranked by a stable ascending sort of the score (equal scores
  keep group order) and the candidate of rank r goes to band n − ⌊r·n/C⌋, n = min(bands, C): band sizes
  differ by at most one (C = 6, n = 4: 1, 2, 1, 2 from band 1); a run of equal scores that a band edge
  splits puts its higher group ids in the band of higher scores; with fewer candidates than bands, the
  bands past C are empty. This is `rv_buckets` of `ragen2.diagnostics.gradients` read from the other
  end: over the same groups, band k holds exactly gradient bucket q(n + 1 − k), so the quartile trained
  on is the bucket whose gradient norms are measured. Zero-score groups count only with `include_zero`,
  as for every strategy (the paper's quartiles are over all groups: `conf/filter/rv_quartile.yaml` sets it).

Strategies are entries of ``ragen2.plugins.STRATEGIES``, registered with ``@plugins.strategy`` as a
package outside ragen2 registers its own: one function, which also refuses the values it cannot use, and one
`conf/filter/<name>.yaml`. The scores, which read the rollouts, are registered in
``ragen2.data.group_filter``; `group_scores` reduces a score's per-rollout quantity.

`extreme_rows` is the row-level counterpart, also not in the reference (the paper's trajectory-level
control, Table 7): within each group it keeps the rollouts with the most extreme returns, half from the
top and half from the bottom.

Departures: ties are broken deterministically (stable sort: the lower group index wins; the
reference's `topk` / unstable sort leave this unspecified); arithmetic is float64 (the reference
uses float32 tensors); `none` keeps every group (the reference skips the filter instead); invalid
values raise instead of silently producing odd masks.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ragen2 import plugins

__all__ = [
    "LOSS_SCALINGS",
    "Candidates",
    "extreme_rows",
    "filter_stats",
    "group_scores",
    "loss_scale",
    "select_groups",
]

TOP_P_MODES = ("linear", "softmax")
#: algo.loss_scaling's choices (``ragen2.plugins.LOSS_SCALINGS``)
LOSS_SCALINGS = plugins.LOSS_SCALINGS
_ZERO = 1e-10  # the reference's threshold for a "zero-score" group


def group_scores(
    values: torch.Tensor, reduce: Callable[[torch.Tensor], torch.Tensor], kind: str, min_rollouts: int = 1
) -> torch.Tensor:
    """Per-group score [G] of the score ``kind``: ``reduce`` of a per-rollout quantity [G, K] (K rollouts of
    group g in row g) in float64; a spread (std, var) needs ``min_rollouts`` = 2 per group."""
    if values.dim() != 2:
        raise ValueError(f"group_scores expects [G, K] (groups × rollouts), got shape {tuple(values.shape)}")
    x = values.to(torch.float64)
    if not torch.isfinite(x).all():
        raise ValueError(f"group_scores: values for filter.score={kind!r} contain NaN or inf")
    if x.shape[1] < min_rollouts:
        raise ValueError(
            f"filter.score={kind!r} needs at least {min_rollouts} rollouts per group, got K={x.shape[1]}; "
            "raise the group size or use filter.strategy=none"
        )
    return reduce(x)


@dataclass(frozen=True)
class Candidates:
    """What a strategy chooses from: the groups that may be kept (every group with ``include_zero``, else
    those with a non-zero score), ranked."""

    index: torch.Tensor  # [C] their group ids
    scores: torch.Tensor  # [C] their scores, float64
    key: torch.Tensor  # [C] the ranking key, descending is best: the scores, negated when largest=False
    order: torch.Tensor  # [C] local indices by key, descending; equal keys keep group order
    groups: int  # G, every group (top_k's fraction counts them all)
    largest: bool
    mode: str
    eps: float
    bands: int
    generator: torch.Generator | None = None  # the draws of ``random_drop`` (``GroupFilter`` seeds it)

    def mask(self, chosen: torch.Tensor) -> torch.Tensor:
        """[G] bool: the candidates at local indices ``chosen`` kept."""
        keep = torch.zeros(self.groups, dtype=torch.bool, device=self.index.device)
        keep[self.index[chosen]] = True
        return keep


def _finite(value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"filter.value={value} is not finite. Fix: filter.value=0.9")


@plugins.strategy("top_p")
def _top_p(c: Candidates, value: float) -> torch.Tensor:
    """The shortest prefix of the ranking holding share ``value`` of the score (≥ 1: every candidate)."""
    _finite(value)
    if c.mode not in TOP_P_MODES:
        raise ValueError(f"filter.mode={c.mode!r} is unknown. Fix: choose one of {', '.join(TOP_P_MODES)}")
    if value <= 0:
        raise ValueError(
            f"filter.value={value}: top_p keeps the groups holding this share of the total score, a number "
            "> 0 (≥ 1 keeps every group with a non-zero score). Fix: filter.value=0.9"
        )
    if c.eps < 0:
        raise ValueError(f"filter.eps={c.eps} must be ≥ 0 (top_p's slack). Fix: filter.eps=0.01")
    if value >= 1:
        return c.mask(c.order)
    if c.mode == "linear":
        return c.mask(_top_p_linear(c.scores, c.order, value, c.eps))
    warnings.warn(
        "filter.mode=softmax: the softmax nucleus depends on the scale of the scores "
        "(multiplying rewards by 10 keeps fewer groups); linear mode does not",
        UserWarning,
        stacklevel=3,
    )
    probs = torch.softmax(c.key, dim=0)[c.order]  # sorted descending
    cut = int(torch.searchsorted(torch.cumsum(probs, 0), torch.tensor([value], dtype=probs.dtype)))
    return c.mask(c.order[: min(cut + 1, c.scores.numel())])


def _first(c: Candidates, k: int) -> torch.Tensor:
    """The k best candidates, at least one (none when there is no candidate)."""
    return c.mask(c.order[: max(min(k, c.scores.numel()), 1)])


@plugins.strategy("top_k")
def _top_k(c: Candidates, value: float) -> torch.Tensor:
    """A fraction ``value`` of all groups, the best first."""
    _finite(value)
    if not 0 < value <= 1:
        raise ValueError(
            f"filter.value={value}: top_k keeps this fraction of the groups, in (0, 1]. Fix: filter.value=0.25"
        )
    return _first(c, int(value * c.groups))


@plugins.strategy("top_k_abs")
def _top_k_abs(c: Candidates, value: float) -> torch.Tensor:
    """``value`` groups, the best first."""
    _finite(value)
    if value < 1 or value != int(value):
        raise ValueError(
            f"filter.value={value}: top_k_abs keeps this many groups, a whole number ≥ 1. Fix: filter.value=4"
        )
    return _first(c, int(value))


@plugins.strategy("min_p")
def _min_p(c: Candidates, value: float) -> torch.Tensor:
    """The groups scoring at least ``value`` of the best (largest=False: at most the least over ``value``)."""
    _finite(value)
    if not 0 < value <= 1:
        raise ValueError(
            f"filter.value={value}: min_p keeps the groups scoring at least this fraction of the best, in "
            "(0, 1]. Fix: filter.value=0.5"
        )
    if c.scores.numel() == 0:
        return c.mask(c.order)
    if c.largest:
        hit = c.scores >= c.scores.max() * value - _ZERO
    else:
        # The reference divides by (p + 1e-10), a no-op in its float32 and a guard we do not need
        # (p > 0 is validated); in float64 it would drop the minimum itself at p = 1.
        hit = c.scores <= c.scores.min() / value + _ZERO
    return c.mask(hit.nonzero().squeeze(-1))


@plugins.strategy("quantile")
def _quantile(c: Candidates, value: float) -> torch.Tensor:
    """Band ``value`` of ``bands`` equal-count bands of the candidates, 1 = the best."""
    _finite(value)
    bands = c.bands
    if isinstance(bands, bool) or not float(bands).is_integer() or bands < 1:
        raise ValueError(
            f"filter.bands={bands!r}: quantile splits the groups into this many equal-count bands, a "
            "whole number >= 1. Fix: filter.bands=4 (quartiles)"
        )
    if not float(value).is_integer() or not 1 <= value <= bands:
        raise ValueError(
            f"filter.value={value}: quantile trains on one band of filter.bands={bands}, a whole number "
            f"from 1 (the highest scores) to {bands}. Fix: filter.value=1"
        )
    return c.mask(_quantile_band(c.key, int(value), int(bands)))


@plugins.strategy("random_drop")
def _random_drop(c: Candidates, value: float) -> torch.Tensor:
    """As many groups as ``top_p`` keeps at ``value``, drawn uniformly from every group, zero-score ones
    included: the control that takes as few optimizer steps as the SNR filter without choosing by signal."""
    kept = int(_top_p(c, value).sum())
    if c.generator is None:
        raise ValueError(
            "filter.strategy=random_drop draws the groups it keeps and was given no generator. Fix: "
            "filter=random_drop (its config seeds the draws with the run's seed)"
        )
    chosen = torch.randperm(c.groups, generator=c.generator)[:kept].to(c.index.device)
    keep = torch.zeros(c.groups, dtype=torch.bool, device=c.index.device)
    keep[chosen] = True
    return keep


@plugins.strategy("none")
def _none(c: Candidates, value: float) -> torch.Tensor:
    """Every group, zero-score ones included (the no-filter baseline)."""
    return torch.ones(c.groups, dtype=torch.bool, device=c.index.device)


def _top_p_linear(cand_scores: torch.Tensor, order: torch.Tensor, p: float, eps: float) -> torch.Tensor:
    """Local indices of the shortest prefix of `order` whose score sum reaches p·Σs − eps (else none)."""
    threshold = p * float(cand_scores.sum()) - eps
    cumulative, count = 0.0, 0
    for score in cand_scores[order].tolist():
        if cumulative >= threshold or score <= 0:
            break
        cumulative += score
        count += 1
    return order[:count] if cumulative >= threshold else order[:0]


def _quantile_band(key: torch.Tensor, band: int, bands: int) -> torch.Tensor:
    """Local indices of band `band` (1 = the highest keys) of min(bands, C) equal-count bands of key [C]."""
    c = key.numel()
    n = min(bands, c)
    ascending = torch.sort(key, stable=True).indices  # [C] equal keys keep group order
    which = n - torch.arange(c, device=key.device) * n // max(
        c, 1
    )  # [C] band of each ascending rank, 1 = top
    return ascending[which == band]


def select_groups(
    scores: torch.Tensor,
    strategy: str = "top_p",
    value: float = 0.9,
    *,
    mode: str = "linear",
    include_zero: bool = False,
    eps: float = 0.01,
    largest: bool = True,
    bands: int = 4,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Boolean keep-mask [G] over groups from their scores [G] (see the module docstring); ``generator``
    draws ``random_drop``'s groups."""
    if strategy not in plugins.STRATEGIES:
        raise ValueError(f"filter.strategy={strategy!r} is unknown. Fix: choose one of {plugins.STRATEGIES}")
    if scores.dim() != 1 or scores.numel() == 0:
        raise ValueError(
            f"select_groups expects a non-empty [G] score vector, got shape {tuple(scores.shape)}"
        )
    s = scores.detach().to(torch.float64)
    if not torch.isfinite(s).all():
        raise ValueError("select_groups: scores contain NaN or inf")
    index = torch.arange(s.numel(), device=scores.device)
    if not include_zero:
        index = index[s.abs() > _ZERO]
    key = s[index] if largest else -s[index]
    order = torch.sort(key, descending=True, stable=True).indices  # [C]
    candidates = Candidates(index, s[index], key, order, s.numel(), largest, mode, eps, bands, generator)
    return plugins.STRATEGIES[strategy](candidates, value)


def extreme_rows(returns: torch.Tensor, fraction: float = 0.5) -> torch.Tensor:
    """[G, K] returns (K rollouts of group g in row g) -> [G, K] bool: each group's most extreme rollouts.

    Each group keeps m = min(K, max(2, ⌊fraction·K⌋)) rollouts: the first ⌈m/2⌉ and the last ⌊m/2⌋ of one
    stable descending sort of its returns (fraction 0.5 at K = 16: the top 4 and the bottom 4, 8 of 16).
    At least 2, so that both ends are represented; fraction 1 keeps every rollout. One sort makes the two
    ends disjoint even when returns tie: equal returns keep rollout order, so at the top edge the lower
    rollout index is kept and at the bottom edge the higher one. A group of equal returns keeps m rollouts
    like any other (every prompt trains, as in the paper's control).
    """
    if returns.dim() != 2 or returns.numel() == 0:
        raise ValueError(f"extreme_rows expects non-empty [G, K] returns, got shape {tuple(returns.shape)}")
    if not 0 < fraction <= 1:
        raise ValueError(
            f"extreme_rows: fraction (filter.trajectory_fraction) must be in (0, 1], got {fraction}"
        )
    x = returns.detach().to(torch.float64)
    if not torch.isfinite(x).all():
        raise ValueError("extreme_rows: returns contain NaN or inf")
    g, k = x.shape
    m = min(k, max(2, int(fraction * k)))
    top = (m + 1) // 2
    position = torch.arange(k, device=returns.device)
    kept_position = (position < top) | (position >= k - (m - top))  # [K] sorted positions kept
    order = torch.sort(x, dim=1, descending=True, stable=True).indices  # [G, K]
    keep = torch.zeros(g, k, dtype=torch.bool, device=returns.device)
    return keep.scatter_(1, order, kept_position.expand(g, k))


def filter_stats(scores: torch.Tensor, keep: torch.Tensor) -> dict[str, float]:
    """Filter diagnostics: counts, score mean/std/max before and after, Std/Mean of scores.

    Stds are population stds (a single kept group has std 0, not NaN); kept_* are 0 when nothing is
    kept; `score_cv` = Std(s)/Mean(s) (0 when the mean is 0), the paper's predictor of whether
    filtering helps (bimodal RV, e.g. > 1).
    """
    if scores.dim() != 1 or keep.shape != scores.shape or scores.numel() == 0:
        raise ValueError(
            f"filter_stats: scores {tuple(scores.shape)} and keep {tuple(keep.shape)} must be the same [G], G > 0"
        )
    s = scores.detach().to(torch.float64)
    k = keep.to(torch.bool)
    kept = s[k]
    mean = float(s.mean())
    std = float(s.std(unbiased=False))
    n_kept = int(k.sum())
    return {
        "kept": float(n_kept),
        "kept_ratio": n_kept / s.numel(),
        "zero_score": float((s.abs() <= _ZERO).sum()),
        "score_mean": mean,
        "score_std": std,
        "score_max": float(s.max()),
        "kept_score_mean": float(kept.mean()) if n_kept else 0.0,
        "kept_score_std": float(kept.std(unbiased=False)) if n_kept else 0.0,
        "kept_score_max": float(kept.max()) if n_kept else 0.0,
        "score_cv": std / mean if mean != 0 else 0.0,
        "empty": 0.0 if n_kept else 1.0,
    }


@plugins.loss_scaling("none")
def _unscaled(kept_ratio: float) -> float:
    return 1.0


@plugins.loss_scaling("linear")
def _linear(kept_ratio: float) -> float:
    return kept_ratio


@plugins.loss_scaling("sqrt")
def _sqrt(kept_ratio: float) -> float:
    return math.sqrt(kept_ratio)


def loss_scale(kept_ratio: float, mode: str) -> float:
    """Loss multiplier for a filtered batch: ``algo.loss_scaling``'s function of the kept ratio: 1 (none),
    kept_ratio (linear) or sqrt(kept_ratio) (sqrt)."""
    if mode not in LOSS_SCALINGS:
        raise ValueError(f"unknown algo.loss_scaling {mode!r}; choose one of {LOSS_SCALINGS}")
    if not 0.0 <= kept_ratio <= 1.0:
        raise ValueError(f"loss_scale: kept_ratio must be in [0, 1], got {kept_ratio}")
    return LOSS_SCALINGS[mode](kept_ratio)
