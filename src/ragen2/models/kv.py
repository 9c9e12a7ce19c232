"""Key/value cache plumbing shared by the sampler and the cross-scorer.

A causal model's keys/values at a position depend only on the tokens up to it, so the cache of a
sequence, cut to length l, is the cache of its first l tokens: a prefix computed once can serve every
continuation of it (the next turn of an episode, every rollout of a group, every reasoning scored
against a prompt).

Decoding helpers: ``GrowingLayer`` appends a step's keys/values into spare capacity instead of
re-concatenating the whole cache every step (``DynamicLayer``'s ``torch.cat`` copies O(length) per layer
per token), and ``grouped_query_attention`` lets a grouped-query model (SmolLM2: 9 query heads over 3
key/value heads) attend without materialising every key/value head ``n_rep`` times: transformers' SDPA
path calls ``repeat_kv`` whenever a mask is given, a full copy of the cache per layer per token.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import Tensor
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

KV = list[tuple[Tensor, Tensor]]
"""Per layer (keys, values), each [batch, kv_heads, seq, head_dim]."""


def as_cache(kv: KV | None, batch: int | None = None) -> DynamicCache | None:
    """A DynamicCache over ``kv`` (expanded along the batch when ``batch`` is given)."""
    if kv is None:
        return None
    if batch is not None:
        kv = [(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in kv]
    return DynamicCache(ddp_cache_data=kv)


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer with spare capacity: a step writes its keys/values in place.

    ``keys``/``values`` are views of the first ``length`` positions of the buffers, so everything that
    reads a ``DynamicLayer`` (sequence length, masks, ``cache_layers``) reads this one unchanged. The
    buffers grow by doubling when a write does not fit.
    """

    def __init__(self, reserve: int = 64) -> None:
        super().__init__()
        self.reserve = reserve  # spare positions allocated beyond the first write
        self._k: Tensor | None = None  # [b, kv_heads, capacity, head_dim]
        self._v: Tensor | None = None

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = 0 if self._k is None else self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if self._k is None or end > self._k.shape[-2]:
            capacity = max(end + self.reserve, 0 if self._k is None else 2 * self._k.shape[-2])
            shape = (*key_states.shape[:2], capacity, key_states.shape[-1])
            k, v = key_states.new_empty(shape), value_states.new_empty(shape[:3] + value_states.shape[-1:])
            if self._k is not None:
                k[:, :, :start], v[:, :, :start] = self.keys, self.values
            self._k, self._v = k, v
        assert self._v is not None
        self._k[:, :, start:end] = key_states
        self._v[:, :, start:end] = value_states
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values


def growing_cache(kv: KV | None, reserve: int) -> DynamicCache:
    """A cache of ``GrowingLayer``s holding ``kv`` (empty when None) with room for ``reserve`` more tokens."""
    cache = DynamicCache()
    if kv is None:
        cache.layer_class_to_replicate = partial(GrowingLayer, reserve)  # layers made on first update
        return cache
    cache.layers = []
    for k, v in kv:
        layer = GrowingLayer(reserve)
        layer.update(k, v)
        cache.layers.append(layer)
    return cache


GROUPED_SDPA = "ragen2_grouped_sdpa"


def grouped_sdpa(
    module: Any,
    query: Tensor,  # [b, heads, q, d]
    key: Tensor,  # [b, kv_heads, L, d]
    value: Tensor,  # [b, kv_heads, L, d]
    attention_mask: Tensor | None,  # [b, 1, q, L] (bool or additive) or None
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """SDPA for grouped-query attention without ``repeat_kv``: each key/value head serves its query
    heads as extra query rows ([b, kv_heads, n_rep·q, d]), the same dot products and softmaxes.

    Used for single-token decode steps; anything else goes to transformers' own SDPA path.
    """
    b, heads, q, d = query.shape
    kv_heads = key.shape[1]
    rep = heads // kv_heads
    if rep == 1 or q != 1 or dropout > 0 or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    grouped = query.reshape(b, kv_heads, rep, d)  # head h reads key/value head h // rep
    out = torch.nn.functional.scaled_dot_product_attention(
        grouped,
        key,
        value,
        attn_mask=None if attention_mask is None else attention_mask.expand(b, 1, rep, -1),
        scale=scaling,
    )  # [b, kv_heads, rep, d]
    return out.reshape(b, heads, 1, d).transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_SDPA, sdpa_mask)


@contextmanager
def grouped_query_attention(model: Any) -> Iterator[None]:
    """Within the block, a model on transformers' SDPA attention decodes through ``grouped_sdpa``."""
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None)
    if before != "sdpa":
        yield
        return
    config._attn_implementation = GROUPED_SDPA
    try:
        yield
    finally:
        config._attn_implementation = before


def cache_layers(cache: DynamicCache, who: str) -> KV:
    """The (keys, values) of a full-attention model's cache; other cache kinds raise."""
    layers = cache.layers
    if any(type(layer) not in (DynamicLayer, GrowingLayer) for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers})
        raise ValueError(
            f"{who} needs a full-attention model (DynamicLayer caches), got {kinds}; "
            "sliding-window and hybrid models are not supported by the cached path"
        )
    return [(layer.keys, layer.values) for layer in layers]


def cache_len(kv: KV | None) -> int:
    return 0 if kv is None else kv[0][0].shape[-2]


def truncate(kv: KV | None, length: int) -> KV | None:
    if kv is None or length == 0:
        return None
    return [(k[:, :, :length], v[:, :, :length]) for k, v in kv]


def extend(model: Any, kv: KV | None, ids: Sequence[int], who: str) -> KV | None:
    """The cache of ``kv``'s tokens followed by ``ids`` (batch 1); only keys/values are computed."""
    if not ids:
        return kv
    start = cache_len(kv)
    out = model(
        input_ids=torch.tensor([list(ids)], device=model.device),
        position_ids=torch.arange(start, start + len(ids), device=model.device)[None],
        past_key_values=as_cache(kv, 1),
        use_cache=True,
        logits_to_keep=1,
    )
    return cache_layers(out.past_key_values, who)
