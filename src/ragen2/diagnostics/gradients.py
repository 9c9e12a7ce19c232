"""Gradient decomposition by reward-variance bucket (docs/method.md §5): the buckets, the norms, the figure.

The SNR evidence of the paper: split an iteration's groups into quantile buckets of within-group reward
variance (RV) and compare, bucket by bucket, the gradient norm of the task term with those of the
regularisers (entropy, KL). Expected: the task norm grows with RV, the regulariser norms stay flat, so in
low-RV buckets the update is driven by input-agnostic regularisation. The Lightning side (which batch,
which loss terms, the backward passes) is ``ragen2.callbacks.GradientBuckets``; this file is pure math.

Buckets (``rv_buckets``):
- RV of a group is the Bessel-corrected variance of its episode returns (0 for a group of one); its
  order is that of the filter's ``reward_std``, so the buckets are the same for either.
- Groups are ranked by RV, ties broken by group id (deterministic), and the group of rank r of G goes to
  bucket ⌊r·n/G⌋: n equal-count quantile buckets (sizes differ by at most one, the larger ones spread
  evenly), ``q1`` the lowest RV. Equal-RV groups, e.g. many all-fail groups of RV 0, may straddle
  adjacent buckets: counts stay equal, as in the paper's "six equal-sized buckets", and each bucket's
  ``rv_min``/``rv_max`` shows it (several buckets of RV 0 mean a batch with many zero-variance groups).
- Fewer groups than buckets: one bucket per group, ``q1`` … ``qG``.
- ``all`` holds every group, kept or not by the filter.

Norms (``TermNorm``), per bucket b and term (task = the policy objective, entropy, KL; coefficients
applied, as the optimizer sees them). Let L_b be the term over the bucket's rows as one mini-batch with
the algorithm's own aggregation (``algo.loss_agg``), and S_b = W_b·L_b the *summed* term, where W_b is the
aggregation's normaliser: the bucket's sampled tokens N_b for ``token-mean``, its non-empty samples n_b
for the ``seq-mean-*`` modes. Then

- ``grad/<b>/<term>``            = ‖∇L_b‖₂ = ‖∇S_b‖₂ / W_b: the pre-clip global norm over the policy's
  parameters that ``train/grad_norm`` would read if the update stepped on this bucket alone;
- ``grad/<b>/<term>_per_sample`` = ‖∇S_b‖₂ / n_b;
- ``grad/<b>/<term>_per_token``  = ‖∇S_b‖₂ / N_b.

So one of the two normalised numbers equals the plain one (per-token for ``token-mean``, per-sample for
the sequence means). Summed terms add over disjoint buckets, so S_all = Σ_b S_b: the ``all`` gradient is
the sum of the buckets', not another backward pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = [
    "ALL",
    "TERMS",
    "Bucket",
    "GradientPass",
    "TermNorm",
    "bucket_names",
    "group_reward_variance",
    "plot_buckets",
    "rv_buckets",
]

ALL = "all"
TERMS = ("task", "entropy", "kl")


@dataclass(frozen=True)
class TermNorm:
    """One term's gradient over one bucket (see the module doc): ‖∇L_b‖₂ and ‖∇S_b‖₂ per sample and per token."""

    norm: float
    per_sample: float
    per_token: float

    @classmethod
    def of(cls, summed_norm: float, normaliser: float, samples: float, tokens: float) -> TermNorm:
        """From ‖∇S_b‖₂ and the counts (an empty count divides by 1: its gradient is 0 anyway)."""
        return cls(
            summed_norm / max(normaliser, 1.0),
            summed_norm / max(samples, 1.0),
            summed_norm / max(tokens, 1.0),
        )


@dataclass(frozen=True)
class Bucket:
    """One bucket of groups (``q1`` … lowest RV first, or ``all``), its counts, its RV and its terms' norms."""

    name: str
    groups: int
    samples: float  # non-empty samples
    tokens: float  # sampled tokens
    rv_mean: float
    rv_min: float | None = None  # a quantile bucket's; None for ``all``
    rv_max: float | None = None
    norms: dict[str, TermNorm] = field(default_factory=dict)  # by term (``TERMS``) the loss has

    def as_metrics(self) -> dict[str, float]:
        key = f"grad/{self.name}"
        out = {
            f"{key}/groups": float(self.groups),
            f"{key}/samples": self.samples,
            f"{key}/tokens": self.tokens,
        }
        out[f"{key}/rv_mean"] = self.rv_mean
        if self.rv_min is not None and self.rv_max is not None:
            out |= {f"{key}/rv_min": self.rv_min, f"{key}/rv_max": self.rv_max}
        for term, n in self.norms.items():
            out |= {f"{key}/{term}": n.norm, f"{key}/{term}_per_sample": n.per_sample}
            out[f"{key}/{term}_per_token"] = n.per_token
        return out


@dataclass(frozen=True)
class GradientPass:
    """One iteration's gradients by bucket; ``as_metrics`` names them (``grad/<bucket>/*``,
    ``time/gradient_buckets``)."""

    iteration: int
    buckets: tuple[Bucket, ...] = ()  # q1 … (lowest RV first)
    total: Bucket | None = None  # ``all``: every group (None for an empty batch)
    seconds: float = 0.0

    def bucket(self, name: str) -> Bucket:
        """A bucket by name (``q1`` … or ``all``)."""
        found = [b for b in (*self.buckets, self.total) if b is not None and b.name == name]
        if not found:
            raise KeyError(f"no bucket {name!r} in iteration {self.iteration}'s pass")
        return found[0]

    def as_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for b in (*self.buckets, self.total):
            if b is not None:
                out |= b.as_metrics()
        return out | {"time/gradient_buckets": self.seconds}


def group_reward_variance(returns: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """[B] episode returns and [B] group ids 0..G−1 -> [G] Bessel-corrected within-group variance (float64).

    A group of one sample has variance 0 (nothing varies); a group id with no sample also gets 0.
    """
    if returns.dim() != 1 or group_index.shape != returns.shape:
        raise ValueError(
            f"returns {tuple(returns.shape)} and group_index {tuple(group_index.shape)} must both be [B]"
        )
    if returns.numel() == 0:
        return torch.zeros(0, dtype=torch.float64)
    g = int(group_index.max()) + 1
    x = returns.to(torch.float64)
    count = torch.zeros(g, dtype=torch.float64).index_add_(0, group_index, torch.ones_like(x))
    mean = torch.zeros(g, dtype=torch.float64).index_add_(0, group_index, x) / count.clamp(min=1.0)
    sq = torch.zeros(g, dtype=torch.float64).index_add_(0, group_index, (x - mean[group_index]).square())
    return sq / (count - 1.0).clamp(min=1.0)


def bucket_names(n: int) -> list[str]:
    """``q1`` (lowest RV) … ``qn``."""
    return [f"q{k + 1}" for k in range(n)]


def rv_buckets(variance: torch.Tensor, num_buckets: int = 6) -> list[torch.Tensor]:
    """[G] per-group RV -> min(num_buckets, G) tensors of group ids, lowest RV first (see the module doc)."""
    if num_buckets < 1:
        raise ValueError(f"num_buckets={num_buckets} must be ≥ 1")
    g = int(variance.numel())
    if g == 0:
        return []
    n = min(num_buckets, g)
    # stable sort of the ids by RV: equal RVs keep group-id order
    order = torch.sort(variance.to(torch.float64), stable=True).indices
    which = torch.arange(g) * n // g  # [G] bucket of each rank
    return [order[which == k] for k in range(n)]


def plot_buckets(found: GradientPass, out_png: Path, title: str = "", terms: Sequence[str] = TERMS) -> Path:
    """The paper's figure from a pass: one panel per term (its norm per bucket, ``all`` dashed), each on its
    own scale (the regularisers are orders of magnitude smaller), then the RV."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [b.name for b in found.buckets]
    every = [*found.buckets, *([found.total] if found.total is not None else [])]
    present = [t for t in terms if any(t in b.norms for b in every)]
    fig, axes = plt.subplots(1, len(present) + 1, figsize=(4 * (len(present) + 1), 3.6), squeeze=False)
    x = list(range(len(names)))
    rv = [b.rv_mean for b in found.buckets]
    for n, (ax, term) in enumerate(zip(axes[0], present)):
        ys = [b.norms[term].norm if term in b.norms else math.nan for b in found.buckets]
        ax.plot(x, ys, marker="o", color=f"C{n}")
        if found.total is not None and term in found.total.norms:
            ax.axhline(found.total.norms[term].norm, ls="--", lw=0.8, color=f"C{n}", label=ALL)
            ax.legend(fontsize=8)
        ax.set_ylim(bottom=0.0)
        ax.set_title(f"{term} gradient norm", fontsize=9)
        ax.set_xticks(x, names, fontsize=8)
        ax.set_xlabel("reward-variance bucket (low to high)", fontsize=8)
    axes[0][-1].bar(x, rv, color="C7")
    axes[0][-1].set_xticks(x, names, fontsize=8)
    axes[0][-1].set_title("mean within-group reward variance", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png
