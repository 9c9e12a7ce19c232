"""Token log-probabilities and entropies of sampled tokens, without a [B, T, V] tensor; masked means.

The one implementation the update, its tests and cross-scoring use. ``token_stats`` applies the LM head to
the hidden states that predict the tokens, chunk by chunk: log p = gather(l, id) − logsumexp(l) and
H = logsumexp(l) − Σ softmax(l)·l (verl's ``logprobs_from_logits`` / ``entropy_from_logits``) over
l = head(h) / T. ``sampled_logprobs`` runs it on the loss-masked positions of a [B, T] batch only.
Departures from verl: the head itself runs inside the chunks, so no full-batch logits exist; when
gradients are on every chunk is activation-checkpointed, so the forward keeps no [rows, V]
intermediate (logits, softmax, fp32 upcast) alive and the backward recomputes one chunk at a time; a pass
of at most ``CHECKPOINT_MIN_LOGITS`` logits (4 MiB) is not, its recomputation costing more than it saves.
Half-precision logits are upcast to fp32 per chunk.

A chunk holds at most ``LOGIT_BUDGET`` logits (``chunk_rows_for``): 1,024 rows of SmolLM2's 49,152-token
vocabulary, 331 of Qwen2.5's 151,936, so a pass's peak memory does not grow with the vocabulary (measured
at 64 rows: bench/bench_vocab_memory.py); and at most ``MAX_CHUNK_ROWS`` rows of a smaller vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

__all__ = [
    "CHECKPOINT_MIN_LOGITS",
    "LOGIT_BUDGET",
    "MAX_CHUNK_ROWS",
    "chunk_rows_for",
    "masked_mean",
    "sampled_logprobs",
    "token_stats",
]

Head = Callable[[torch.Tensor], torch.Tensor]  # [n, H] hidden states -> [n, V] logits
# logits per chunk (192 MiB in fp32): a chunk's few [rows, V] intermediates stay around a GiB at any V
LOGIT_BUDGET = 1024 * 49152
CHECKPOINT_MIN_LOGITS = 1 << 20  # 4 MiB of fp32 logits: a pass this small is not checkpointed
# rows per chunk at most: a small vocabulary's bigger chunk only leaves the CPU's cache (the organism's 998 ids
# at 16k rows: 2.3× slower than in chunks of 1,024, one thread; the rows' results are the same)
MAX_CHUNK_ROWS = 1024


def chunk_rows_for(vocab: int, budget: int = LOGIT_BUDGET) -> int:
    """Rows of ``vocab`` logits that fit ``budget`` logits (at least one), at most ``MAX_CHUNK_ROWS``."""
    return max(1, min(MAX_CHUNK_ROWS, budget // vocab))


def _vocab(head: Head, hidden: torch.Tensor) -> int:
    """The head's output width: an ``nn.Linear``'s ``out_features``, the logits' own width with the
    identity head, else one row's logits."""
    out = getattr(head, "out_features", None)
    if isinstance(out, int):
        return out
    if head is _identity:
        return hidden.shape[-1]
    with torch.no_grad():
        return head(hidden[:1]).shape[-1]


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for half types (logsumexp over 49k entries loses digits in bf16), fp32 or fp64 as given."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16, torch.float32) else dtype


def token_stats(
    hidden: torch.Tensor,  # [N, H] the states that predict the tokens (logits themselves with the identity head)
    ids: torch.Tensor,  # [N] the predicted token ids
    head: Head = _identity,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[N] log-probs of ``ids`` under softmax(head(hidden) / T) and, if asked, [N] entropies of it.

    ``temperature`` ≤ 0 means greedy sampling, scored at T = 1. ``chunk_rows``: rows per chunk; None
    fits ``LOGIT_BUDGET`` logits in a chunk (``chunk_rows_for``).
    """
    if chunk_rows is not None and (not isinstance(chunk_rows, int) or chunk_rows < 1):
        raise ValueError(f"chunk_rows must be a positive int or None, got {chunk_rows!r}; use e.g. 1024")
    if hidden.dim() != 2 or ids.shape != hidden.shape[:1]:
        raise ValueError(
            f"token_stats: hidden {tuple(hidden.shape)} and ids {tuple(ids.shape)} disagree; "
            "hidden must be [N, H] (or [N, V] logits) and ids [N]"
        )
    if ids.dtype != torch.long:
        raise ValueError(f"token_stats: ids must be torch.long, got {ids.dtype}")
    scale = 1.0 / temperature if temperature > 0 else 1.0
    vocab = _vocab(head, hidden) if hidden.shape[0] else 1
    rows = chunk_rows or chunk_rows_for(vocab)

    def chunk_stats(h: torch.Tensor, chunk_ids: torch.Tensor) -> torch.Tensor:
        logits = head(h)
        logits = logits.to(_compute_dtype(logits.dtype))  # [n, V]
        if (
            scale != 1.0
        ):  # a copy of every logit: a quarter of this function's time on the CPU, skipped at T = 1
            logits = logits * scale
        lse = torch.logsumexp(logits, dim=-1)  # [n]
        lp = logits.gather(-1, chunk_ids[:, None]).squeeze(-1) - lse
        if not with_entropy:
            return lp[:, None]
        return torch.stack([lp, lse - (logits.softmax(-1) * logits).sum(-1)], dim=-1)  # [n, 2]

    # a small pass keeps its intermediates: recomputing them cost a sixth of a 170k-parameter model's update
    use_ckpt = torch.is_grad_enabled() and hidden.shape[0] * vocab > CHECKPOINT_MIN_LOGITS
    parts = [
        checkpoint(chunk_stats, hidden[s : s + rows], ids[s : s + rows], use_reentrant=False)
        if use_ckpt
        else chunk_stats(hidden[s : s + rows], ids[s : s + rows])
        for s in range(0, hidden.shape[0], rows)
    ]
    width = 2 if with_entropy else 1
    stats = torch.cat(parts) if parts else hidden.new_zeros((0, width), dtype=_compute_dtype(hidden.dtype))
    return stats[:, 0], (stats[:, 1] if with_entropy else None)


def sampled_logprobs(
    hidden: torch.Tensor,  # [b, T, H] the trunk's last hidden states
    input_ids: torch.Tensor,  # [b, T]
    loss_mask: torch.Tensor,  # [b, T] 1 where the token was sampled
    head: Head,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[b, T] fp32 log-probs (and entropies) of the loss-masked tokens, 0 elsewhere.

    Position p predicts token p+1, so the head runs on the hidden states before masked tokens only.
    """
    target = loss_mask[:, 1:].bool()  # [b, T-1]
    logp, entropy = token_stats(
        hidden[:, :-1][target], input_ids[:, 1:][target], head, temperature, with_entropy, chunk_rows
    )
    out = hidden.new_zeros(input_ids.shape, dtype=torch.float32)
    placed_logp = out.clone()
    placed_logp[:, 1:][target] = logp
    if entropy is None:
        return placed_logp, None
    placed_entropy = out.clone()
    placed_entropy[:, 1:][target] = entropy
    return placed_logp, placed_entropy


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over entries where mask is 1 (all dims, or along `dim`); 0 where the mask is empty."""
    if x.shape != mask.shape:
        raise ValueError(f"masked_mean: x {tuple(x.shape)} and mask {tuple(mask.shape)} must match")
    m = mask.to(x.dtype)
    total = (x * m).sum() if dim is None else (x * m).sum(dim)
    count = m.sum() if dim is None else m.sum(dim)
    # Dividing by 1 where the count is 0 gives 0 (the masked sum is 0) and keeps the graph intact.
    return total / torch.where(count > 0, count, torch.ones_like(count))
