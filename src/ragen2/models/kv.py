"""Key/value cache plumbing shared by the sampler and the cross-scorer.

A causal model's keys/values at a position depend only on the tokens up to it, so the cache of a
sequence, cut to length l, is the cache of its first l tokens: a prefix computed once can serve every
continuation of it (the next turn of an episode, every rollout of a group, every reasoning scored
against a prompt).

Decoding helpers: ``PreallocatedLayer`` writes a step's keys/values into buffers allocated once for the
whole call instead of re-concatenating the whole cache every step (``DynamicLayer``'s ``torch.cat`` copies
O(length) per layer per token), and can write at a device-held position for a step replayed as a CUDA
graph; and ``grouped_query_attention`` lets a grouped-query model (SmolLM2: 9 query heads over 3
key/value heads) attend without materialising every key/value head ``n_rep`` times: transformers' SDPA
path calls ``repeat_kv`` whenever a mask is given, a full copy of the cache per layer per token.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

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


class PreallocatedLayer(DynamicLayer):
    """A full-attention cache layer whose keys/values live in buffers allocated once, with room for a whole
    generate call ([b, kv_heads, capacity, head_dim], zero-filled).

    Written eagerly, a write lands after the last one and ``keys``/``values`` are views of the written
    positions, so everything that reads a ``DynamicLayer`` (sequence length, masks, ``cache_layers``) reads
    this one unchanged. With ``at`` set (a one-element device tensor) a write lands at that position and
    attention sees the whole buffer under the caller's mask: the same shapes and addresses every step, which
    is what a CUDA graph replays. Unwritten positions hold zeros, so a masked one never turns a sum into NaN.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.at: Tensor | None = None  # [1] long: the position a captured step writes
        self.buffers: tuple[Tensor, Tensor] | None = None

    def allocate(self, like_keys: Tensor, like_values: Tensor, batch: int) -> None:
        self.lazy_initialization(like_keys, like_values)
        heads, dk, dv = like_keys.shape[1], like_keys.shape[-1], like_values.shape[-1]
        # under autocast, rotary embeddings leave the keys in fp32 while the values come out of a bf16
        # projection, and attention reads both in the autocast dtype: hold both in it (what attention sees)
        device = like_keys.device.type
        cast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        k = like_keys.new_zeros((batch, heads, self.capacity, dk), dtype=cast or like_keys.dtype)
        v = like_values.new_zeros((batch, heads, self.capacity, dv), dtype=cast or like_values.dtype)
        self.buffers = (k, v)
        self.keys, self.values = k[:, :, :0], v[:, :, :0]

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        if self.buffers is None:
            self.allocate(key_states, value_states, key_states.shape[0])
        assert self.buffers is not None
        k, v = self.buffers
        if self.at is not None:
            k.index_copy_(2, self.at, key_states.to(k.dtype))
            v.index_copy_(2, self.at, value_states.to(v.dtype))
            return k, v
        start = self.get_seq_length()
        end = start + key_states.shape[-2]
        if end > self.capacity:
            raise ValueError(
                f"a write up to position {end} overflows the cache's capacity of {self.capacity}"
            )
        k[:, :, start:end] = key_states
        v[:, :, start:end] = value_states
        self.keys, self.values = k[:, :, :end], v[:, :, :end]
        return self.keys, self.values

    def written(self, length: int) -> None:
        """Positions ``[0, length)`` hold keys/values (after rows were copied in, or after captured steps)."""
        assert self.buffers is not None
        self.keys, self.values = self.buffers[0][:, :, :length], self.buffers[1][:, :, :length]


def preallocated_cache(rows: Sequence[KV | None], width: int, capacity: int, layers: int) -> DynamicCache:
    """A cache of ``layers`` ``PreallocatedLayer``s for ``len(rows)`` rows with room for ``capacity`` positions.

    Row i's prefix (per layer [1, kv_heads, n_i, head_dim], or None) is copied right-aligned into positions
    ``[width - n_i, width)``, one copy per distinct prefix and layer (a group's rows share theirs); the rest
    of ``[0, width)`` stays zero (padding the caller masks). Without any prefix a layer allocates on its
    first update.
    """
    cache = DynamicCache()
    sharing: dict[int, tuple[KV, list[int]]] = {}  # id(prefix) -> (prefix, its rows)
    for i, kv in enumerate(rows):
        if kv is not None:
            sharing.setdefault(id(kv), (kv, []))[1].append(i)
    if not sharing:
        cache.layers = []
        cache.layers.extend(PreallocatedLayer(capacity) for _ in range(layers))
        return cache
    template = next(iter(sharing.values()))[0]
    device = template[0][0].device
    groups = [(kv, torch.tensor(idx, device=device)) for kv, idx in sharing.values()]
    cache.layers = []
    for layer_idx, (k0, v0) in enumerate(template):
        layer = PreallocatedLayer(capacity)
        layer.allocate(k0, v0, len(rows))
        k, v = layer.buffers  # type: ignore[misc]
        for kv, idx in groups:
            pk, pv = kv[layer_idx]
            n = pk.shape[-2]
            k[idx, :, width - n : width] = pk.to(k.dtype).expand(len(idx), -1, -1, -1)
            v[idx, :, width - n : width] = pv.to(v.dtype).expand(len(idx), -1, -1, -1)
        layer.written(width)
        cache.layers.append(layer)
    return cache


@contextmanager
def write_at(cache: DynamicCache, at: Tensor) -> Iterator[None]:
    """Within the block, every ``PreallocatedLayer`` of ``cache`` writes at the device position ``at``."""
    layers = [layer for layer in cache.layers if isinstance(layer, PreallocatedLayer)]
    for layer in layers:
        layer.at = at
    try:
        yield
    finally:
        for layer in layers:
            layer.at = None


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
    if config is None or before != "sdpa":
        yield
        return
    config._attn_implementation = GROUPED_SDPA
    try:
        yield
    finally:
        config._attn_implementation = before


def cache_layers(cache: DynamicCache, who: str) -> KV:
    """The (keys, values) of a full-attention model's cache; other cache kinds raise."""
    layers = [layer for layer in cache.layers if type(layer) in (DynamicLayer, PreallocatedLayer)]
    if len(layers) != len(cache.layers):
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        raise ValueError(
            f"{who} needs a full-attention model (DynamicLayer caches), got {kinds}; "
            "sliding-window and hybrid models are not supported by the cached path"
        )
    return [
        (cast(Tensor, layer.keys), cast(Tensor, layer.values)) for layer in cast(list[DynamicLayer], layers)
    ]


def cache_len(kv: KV | None) -> int:
    return 0 if kv is None else kv[0][0].shape[-2]


def truncate(kv: KV | None, length: int) -> KV | None:
    if kv is None or length == 0:
        return None
    return [(k[:, :, :length], v[:, :, :length]) for k, v in kv]


def extend_rows(model: Any, kv: KV | None, rows: Sequence[Sequence[int]], who: str) -> list[KV]:
    """The cache of ``kv``'s tokens followed by each of ``rows`` (each ≥ 1 token, all as long), from one forward
    of the rows as a batch over ``kv`` (batch 1) expanded; each row's cache is batch 1."""
    start, width = cache_len(kv), len(rows[0])
    out = model(
        input_ids=torch.tensor([list(r) for r in rows], device=model.device),
        position_ids=torch.arange(start, start + width, device=model.device)[None].expand(len(rows), -1),
        past_key_values=as_cache(kv, len(rows)),
        use_cache=True,
        logits_to_keep=1,
    )
    layers = cache_layers(out.past_key_values, who)
    return [[(k[i : i + 1], v[i : i + 1]) for k, v in layers] for i in range(len(rows))]


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
