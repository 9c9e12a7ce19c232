"""HF transformers backend: batched sampling across all active episodes on CPU or one GPU.

The loop is our own (not ``model.generate``) so that it returns the exact sampled ids with their
log-probs, stops each row at a stop string or EOS, and draws from a seeded ``torch.Generator`` (a
resumed run samples exactly what an uninterrupted one would).

Prefix reuse (the "KV cache kept across turns"): after each call the sampler keeps every row's
keys/values (prompt + sampled ids but the last). A later prompt that extends a kept sequence, as the
next turn of an episode does by construction, starts from that cache and runs only its new tokens;
identical prompts in one call (the K rollouts of a group) are encoded once and shared. Kept caches
are dropped whenever the weights change (``sync_weights``, or any in-place parameter update).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ragen2.models.kv import KV, cache_layers, cache_len, extend, grouped_query_attention, growing_cache
from ragen2.models.weights import weights_version
from ragen2.progress import bar
from ragen2.rollout.base import PromptMeta, Sample, SamplingParams


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside top-k / the top-p nucleus (always keeping the most likely token)."""
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        drop_sorted = probs.cumsum(-1) - probs > top_p  # mass before this token already ≥ p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@dataclass
class _Prefix:
    ids: tuple[int, ...]  # the tokens whose keys/values are held
    kv: KV  # per layer [1, kv_heads, len(ids), head_dim]


def _longest_source(prompt: Sequence[int], sources: Sequence[_Prefix]) -> _Prefix | None:
    """The longest held sequence that is a proper prefix of ``prompt`` (≥ 1 new token must remain)."""
    best = None
    for s in sources:
        n = len(s.ids)
        if n < len(prompt) and (best is None or n > len(best.ids)) and tuple(prompt[:n]) == s.ids:
            best = s
    return best


class HFSampler:
    needs_oracle = False
    records_entropy = True

    def __init__(
        self,
        tokenizer: Any,
        model: Any = None,
        *,
        max_batch_size: int = 64,
        stop_window: int = 8,
        reuse_prefix: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.model = model
        self.max_batch_size = max_batch_size
        self.stop_window = stop_window  # tokens decoded to look for a stop string
        self.reuse_prefix = reuse_prefix
        self.eos_ids = {i for i in (tokenizer.eos_token_id,) if i is not None}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._held: list[_Prefix] = []
        self._held_version: tuple[int, int] | None = None
        self.tokens_prefilled = 0  # token positions run through the model outside decoding (for benchmarks)

    def sync_weights(self, model: Any) -> None:
        self.model = model  # same process, same tensors: nothing to copy
        self._held = []

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int,
        meta: Sequence[PromptMeta] | None = None,
    ) -> list[Sample]:
        if self.model is None:
            raise RuntimeError("HFSampler has no model: call sync_weights(model) before generate()")
        if not prompts:
            return []
        if self._held_version != weights_version(self.model):
            self._held = []  # weights changed in place: held keys/values are stale
        # drawn where the logits are: a CPU draw from a GPU's [b, vocab] probabilities cost ~95 % of a
        # decode step (0.5B, b = 32, vocab 151,936 on an H100); seeded draws reproduce per device kind
        device = next(self.model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        try:
            out: list[Sample] = []
            held: list[_Prefix] = []
            for start in range(0, len(prompts), self.max_batch_size):
                samples, kept = self._generate_batch(
                    prompts[start : start + self.max_batch_size], params, generator
                )
                out += samples
                held += kept
            self._held = held if self.reuse_prefix else []
            self._held_version = weights_version(self.model)
            return out
        finally:
            self.model.train(was_training)

    def _extend(self, source: _Prefix | None, ids: Sequence[int]) -> _Prefix:
        """Batch-1 prefill of ``ids`` on top of ``source``."""
        start = 0 if source is None else len(source.ids)
        kv = extend(self.model, None if source is None else source.kv, ids[start:], "HFSampler prefix reuse")
        self.tokens_prefilled += len(ids) - start
        return _Prefix(tuple(ids), kv)

    def _sources(self, prompts: Sequence[Sequence[int]]) -> list[_Prefix | None]:
        """Each prompt's cached prefix: a held sequence it extends, or a shared prefill of a repeated prompt."""
        if not self.reuse_prefix:
            return [None] * len(prompts)
        counts: dict[tuple[int, ...], int] = {}
        for p in prompts:
            counts[tuple(p)] = counts.get(tuple(p), 0) + 1
        shared: dict[tuple[int, ...], _Prefix] = {}
        for p, n in counts.items():
            source = _longest_source(p, self._held)
            if n > 1 and len(p) - 1 > (0 if source is None else len(source.ids)):
                shared[p] = self._extend(source, p[:-1])  # once for the whole group
        return [shared.get(tuple(p)) or _longest_source(p, self._held) for p in prompts]

    def _generate_batch(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, generator: torch.Generator
    ) -> tuple[list[Sample], list[_Prefix]]:
        device = next(self.model.parameters()).device
        b = len(prompts)
        sources = self._sources(prompts)
        cached = [0 if s is None else len(s.ids) for s in sources]
        new = [len(p) - c for p, c in zip(prompts, cached)]
        width_c, width_n = max(cached), max(new)
        # layout per row: [pad | cached prefix | pad | new tokens]: every segment right-aligned
        input_ids = torch.full((b, width_n), self.pad_id, dtype=torch.long)
        positions = torch.zeros((b, width_n), dtype=torch.long)
        mask_c = torch.zeros((b, width_c), dtype=torch.long)
        mask_n = torch.zeros((b, width_n), dtype=torch.long)
        for i, (p, c, n) in enumerate(zip(prompts, cached, new)):
            input_ids[i, width_n - n :] = torch.tensor(p[c:], dtype=torch.long)
            positions[i, width_n - n :] = torch.arange(c, c + n)
            mask_n[i, width_n - n :] = 1
            mask_c[i, width_c - c :] = 1
        kv = None
        if width_c > 0:
            template = next(s for s in sources if s is not None).kv
            kv = []
            for layer, (k0, v0) in enumerate(template):
                keys = k0.new_zeros((b, k0.shape[1], width_c, k0.shape[3]))
                values = v0.new_zeros((b, v0.shape[1], width_c, v0.shape[3]))
                for i, s in enumerate(sources):
                    if s is not None:
                        keys[i, :, width_c - cached[i] :] = s.kv[layer][0][0]
                        values[i, :, width_c - cached[i] :] = s.kv[layer][1][0]
                kv.append((keys, values))
        attention = torch.cat([mask_c, mask_n], dim=-1).to(device)
        # room for every new token: a decode step writes its keys/values in place (no per-step torch.cat)
        cache = growing_cache(kv, reserve=width_n + params.max_new_tokens)
        self.tokens_prefilled += sum(new)

        ids: list[list[int]] = [[] for _ in range(b)]
        logps: list[list[float]] = [[] for _ in range(b)]
        entropies: list[list[float]] = [[] for _ in range(b)]
        finish: list[str | None] = [None] * b
        # every token holds at least one byte of the text, so a stop string of B bytes spans ≤ B tokens
        window = max([self.stop_window, *(len(s.encode()) for s in params.stop)])
        step_input, step_pos = input_ids.to(device), positions.to(device)
        with bar(params.max_new_tokens, "sampling", "token") as progress, grouped_query_attention(self.model):
            for _ in range(params.max_new_tokens):
                progress.update()
                progress.set_postfix_str(f"{sum(f is None for f in finish)}/{b} rows active")
                out = self.model(
                    input_ids=step_input,
                    attention_mask=attention,
                    position_ids=step_pos,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
                cache = out.past_key_values
                logits = out.logits[:, -1, :].float()
                scaled = logits / params.temperature if params.temperature > 0 else logits
                logp_all = torch.log_softmax(scaled, dim=-1)
                if params.temperature > 0:
                    probs = _filter_logits(scaled, params.top_k, params.top_p).softmax(-1)
                    token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
                else:
                    token = logits.argmax(-1)
                token_logp = logp_all.gather(-1, token[:, None]).squeeze(-1)
                # entropy of the temperature-scaled distribution (before top-k/p); 0·log 0 counts as 0
                probs_all = logp_all.exp()
                entropy = -torch.where(probs_all > 0, probs_all * logp_all, 0.0).sum(-1)
                # one device-to-host copy each per step, not one per row
                step_tokens, step_logps, step_entropies = (
                    token.tolist(),
                    token_logp.tolist(),
                    entropy.tolist(),
                )
                for i in range(b):
                    if finish[i] is not None:
                        continue
                    t = step_tokens[i]
                    ids[i].append(t)
                    logps[i].append(step_logps[i])
                    entropies[i].append(step_entropies[i])
                    if t in self.eos_ids:
                        finish[i] = "eos"
                    elif params.stop:
                        tail = self.tokenizer.decode(ids[i][-window:])
                        if any(s in tail for s in params.stop):
                            finish[i] = "stop"
                if all(f is not None for f in finish):
                    break
                # finished rows feed pad tokens that nothing attends to (mask 0), keeping their cache clean
                active = torch.tensor([f is None for f in finish], dtype=torch.long, device=device)
                step_input = torch.tensor(
                    [[ids[i][-1] if finish[i] is None else self.pad_id] for i in range(b)], device=device
                )
                attention = torch.cat([attention, active[:, None]], dim=-1)
                step_pos = step_pos[:, -1:] + 1
        samples = [
            Sample(ids=ids[i], finish_reason=finish[i] or "length", logprobs=logps[i], entropies=entropies[i])
            for i in range(b)
        ]
        return samples, self._hold(prompts, ids, cache, attention)

    def _hold(
        self, prompts: Sequence[Sequence[int]], ids: list[list[int]], cache: Any, attention: torch.Tensor
    ) -> list[_Prefix]:
        """Each row's keys/values at its attended positions: prompt + sampled ids but the last."""
        if not self.reuse_prefix or cache is None:
            return []
        layers = cache_layers(cache, "HFSampler prefix reuse")
        # after a max_new_tokens exit the mask holds one column more than the cache: cut it to the cache
        held = []
        for i, p in enumerate(prompts):
            seq = (*p, *ids[i][:-1])
            where = torch.nonzero(attention[i, : cache_len(layers)], as_tuple=False).squeeze(-1)
            if where.numel() != len(seq):
                continue  # a row whose cache does not line up exactly is simply not reused
            held.append(_Prefix(seq, [(k[i : i + 1, :, where], v[i : i + 1, :, where]) for k, v in layers]))
        return held
