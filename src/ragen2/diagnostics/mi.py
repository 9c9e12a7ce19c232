"""MI proxies from an in-batch cross-scoring matrix (docs/method.md §3).

``L[r, j] = log p(z_r | x_j)`` for R reasoning rows and C *distinct* prompts (columns); the mixture
over prompts is uniform over those C columns. Every statistic exists per token (``L / |z_r|``, the
un-suffixed keys) and per sequence (``_seq``).

``contrast`` (``_seq``) is the matched log-likelihood minus the mean of the mismatched ones, ``mean_r (L[r,
true] − mean_{j≠true} L[r, j])``: an estimate of the mean KL divergence between the reasoning distributions
of two prompts, an upper bound on I(X;Z) that, unlike ``mi_est`` (at most log C), does not saturate. With
every mismatched column Δ nats behind, ``mi_est = log C − log(1 + (C − 1) e^(−Δ))`` is within 0.1 of its
ceiling once Δ > log(10 (C − 1)), while ``contrast`` is Δ itself: it sees the input dependence fall long
before ``mi_est`` or retrieval can (docs/diagnostics.md, "What each proxy can see").

Ties in retrieval are resolved conservatively: the true column's rank is
``1 + #(columns strictly greater) + #(other columns tied with it)``, i.e. the number of columns
whose score is >= the true score. A row whose scores are all equal therefore ranks its prompt
last, so an input-blind model scores chance or below, never above.
"""

import math

import torch
from torch import Tensor

STD_EPS = 1e-3
"""ε in ``(matched − marginal) / (σ(marginal) + ε)``, as in the reference."""

RETRIEVAL_KS = (2, 4, 8)

METRIC_KEYS = (
    "mi_est",
    "mi_est_seq",
    "mi_upper_bound",
    "cond_entropy",
    "cond_entropy_seq",
    "reasoning_entropy",
    "reasoning_entropy_seq",
    "retrieval_acc",
    *(f"retrieval_acc@{k}" for k in RETRIEVAL_KS),
    "retrieval_chance",
    "retrieval_above_chance",
    *(f"retrieval_chance@{k}" for k in RETRIEVAL_KS),
    *(f"retrieval_above_chance@{k}" for k in RETRIEVAL_KS),
    "marginal_std",
    "marginal_std_seq",
    "mi_zscore",
    "mi_zscore_seq",
    "contrast",
    "contrast_seq",
)


def validate_scores(logp_sum: Tensor, prompt_index: Tensor, num_tokens: Tensor) -> None:
    """Raise ``ValueError`` naming the argument when the cross-scoring triple is malformed."""
    if not isinstance(logp_sum, Tensor) or logp_sum.dim() != 2 or not logp_sum.is_floating_point():
        raise ValueError(
            f"logp_sum must be a float tensor of shape [R, C], got "
            f"{getattr(logp_sum, 'shape', type(logp_sum))}; pass one row per reasoning and one column per prompt"
        )
    rows, cols = logp_sum.shape
    if rows == 0 or cols == 0:
        raise ValueError(f"logp_sum has shape {tuple(logp_sum.shape)}; need at least one row and one column")
    if not bool(torch.isfinite(logp_sum).all()):
        raise ValueError("logp_sum holds non-finite values; every (row, column) pair must be scored")
    if (
        not isinstance(prompt_index, Tensor)
        or prompt_index.shape != (rows,)
        or prompt_index.is_floating_point()
        or prompt_index.dtype == torch.bool
    ):
        raise ValueError(
            f"prompt_index must be an integer tensor of shape ({rows},), got {prompt_index.dtype} "
            f"{tuple(prompt_index.shape)}"
        )
    if bool(((prompt_index < 0) | (prompt_index >= cols)).any()):
        raise ValueError(f"prompt_index values must lie in [0, {cols}), got {prompt_index.tolist()}")
    if not isinstance(num_tokens, Tensor) or num_tokens.shape != (rows,):
        raise ValueError(
            f"num_tokens must be a tensor of shape ({rows},), got {getattr(num_tokens, 'shape', type(num_tokens))}"
        )
    if bool((num_tokens <= 0).any()):
        raise ValueError(
            "num_tokens has rows with no reasoning tokens; drop rows without a valid Z before scoring"
        )


def matched_marginal(scores: Tensor, prompt_index: Tensor) -> tuple[Tensor, Tensor]:
    """Return ``matched[r] = L[r, true]`` and ``marginal[r] = logsumexp_j L[r, j] − log C``."""
    rows, cols = scores.shape
    matched = scores[torch.arange(rows, device=scores.device), prompt_index]
    marginal = torch.logsumexp(scores, dim=1) - math.log(cols)
    return matched, marginal


def zscore(matched: Tensor, marginal: Tensor, sigma: float) -> float:
    """``mean((matched − marginal) / (sigma + ε))``: MI in units of the marginal's spread."""
    if not math.isfinite(sigma) or sigma < 0:
        raise ValueError(f"sigma must be a finite non-negative std, got {sigma}")
    return float(((matched - marginal) / (sigma + STD_EPS)).mean())


def true_rank(scores: Tensor, prompt_index: Tensor) -> Tensor:
    """Rank of the true column per row (1 = best), ties counted against it (see module doc)."""
    matched = scores[torch.arange(scores.shape[0], device=scores.device), prompt_index]
    return (scores >= matched[:, None]).sum(dim=1)


def contrast(scores: Tensor, prompt_index: Tensor) -> float:
    """``mean_r (L[r, true] − mean_{j≠true} L[r, j])``; 0 with a single column (no mismatch to compare)."""
    rows, cols = scores.shape
    if cols < 2:
        return 0.0
    matched = scores[torch.arange(rows, device=scores.device), prompt_index]
    mismatched = (scores.sum(dim=1) - matched) / (cols - 1)
    return float((matched - mismatched).mean())


def _family(scores: Tensor, prompt_index: Tensor, suffix: str) -> dict[str, float]:
    matched, marginal = matched_marginal(scores, prompt_index)
    sigma = float(marginal.std(correction=0))
    return {
        f"contrast{suffix}": contrast(scores, prompt_index),
        f"mi_est{suffix}": float((matched - marginal).mean()),
        f"cond_entropy{suffix}": float(-matched.mean()),
        f"reasoning_entropy{suffix}": float(-marginal.mean()),
        f"marginal_std{suffix}": sigma,
        f"mi_zscore{suffix}": zscore(matched, marginal, sigma),
    }


def per_token(logp_sum: Tensor, num_tokens: Tensor) -> Tensor:
    """Per-token log-likelihoods ``L[r, j] / |z_r|`` in float64."""
    return logp_sum.double() / num_tokens.double()[:, None]


def mi_metrics(logp_sum: Tensor, prompt_index: Tensor, num_tokens: Tensor) -> dict[str, float]:
    """All MI proxies of one cross-scoring pass; keys are ``METRIC_KEYS``.

    logp_sum: [R, C] summed log p(z_r | x_j); prompt_index: [R] true column of each row;
    num_tokens: [R] |z_r| (> 0). Computed in float64.
    """
    validate_scores(logp_sum, prompt_index, num_tokens)
    prompt_index = prompt_index.long()
    cols = logp_sum.shape[1]
    token_scores = per_token(logp_sum, num_tokens)
    out = _family(token_scores, prompt_index, "") | _family(logp_sum.double(), prompt_index, "_seq")

    # Dividing a row by its own |z_r| does not reorder it, so both scales retrieve identically.
    rank = true_rank(token_scores, prompt_index)
    acc = float((rank == 1).double().mean())
    out["retrieval_acc"] = acc
    out["retrieval_chance"] = 1.0 / cols
    out["retrieval_above_chance"] = acc - 1.0 / cols
    for k in RETRIEVAL_KS:
        k_eff = min(k, cols)  # the true prompt is among the top k_eff of C columns by chance k_eff/C
        out[f"retrieval_acc@{k}"] = float((rank <= k_eff).double().mean())
        out[f"retrieval_chance@{k}"] = k_eff / cols
        out[f"retrieval_above_chance@{k}"] = out[f"retrieval_acc@{k}"] - k_eff / cols
    out["mi_upper_bound"] = math.log(cols)
    return {key: out[key] for key in METRIC_KEYS}
