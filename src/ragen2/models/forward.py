"""The two halves of an HF causal LM that the update and the critic use separately: trunk and LM head.

The update runs the decoder once per micro-batch and the LM head only on the positions that predict
sampled tokens (``ragen2.algos.logprobs.sampled_logprobs``); a value head on the shared trunk reads the
same hidden states.

``decoder_hidden(..., share_prefix=True)`` runs a prefix that several rows share (a group's rollouts
all start with the same prompt) once, with gradients: the same function of the weights, the backward
summing the shared prefix's gradient over its rows. On single-turn tasks the prompt is most of each row
(Bandit: 236 of ~280 tokens), so the update runs about a third of the tokens. Two layouts: packed rows
(``packed_prefix_hidden``: each group's prefix and then its rows' own tokens in one row, under a mask; one
forward) where every packed row fits ``PACKED_MAX_WIDTH`` and the attention takes a 4-D mask, else the
rows' remainders on the prefix's cached keys and values (``shared_prefix_hidden``: a forward per prefix
length and one more). The numbers equal the plain pass up to float rounding (different matmul shapes sum
in a different order), which is why it is a switch and not the default.

A row that packs several sequences (one per turn, where the chat template rewrites earlier turns:
``rollout.layout=per_turn``) runs each sequence alone, on its own context (``packed_hidden``): the row's
hidden states are its sequences' own, in place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from ragen2.models.kv import as_cache, cache_layers

Decoder = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # ([n, L] ids, [n, L] mask) -> [n, L, H]


def packed_hidden(run: Decoder, input_ids: torch.Tensor, sequence_index: torch.Tensor) -> torch.Tensor:
    """[b, T, H] hidden states of rows that pack sequences one after another (``sequence_index``: 1, 2, … on
    each sequence's tokens, 0 on padding), each sequence run by ``run`` alone, as a row of its own."""
    b, width = input_ids.shape
    spans = [  # (row, start, length) of every sequence
        (i, int(where[0]), int(where.numel()))
        for i in range(b)
        for n in range(1, int(sequence_index[i].max()) + 1)
        if (where := torch.nonzero(sequence_index[i] == n).squeeze(-1)).numel()
    ]
    device = input_ids.device
    rows, starts, lengths = (torch.tensor(x, device=device) for x in zip(*spans, strict=True))
    step = torch.arange(int(lengths.max()), device=device)
    inside = step < lengths[:, None]  # [n, L]
    positions = (starts[:, None] + step).clamp(max=width - 1)
    ids = torch.where(inside, input_ids[rows].gather(1, positions), torch.zeros_like(positions))
    hidden = run(ids, inside.long())  # [n, L, H]
    out = hidden.new_zeros((b, width, hidden.shape[-1]))
    at = (rows[:, None].expand_as(positions)[inside], positions[inside])
    return out.index_put(at, hidden[inside])


def by_sequence(
    run: Decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor, sequence_index: torch.Tensor | None
) -> torch.Tensor:
    """``run`` on the rows, or on each sequence alone where a row packs several (``packed_hidden``)."""
    if sequence_index is None or not sequence_index.numel() or int(sequence_index.max()) <= 1:
        return run(input_ids, attention_mask)
    return packed_hidden(run, input_ids, sequence_index)


def decoder_hidden(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    share_prefix: bool = False,
    sequence_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """[b, T] ids -> [b, T, H] last hidden states of the causal LM's decoder (no LM head).

    ``share_prefix``: compute prefixes shared by ≥ 2 right-padded rows once (``shared_prefix_hidden``).
    ``sequence_index`` ([b, T], ``RolloutBatch.sequence_index``): rows that pack several sequences run each
    alone (``packed_hidden``).
    """
    if sequence_index is not None:
        return by_sequence(
            lambda ids, mask: decoder_hidden(model, ids, mask, share_prefix),
            input_ids,
            attention_mask,
            sequence_index,
        )
    if share_prefix:
        groups = prefix_groups(input_ids, attention_mask)
        if any(len(g.rows) > 1 for g in groups):
            if packs(model, attention_mask, groups):
                return packed_prefix_hidden(model, input_ids, attention_mask, groups)
            # checkpointed layers return no keys/values to build on
            if not (getattr(model, "is_gradient_checkpointing", False) and model.training):
                return shared_prefix_hidden(model, input_ids, attention_mask, groups)
    return model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def lm_head(model: Any) -> torch.nn.Module:
    """The causal LM's output projection, [n, H] -> [n, V]."""
    return model.get_output_embeddings()


@dataclass
class PrefixGroup:
    rows: list[int]  # rows of the batch that start with the same ``length`` tokens
    length: int  # shared tokens, < every row's length (each row keeps ≥ 1 token of its own); 0 = none


def prefix_groups(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, min_shared: int = 8
) -> list[PrefixGroup]:
    """Rows grouped by common leading runs of ≥ ``min_shared`` real tokens (rows are right-padded), chosen to
    skip the most tokens: in sorted order, a group is a run of rows and skips (rows − 1) × the run's shortest
    common prefix; the runs come from one pass of dynamic programming. A group's rows (a GRPO group's
    rollouts) sharing their whole prompt beat every row sharing a system prompt."""
    lengths = [int(n) for n in attention_mask.sum(-1).tolist()]
    if any(attention_mask[i, :n].min() < 1 for i, n in enumerate(lengths) if n):
        raise ValueError("decoder_hidden(share_prefix=True) needs right-padded rows (mask 1…1 0…0)")
    seqs = [input_ids[i, :n].tolist() for i, n in enumerate(lengths)]
    order = sorted(range(len(seqs)), key=lambda i: seqs[i])

    def shared(a: int, b: int) -> int:  # common prefix, each row keeping ≥ 1 token of its own
        cap, n = min(lengths[a], lengths[b]) - 1, 0
        while n < cap and seqs[a][n] == seqs[b][n]:
            n += 1
        return n

    lcp = [0] + [shared(order[k - 1], order[k]) for k in range(1, len(order))]  # with the previous row
    best = [0] * (len(order) + 1)  # tokens skipped by the best split of order[:k]
    cut = [0] * (len(order) + 1)
    for k in range(1, len(order) + 1):
        best[k], cut[k] = best[k - 1], k - 1  # order[k-1] alone
        common = None
        for i in range(k - 2, -1, -1):  # the run order[i:k]
            common = lcp[i + 1] if common is None else min(common, lcp[i + 1])
            if common < min_shared:
                break
            if best[i] + (k - 1 - i) * common > best[k]:
                best[k], cut[k] = best[i] + (k - 1 - i) * common, i
    groups, k = [], len(order)
    while k:
        i = cut[k]
        rows = sorted(order[i:k])
        length = min(lcp[j] for j in range(i + 1, k)) if k - i > 1 else 0
        groups.append(PrefixGroup(rows, length))
        k = i
    return sorted(groups, key=lambda g: g.rows[0])


#: the widest packed row (a group's prefix and its rows' own tokens) ``packed_prefix_hidden`` runs: its [W, W]
#: mask and attention grow with the square of the width, a cached prefix's per row with the row's length
PACKED_MAX_WIDTH = 1024
#: attention implementations that take an arbitrary 4-D mask (flash attention takes none)
MASKED_ATTENTION = ("sdpa", "eager")


def _packed_lengths(attention_mask: torch.Tensor, groups: list[PrefixGroup]) -> list[int]:
    """Each group's packed width: its prefix once, then each row's tokens after it."""
    lengths = attention_mask.sum(-1).tolist()
    return [g.length + sum(int(lengths[r]) - g.length for r in g.rows) for g in groups]


def packs(model: Any, attention_mask: torch.Tensor, groups: list[PrefixGroup]) -> bool:
    """Whether ``packed_prefix_hidden`` runs these groups: the model's attention takes a 4-D mask and every
    packed row fits ``PACKED_MAX_WIDTH``."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return (
        implementation in MASKED_ATTENTION
        and max(_packed_lengths(attention_mask, groups)) <= PACKED_MAX_WIDTH
    )


def packed_prefix_hidden(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, groups: list[PrefixGroup]
) -> torch.Tensor:
    """[b, T, H] hidden states from one forward of packed rows: each group's prefix once, then each of its
    rows' own tokens, a row's tokens attending to the prefix and (causally) to themselves, at their own
    positions (the prefix's length onwards).

    One forward where ``shared_prefix_hidden`` runs one per prefix length and one more on the cache: a small
    model's pass is mostly per-call cost (the organism's update step: 2–3× faster forward and backward), and
    the backward sums the prefix's gradient over its rows through the indexing that reads its states back.
    """
    b, width = input_ids.shape
    device = input_ids.device
    lengths = attention_mask.sum(-1).tolist()
    # segments (source row, first column, length, packed row, first packed column, segment id: 0 = the prefix)
    segments: list[tuple[int, int, int, int, int, int]] = []
    start_of = [0] * b  # where each row's own tokens begin in its packed row
    row_of = [0] * b
    prefix_of = [0] * b
    packed_width = 0
    for n, g in enumerate(groups):
        segments.append((g.rows[0], 0, g.length, n, 0, 0))
        at = g.length
        for k, r in enumerate(g.rows):
            own = int(lengths[r]) - g.length
            segments.append((r, g.length, own, n, at, k + 1))
            start_of[r], row_of[r], prefix_of[r], at = at, n, g.length, at + own
        packed_width = max(packed_width, at)
    src_row, src_col, size, packed_row, packed_col, segment = (
        torch.tensor(x, device=device) for x in zip(*segments, strict=True)
    )
    owner = torch.repeat_interleave(torch.arange(len(segments), device=device), size)  # [tokens]
    within = torch.arange(owner.numel(), device=device) - (torch.cumsum(size, 0) - size)[owner]
    at = (packed_row[owner], packed_col[owner] + within)
    columns = src_col[owner] + within  # a token's column in its row is its position (right padding)
    ids = input_ids.new_zeros((len(groups), packed_width)).index_put(at, input_ids[src_row[owner], columns])
    positions = torch.zeros_like(ids).index_put(at, columns)
    seg = torch.full_like(ids, -1).index_put(at, segment[owner])  # -1: padding
    # a token sees the prefix and its own segment, causally; padding sees itself only (no empty softmax row)
    step = torch.arange(packed_width, device=device)
    allowed = (step[:, None] >= step[None, :]) & (
        (seg[:, None, :] == 0) | (seg[:, None, :] == seg[:, :, None])
    ) & (seg[:, None, :] >= 0) | torch.eye(packed_width, dtype=torch.bool, device=device)
    dtype = model.get_input_embeddings().weight.dtype
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )
    out = model.get_decoder()(
        input_ids=ids, attention_mask=mask[:, None], position_ids=positions
    ).last_hidden_state  # [groups, packed width, H]
    # position t of a row: its prefix's state for t < the prefix's length, else its own token's
    prefix = torch.tensor(prefix_of, device=device)[:, None]
    t = torch.arange(width, device=device)[None, :]
    own = torch.tensor(start_of, device=device)[:, None] + t - prefix
    column = torch.where(t < prefix, t, own).clamp(0, packed_width - 1)  # padding reads some state
    return out[torch.tensor(row_of, device=device)[:, None], column]


def shared_prefix_hidden(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, groups: list[PrefixGroup]
) -> torch.Tensor:
    """[b, T, H] hidden states with each group's prefix run once (prefixes of one length batched) and every
    row's rest batched.

    Layout of the second pass, per row: [pad | its group's prefix keys/values | its own tokens | pad],
    the prefix right-aligned as in the sampler; positions continue from the prefix length. The rows are
    assembled by indexing (no per-row copies): a small model's forward is cheaper than a Python loop over rows.
    """
    decoder = model.get_decoder()
    b, width = input_ids.shape
    device = input_ids.device
    lengths = [g.length for g in groups]
    width_p = max(lengths)
    group_of = torch.zeros(b, dtype=torch.long, device=device)
    for n, g in enumerate(groups):
        group_of[g.rows] = n
    length = torch.tensor(lengths, device=device)[group_of]  # [b] each row's prefix length
    # each group's prefix: hidden states [G, width_p, H] (right-padded) and, per layer, keys and values
    # [G, heads, width_p, d] (left-padded: the prefix ends where the row's own tokens begin)
    hidden_p: list[torch.Tensor | None] = [None] * len(groups)
    kv_p: list[list[tuple[torch.Tensor, torch.Tensor]] | None] = [None] * len(groups)
    by_length: dict[int, list[int]] = {}
    for n, g in enumerate(groups):
        if g.length:
            by_length.setdefault(g.length, []).append(n)
    for size, ns in by_length.items():
        firsts = torch.tensor([groups[n].rows[0] for n in ns], device=device)
        out = decoder(input_ids=input_ids[firsts, :size], use_cache=True)
        layers = cache_layers(out.past_key_values, "shared-prefix update")
        for i, n in enumerate(ns):
            hidden_p[n] = F.pad(out.last_hidden_state[i], (0, 0, 0, width_p - size))
            kv_p[n] = [
                (F.pad(k[i], (0, 0, width_p - size, 0)), F.pad(v[i], (0, 0, width_p - size, 0)))
                for k, v in layers
            ]
    some_hidden = next(h for h in hidden_p if h is not None)
    some_kv = next(kv for kv in kv_p if kv is not None)
    # a group without a shared prefix (a row alone) holds zeros that its mask never reads
    hidden_g = torch.stack([torch.zeros_like(some_hidden) if h is None else h for h in hidden_p])
    kv_g = [
        [(torch.zeros_like(k), torch.zeros_like(v)) for k, v in some_kv] if c is None else c for c in kv_p
    ]
    kv = [
        (
            torch.stack([c[layer][0] for c in kv_g]).index_select(0, group_of),
            torch.stack([c[layer][1] for c in kv_g]).index_select(0, group_of),
        )
        for layer in range(len(some_kv))
    ]
    # each row's own tokens, from its prefix's end, right-padded to the longest rest
    width_s = int((width - length).max())
    step = torch.arange(width_s, device=device)
    positions = length[:, None] + step  # [b, width_s]
    inside = positions < width
    source = positions.clamp(max=width - 1)
    ids = torch.where(inside, input_ids.gather(1, source), torch.zeros_like(source))
    mask_s = torch.where(inside, attention_mask.gather(1, source), torch.zeros_like(source))
    mask_p = (torch.arange(width_p, device=device) >= width_p - length[:, None]).to(attention_mask.dtype)
    out = decoder(
        input_ids=ids,
        attention_mask=torch.cat([mask_p, mask_s], dim=-1),
        position_ids=positions,
        past_key_values=as_cache(kv),
        use_cache=True,
    ).last_hidden_state  # [b, width_s, H]
    # position t of a row: its prefix's state for t < its prefix length, else its own state t − length
    t = torch.arange(width, device=device)[None, :].expand(b, -1)
    own_index = (t - length[:, None]).clamp(0, width_s - 1)
    own = out.gather(1, own_index[..., None].expand(-1, -1, out.shape[-1]))
    index_p = t.clamp(max=width_p - 1)[..., None].expand(-1, -1, out.shape[-1])
    prefix = hidden_g.index_select(0, group_of).gather(1, index_p)
    return torch.where((t < length[:, None])[..., None], prefix, own)
