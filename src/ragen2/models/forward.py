"""The two halves of an HF causal LM that the update and the critic use separately: trunk and LM head.

The update runs the decoder once per micro-batch and the LM head only on the positions that predict
sampled tokens (``ragen2.algos.logprobs.sampled_logprobs``); a value head on the shared trunk reads the
same hidden states.

``decoder_hidden(..., share_prefix=True)`` runs a prefix that several rows share (a group's rollouts
all start with the same prompt) once, with gradients, and the rows' remainders on top of its keys and
values: the same function of the weights, the backward summing the shared prefix's gradient over its
rows. On single-turn tasks the prompt is most of each row (Bandit: 236 of ~280 tokens), so the update
runs about a third of the tokens. The numbers equal the plain pass up to float rounding (different
matmul shapes sum in a different order), which is why it is a switch and not the default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from ragen2.models.kv import as_cache, cache_layers


def decoder_hidden(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, share_prefix: bool = False
) -> torch.Tensor:
    """[b, T] ids -> [b, T, H] last hidden states of the causal LM's decoder (no LM head).

    ``share_prefix``: compute prefixes shared by ≥ 2 right-padded rows once (``shared_prefix_hidden``).
    """
    checkpointed = getattr(model, "is_gradient_checkpointing", False) and model.training
    if share_prefix and not checkpointed:  # checkpointed layers return no keys/values to build on
        groups = prefix_groups(input_ids, attention_mask)
        if any(len(g.rows) > 1 for g in groups):
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
    """Rows grouped by a common leading run of ≥ ``min_shared`` real tokens (rows are right-padded)."""
    lengths = attention_mask.sum(-1).tolist()
    if any(attention_mask[i, : int(n)].min() < 1 for i, n in enumerate(lengths) if n):
        raise ValueError("decoder_hidden(share_prefix=True) needs right-padded rows (mask 1…1 0…0)")
    left = list(range(input_ids.shape[0]))
    groups = []
    while left:
        i = left.pop(0)
        head = input_ids[i, :min_shared]
        rows = [i] + [
            j for j in left if lengths[j] > min_shared and torch.equal(input_ids[j, :min_shared], head)
        ]
        if lengths[i] <= min_shared or len(rows) == 1:
            groups.append(PrefixGroup([i], 0))
            continue
        left = [j for j in left if j not in rows]
        width = min(int(lengths[r]) for r in rows) - 1  # every row keeps one token after the prefix
        same = (input_ids[rows, :width] == input_ids[i, :width]).all(0).long()
        groups.append(PrefixGroup(rows, int(same.cumprod(0).sum())))
    return groups


def shared_prefix_hidden(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, groups: list[PrefixGroup]
) -> torch.Tensor:
    """[b, T, H] hidden states with each group's prefix run once (batch 1) and every row's rest batched.

    Layout of the second pass, per row: [pad | its group's prefix keys/values | its own tokens | pad],
    the prefix right-aligned as in the sampler; positions continue from the prefix length.
    """
    decoder = model.get_decoder()
    b, width = input_ids.shape
    prefix_of = {r: g for g in groups for r in g.rows}
    width_p = max(g.length for g in groups)
    prefixes: dict[int, tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]] = {}
    for n, g in enumerate(groups):
        if g.length:
            out = decoder(input_ids=input_ids[g.rows[0] : g.rows[0] + 1, : g.length], use_cache=True)
            prefixes[n] = (
                out.last_hidden_state[0],
                cache_layers(out.past_key_values, "shared-prefix update"),
            )
    index = {r: n for n, g in enumerate(groups) for r in g.rows}
    rest = [width - prefix_of[r].length for r in range(b)]
    width_s = max(rest)
    ids = torch.stack([F.pad(input_ids[r, prefix_of[r].length :], (0, width_s - rest[r])) for r in range(b)])
    mask_s = torch.stack(
        [F.pad(attention_mask[r, prefix_of[r].length :], (0, width_s - rest[r])) for r in range(b)]
    )
    positions = torch.stack(
        [
            torch.arange(prefix_of[r].length, prefix_of[r].length + width_s, device=ids.device)
            for r in range(b)
        ]
    )
    mask_p = torch.zeros((b, width_p), dtype=attention_mask.dtype, device=ids.device)
    kv = []
    template = next(iter(prefixes.values()))[1]
    for layer, (k0, v0) in enumerate(template):
        keys, values = [], []
        for r in range(b):
            n, length = index[r], prefix_of[r].length
            if length:
                k, v = prefixes[n][1][layer]
            else:
                k, v = k0[:, :, :0], v0[:, :, :0]
            keys.append(F.pad(k, (0, 0, width_p - length, 0)))  # left-pad to the widest prefix
            values.append(F.pad(v, (0, 0, width_p - length, 0)))
        kv.append((torch.cat(keys), torch.cat(values)))
    for r in range(b):
        mask_p[r, width_p - prefix_of[r].length :] = 1
    out = decoder(
        input_ids=ids,
        attention_mask=torch.cat([mask_p, mask_s], dim=-1),
        position_ids=positions,
        past_key_values=as_cache(kv),
        use_cache=True,
    ).last_hidden_state  # [b, width_s, H]
    rows = []
    for r in range(b):
        length = prefix_of[r].length
        own = out[r, : width - length]
        rows.append(torch.cat([prefixes[index[r]][0], own]) if length else own)
    return torch.stack(rows)
