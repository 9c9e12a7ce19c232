"""HF transformers backend: batched sampling across all active episodes on CPU or one GPU.

The loop is our own (not ``model.generate``) so that it returns the exact sampled ids with their
log-probs, stops each row at a stop string or EOS, and draws from a seeded ``torch.Generator`` (a
resumed run samples exactly what an uninterrupted one would).

Prefix reuse (the "KV cache kept across turns"): after each call the sampler keeps every row's
keys/values (prompt + sampled ids but the last). A later prompt that extends a kept sequence, as the
next turn of an episode does by construction, starts from that cache and runs only its new tokens;
identical prompts in one call (the K rollouts of a group) are encoded once and shared. Kept caches
are dropped whenever the weights change (``sync_weights``, or any in-place parameter update).

A decode step stays on the device: the token is drawn there (``torch.multinomial``'s own exponential race,
without its host-side validity check), written into preallocated id/log-prob/entropy buffers, and fed
back without a round trip. The host reads the new ids every ``check_every`` steps and applies the stop
rule to them token by token: a row stops at its first EOS, or at the first token whose decoded tail
(the last ``stop_window`` ids, widened to the longest stop string's bytes) contains a stop string. Only
tokens that could end a stop string (a per-vocabulary table) are decoded. Rows that stopped between two
checks decode on until the check (their extra ids are dropped; rows never interact), and the generator
is wound back to the step where the last row stopped, so every result is what a check after every token
gives. The keys/values live in buffers allocated once per call (``PreallocatedLayer``). On a GPU the
decode step is recorded once per batch as a CUDA graph and replayed (``decode_step``): a recording costs
one step, where ``torch.compile(mode="reduce-overhead")`` would compile again for every call, each
having a cache of a new length (the prompt grows every turn). With ``compile`` the recorded step's forward
is first compiled with dynamic shapes (fused elementwise kernels; one compilation per process). Sampling
stays outside the graph (its generator advances on the host).
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ragen2.models.fused import FusedProjections
from ragen2.models.kv import (
    KV,
    PreallocatedLayer,
    cache_layers,
    extend_rows,
    grouped_query_attention,
    preallocated_cache,
    write_at,
)
from ragen2.models.weights import SamplingCopy, weights_version
from ragen2.progress import bar
from ragen2.rollout.base import FinishReason, PromptMeta, Sample, SamplingParams

DECODE_STEPS = ("auto", "eager", "static", "graph")


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


def _exponential(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Exp(1) draws shaped like ``like``: the very floats ``exponential_`` gives from the same generator state.

    On the CPU, torch's ``exponential_`` draws one uniform double at a time and maps it through −log1p(−u);
    the same uniforms drawn as one tensor and mapped in place are the same floats (tested against it), 2.8×
    faster: the draw was a fifth of a small model's rollout.
    """
    if like.device.type != "cpu":  # CUDA's exponential_ has its own stream: keep it
        return torch.empty_like(like).exponential_(1, generator=generator)
    u = torch.empty(like.shape, dtype=torch.float64).uniform_(generator=generator)
    return u.neg_().log1p_().neg_().to(like.dtype)


def _draw(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Next ids [b], their log-probs [b] and the entropies [b] of the temperature-scaled distribution."""
    logits = logits.float()
    # x / 1 is x exactly: skip a pass over [b, vocab] at the default temperature
    scaled = logits / params.temperature if params.temperature not in (0.0, 1.0) else logits
    logp_all = torch.log_softmax(scaled, dim=-1)
    if params.temperature > 0:
        filtered = params.top_k > 0 or params.top_p < 1.0
        probs = (_filter_logits(scaled, params.top_k, params.top_p) if filtered else scaled).softmax(-1)
        # torch.multinomial(probs, 1) draws exactly this (argmax of p / q, q ~ Exp(1)) after a validity
        # check that copies a flag to the host: a sync per token on a GPU
        race = _exponential(probs, generator)
        # max's index is argmax's (the first maximal one), in a third of its time on the CPU
        token = (probs / race).max(-1).indices
        probs_all = logp_all.exp() if filtered else probs
    else:
        token = logits.argmax(-1)
        probs_all = logp_all.exp()
    token_logp = logp_all.gather(-1, token[:, None]).squeeze(-1)
    # entropy of the temperature-scaled distribution (before top-k/p); 0·log 0 (NaN) counts as 0, and a p that
    # underflowed to 0 gives −0.0 where a mask gave 0.0: the same sum, a quarter of the mask's time
    entropy = -(probs_all * logp_all).nan_to_num_(0.0).sum(-1)
    return token, token_logp, entropy


# per tokenizer: (stop strings, vocabulary size) -> which ids could end a stop string; and the texts that
# table is read from, decoded once per tokenizer whatever the stop strings (the vocabulary decoded twice is
# most of a table's cost: seconds for Qwen's 151,936 ids)
_STOP_TABLES: weakref.WeakKeyDictionary[Any, dict[tuple[tuple[str, ...], int], torch.Tensor]] = (
    weakref.WeakKeyDictionary()
)
_TOKEN_TEXTS: weakref.WeakKeyDictionary[Any, tuple[str, list[str], list[str]]] = weakref.WeakKeyDictionary()


def _token_texts(tokenizer: Any) -> tuple[str, list[str], list[str]]:
    """(a plain letter's text, each id's text alone, each id's text after that letter) over the tokenizer's
    ids."""
    if tokenizer not in _TOKEN_TEXTS:
        anchor = list(tokenizer.encode("a", add_special_tokens=False))
        ids = range(len(tokenizer))
        alone = tokenizer.batch_decode([[v] for v in ids])
        after = tokenizer.batch_decode([[*anchor, v] for v in ids])
        _TOKEN_TEXTS[tokenizer] = tokenizer.decode(anchor), alone, after
    return _TOKEN_TEXTS[tokenizer]


def stop_candidates(tokenizer: Any, stop: Sequence[str], vocab: int) -> torch.Tensor:
    """[vocab] bool: the ids whose token could be the last one of a first occurrence of a stop string.

    The tail holding a stop string for the first time ends with the newest token, so the occurrence
    overlaps that token's text: the text contains the string or starts with a non-empty suffix of it.
    The text is taken alone and after a plain letter (decoders that drop a leading space alone keep it
    there); a text with U+FFFD (a byte sequence that another token completes), an empty text and an id
    the tokenizer does not know are always candidates. Built once per tokenizer and stop set (~1 s, the
    vocabulary's texts once per tokenizer).
    """
    per_tokenizer = _STOP_TABLES.setdefault(tokenizer, {})
    key = (tuple(stop), vocab)
    if key not in per_tokenizer:
        lead, alone, after = _token_texts(tokenizer)
        known = min(vocab, len(alone))
        pieces = {s[j:] for s in stop for j in range(len(s))}  # every non-empty suffix, the string itself too

        def could_end(text: str) -> bool:
            return (
                not text or "\ufffd" in text or any(s in text for s in stop) or text.startswith(tuple(pieces))
            )

        table = torch.ones(vocab, dtype=torch.bool)
        table[:known] = torch.tensor(
            [
                could_end(a) or not b.startswith(lead) or could_end(b[len(lead) :])
                for a, b in zip(alone[:known], after[:known], strict=True)
            ],
            dtype=torch.bool,
        )
        per_tokenizer[key] = table
    return per_tokenizer[key]


class _Stops:
    """The host's view of a batch: each row's ids, and where and why it stops."""

    def __init__(
        self, b: int, params: SamplingParams, eos_ids: set[int], tokenizer: Any, window: int, vocab: int
    ) -> None:
        self.ids: list[list[int]] = [[] for _ in range(b)]
        self.finish: list[FinishReason | None] = [None] * b
        self.last_stop = -1  # the step at which the latest row stopped so far
        self.stop, self.eos_ids, self.decode = params.stop, eos_ids, tokenizer.decode
        # every token holds at least one byte of the text, so a stop string of B bytes spans ≤ B tokens
        self.window = max([window, *(len(s.encode()) for s in params.stop)])
        flags = (
            stop_candidates(tokenizer, params.stop, vocab).clone()
            if params.stop
            else torch.zeros(vocab, dtype=torch.bool)
        )
        flags[[i for i in eos_ids if i < vocab]] = True
        self.flags = flags  # [vocab]: ids the rule must look at (EOS, or a possible end of a stop string)

    @property
    def active(self) -> int:
        return sum(f is None for f in self.finish)

    def scan(self, new: torch.Tensor, first_step: int) -> list[int]:
        """Apply the stop rule to ``new`` [b, k] (host), the ids of steps ``first_step ..``; the rows that
        stopped among them."""
        stopped = []
        tokens, flagged = new.tolist(), self.flags[new].tolist()
        for i, (row_new, row_flags) in enumerate(zip(tokens, flagged, strict=True)):
            if self.finish[i] is not None:
                continue
            row = self.ids[i]
            for step, (t, flag) in enumerate(zip(row_new, row_flags, strict=True), first_step):
                row.append(t)
                if not flag:
                    continue
                if t in self.eos_ids:
                    self.finish[i] = "eos"
                elif self.stop and any(s in self.decode(row[-self.window :]) for s in self.stop):
                    self.finish[i] = "stop"
                if self.finish[i] is not None:
                    self.last_stop = max(self.last_stop, step)
                    stopped.append(i)
                    break
        return stopped


@dataclass
class _Prefix:
    ids: tuple[int, ...]  # the tokens whose keys/values are held
    # per layer [1, kv_heads, len(ids), head_dim], or what cuts them out of the batch's cache once asked
    held: KV | Callable[[], KV]

    @property
    def kv(self) -> KV:
        if callable(self.held):
            self.held = self.held()
        return self.held


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
        check_every: int | None = None,
        decode_step: str = "auto",
        compile: bool = False,
        fuse_projections: bool = False,
        merge_adapters: bool = False,
    ) -> None:
        """``check_every``: steps between the host's stop checks (None: every step on the CPU, where a
        check waits for nothing, and every 8 on a GPU). ``decode_step``: ``graph`` records the decode step
        as a CUDA graph per batch (CUDA only), ``static`` runs that same fixed-shape step eagerly, ``eager``
        attends to the written positions only; ``auto`` is ``graph`` on CUDA and ``eager`` elsewhere.
        ``compile``: the fixed-shape step's forward through ``torch.compile`` (its norms, rotary embeddings and
        activations fused into a few kernels instead of dozens per layer), compiled once per process and model
        class for every batch size and cache length (dynamic shapes): the first call pays the compilation. The
        compiled step calls the model's ``forward``, so hooks on the model itself (not its layers) do not run.
        ``fuse_projections``: each decoder layer's q/k/v projections run as one matmul and gate/up as one
        (``ragen2.models.fused``; a copy of those weights, written again after each weight change).
        ``merge_adapters``: a policy with LoRA adapters is sampled from a plain copy with them merged
        (``SamplingCopy``: W + s·B A, in the autocast dtype when sampling under autocast), refreshed when the
        weights change: one more copy of the weights, and no adapter kernels in the decode step."""
        if check_every is not None and check_every < 1:
            raise ValueError(
                f"rollout.sampler.check_every={check_every} must be ≥ 1 (steps between stop checks). "
                "Fix: rollout.sampler.check_every=null (1 on the CPU, 8 on a GPU)"
            )
        if decode_step not in DECODE_STEPS:
            raise ValueError(
                f"rollout.sampler.decode_step={decode_step!r} is not one of {DECODE_STEPS}. "
                "Fix: rollout.sampler.decode_step=auto"
            )
        if compile and decode_step == "eager":
            raise ValueError(
                "rollout.sampler.compile=true compiles the fixed-shape decode step, which "
                "rollout.sampler.decode_step='eager' does not run. Fix: rollout.sampler.decode_step=static "
                "(graph on CUDA), or rollout.sampler.compile=false"
            )
        self.tokenizer = tokenizer
        self.model = model
        self.max_batch_size = max_batch_size
        self.stop_window = stop_window  # tokens decoded to look for a stop string
        self.reuse_prefix = reuse_prefix
        self.check_every = check_every
        self.decode_step = decode_step
        self.compile = compile
        self.fused = FusedProjections() if fuse_projections else None
        self.policy = model  # what sync_weights gave; ``model`` is what is sampled (a merged copy of it)
        self._merged = SamplingCopy(merge_adapters=True) if merge_adapters else None
        self.eos_ids = {i for i in (tokenizer.eos_token_id,) if i is not None}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._held: list[_Prefix] = []
        self._held_version: tuple[int, int] | None = None
        self._graph_failed = False  # a capture failed once: later batches decode eagerly
        # for benchmarks: token positions run outside decoding, and the decode steps (one new token per
        # row, after the prefill's) with their wall time
        self.tokens_prefilled = 0
        self.decode_steps = 0
        self.decode_seconds = 0.0

    def sync_weights(self, model: Any) -> None:
        self.policy = self.model = model  # same process, same tensors: nothing to copy (but a merged copy)
        self._held = []

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int,
        meta: Sequence[PromptMeta] | None = None,
    ) -> list[Sample]:
        if self.policy is None:
            raise RuntimeError("HFSampler has no model: call sync_weights(model) before generate()")
        if not prompts:
            return []
        device = next(self.policy.parameters()).device
        if self._merged is not None:
            autocast = torch.is_autocast_enabled(device.type)
            self.model = self._merged(
                self.policy, torch.get_autocast_dtype(device.type) if autocast else None
            )
        if self.decode_step == "graph" and device.type != "cuda":
            raise ValueError(
                f"rollout.sampler.decode_step='graph' records CUDA graphs, but the model is on {device}. "
                "Fix: rollout.sampler.decode_step=auto"
            )
        if self._held_version != weights_version(self.model):
            self._held = []  # weights changed in place: held keys/values are stale
        # drawn where the logits are: a CPU draw from a GPU's [b, vocab] probabilities cost ~95 % of a
        # decode step (0.5B, b = 32, vocab 151,936 on an H100); seeded draws reproduce per device kind
        generator = torch.Generator(device=device).manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        # fused: the layers' projections swapped for fused ones (their parameters out of the model) until the end
        fused = self.fused(self.model) if self.fused is not None else contextlib.nullcontext()
        out: list[Sample] = []
        held: list[_Prefix] = []
        try:
            with fused:
                for start in range(0, len(prompts), self.max_batch_size):
                    samples, kept = self._generate_batch(
                        prompts[start : start + self.max_batch_size], params, generator, device
                    )
                    out += samples
                    held += kept
        finally:
            self.model.train(was_training)
        self._held = held if self.reuse_prefix else []
        self._held_version = weights_version(self.model)
        return out

    def _extend_all(self, source: _Prefix | None, rows: Sequence[Sequence[int]]) -> list[_Prefix]:
        """The prefill of each of ``rows`` (as long as each other) on top of ``source``, in one forward."""
        start = 0 if source is None else len(source.ids)
        kvs = extend_rows(
            self.model,
            None if source is None else source.kv,
            [r[start:] for r in rows],
            "HFSampler prefix reuse",
        )
        self.tokens_prefilled += sum(len(r) - start for r in rows)
        return [_Prefix(tuple(r), kv) for r, kv in zip(rows, kvs, strict=True)]

    def _sources(self, prompts: Sequence[Sequence[int]]) -> list[_Prefix | None]:
        """Each prompt's cached prefix: a held sequence it extends, or a shared prefill of a repeated prompt."""
        if not self.reuse_prefix:
            return [None] * len(prompts)
        counts: dict[tuple[int, ...], int] = {}
        for p in prompts:
            counts[tuple(p)] = counts.get(tuple(p), 0) + 1
        # each repeated prompt (a group's) prefilled once, minus its last token; prompts that extend one source
        # by as many tokens are prefilled together, one batched forward
        batches: dict[tuple[int, int], list[tuple[tuple[int, ...], _Prefix | None]]] = {}
        for p, n in counts.items():
            source = _longest_source(p, self._held)
            start = 0 if source is None else len(source.ids)
            if n > 1 and len(p) - 1 > start:
                batches.setdefault((id(source), len(p) - 1 - start), []).append((p, source))
        shared: dict[tuple[int, ...], _Prefix] = {}
        for batch in batches.values():
            shared.update(
                zip([p for p, _ in batch], self._extend_all(batch[0][1], [p[:-1] for p, _ in batch]))
            )
        return [shared.get(tuple(p)) or _longest_source(p, self._held) for p in prompts]

    def _mode(self, device: torch.device) -> str:
        # the fixed-shape step hands the model a boolean 4-D mask, the form SDPA attention takes
        sdpa = getattr(getattr(self.model, "config", None), "_attn_implementation", None) == "sdpa"
        if self.decode_step == "auto":
            return "graph" if device.type == "cuda" and sdpa and not self._graph_failed else "eager"
        if self.decode_step != "eager" and not sdpa:
            raise ValueError(
                f"rollout.sampler.decode_step={self.decode_step!r} needs a model on SDPA attention "
                "(attn_implementation='sdpa'). Fix: rollout.sampler.decode_step=auto"
            )
        return self.decode_step  # a failed recording makes "graph" run the static step (``fixed``)

    def _generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        generator: torch.Generator,
        device: torch.device,
    ) -> tuple[list[Sample], list[_Prefix]]:
        b, steps = len(prompts), params.max_new_tokens
        sources = self._sources(prompts)
        cached = [0 if s is None else len(s.ids) for s in sources]
        new = [len(p) - c for p, c in zip(prompts, cached)]
        width_c, width_n = max(cached), max(new)
        width = width_c + width_n
        # layout per row: [pad | cached prefix | pad | new tokens | sampled ids]: prompt segments right-aligned
        input_ids = torch.full((b, width_n), self.pad_id, dtype=torch.long)
        positions = torch.zeros((b, width_n), dtype=torch.long)
        mask = torch.zeros((b, width + steps), dtype=torch.long)
        for i, (p, c, n) in enumerate(zip(prompts, cached, new)):
            input_ids[i, width_n - n :] = torch.tensor(p[c:], dtype=torch.long)
            positions[i, width_n - n :] = torch.arange(c, c + n)
            mask[i, width_c - c : width_c] = 1
            mask[i, width - n : width] = 1
        prompt_mask = mask[:, :width].clone()
        mask[:, width:] = 1  # every row attends to its own sampled ids (a stopped row's are never read back)
        attention = mask.to(device)
        # the last sampled id needs no keys/values: width + steps - 1 positions are ever written
        layers = getattr(getattr(self.model, "config", None), "num_hidden_layers", 0)
        cache = preallocated_cache(
            [None if s is None else s.kv for s in sources], width_c, width + steps - 1, layers
        )
        self.tokens_prefilled += sum(new)

        tokens = torch.empty((b, steps), dtype=torch.long, device=device)
        logps = torch.empty((b, steps), dtype=torch.float32, device=device)
        entropies = torch.empty((b, steps), dtype=torch.float32, device=device)
        every = self.check_every or (8 if device.type == "cuda" else 1)
        # the generator's state after each step not yet checked: wound back to where the last row stopped
        states: dict[int, torch.Tensor] = {}
        rewind = every > 1 and params.temperature > 0
        mode = self._mode(device)
        with grouped_query_attention(self.model):
            out = self.model(
                input_ids=input_ids.to(device),
                attention_mask=attention[:, :width],
                position_ids=positions.to(device),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache, logits = out.past_key_values, out.logits[:, -1, :]
            stops = _Stops(b, params, self.eos_ids, self.tokenizer, self.stop_window, logits.shape[-1])
            step = self._step_function(mode, cache, attention, tokens, positions[:, -1:].to(device), width)
            _sync(device)
            start = time.perf_counter()
            fed, checked = 0, 0  # decode steps run (sampled ids fed back); steps the host has checked
            with bar(steps, "sampling", "token") as progress:
                for s in range(steps):
                    if s > 0:
                        logits = step(s)
                        fed += 1
                    token, token_logp, entropy = _draw(logits, params, generator)
                    tokens[:, s], logps[:, s], entropies[:, s] = token, token_logp, entropy
                    if rewind:
                        states[s] = generator.get_state()
                    progress.update()
                    if s + 1 - checked < every and s + 1 < steps:
                        continue
                    stopped = stops.scan(tokens[:, checked : s + 1].cpu(), checked)  # the host sync
                    checked = s + 1
                    progress.set_postfix_str(f"{stops.active}/{b} rows active")
                    if not stops.active:
                        if rewind and stops.last_stop < s:
                            generator.set_state(states[stops.last_stop])
                        break
                    states.clear()
                    for i in stopped:
                        # masked from its last id on, as when it fed pads: the other rows' mask is then
                        # the same tensor whatever check_every is (transformers drops an all-ones mask)
                        attention[i, width + len(stops.ids[i]) - 1 :] = 0
            logps_host, entropies_host = logps[:, :checked].tolist(), entropies[:, :checked].tolist()
            self.decode_steps += fed
            self.decode_seconds += time.perf_counter() - start
        samples = [
            Sample(
                ids=ids,
                finish_reason=stops.finish[i] or "length",
                logprobs=logps_host[i][: len(ids)],
                entropies=entropies_host[i][: len(ids)],
            )
            for i, ids in enumerate(stops.ids)
        ]
        return samples, self._hold(prompts, stops.ids, cache, prompt_mask, width + fed)

    def _step_function(
        self,
        mode: str,
        cache: Any,
        attention: torch.Tensor,
        tokens: torch.Tensor,
        last_positions: torch.Tensor,
        width: int,
    ) -> Callable[[int], torch.Tensor]:
        """``step(s)``: the logits [b, vocab] after feeding the ids sampled at step s − 1."""
        model = self.model
        if mode == "eager":
            state = {"cache": cache, "positions": last_positions}

            def eager(s: int) -> torch.Tensor:
                state["positions"] = state["positions"] + 1
                out = model(
                    input_ids=tokens[:, s - 1 : s],
                    attention_mask=attention[:, : width + s],
                    position_ids=state["positions"],
                    past_key_values=state["cache"],
                    use_cache=True,
                    logits_to_keep=1,
                )
                state["cache"] = out.past_key_values
                return out.logits[:, -1, :]

            return eager
        # the fixed-shape step: inputs, mask and write position live in buffers updated in place, and
        # attention covers the whole preallocated cache (positions not yet written are masked)
        forward = functools.partial(_compiled(type(model).forward), model) if self.compile else model
        feed = torch.empty((tokens.shape[0], 1), dtype=tokens.dtype, device=tokens.device)
        positions = last_positions.clone()
        at = torch.full((1,), width - 1, dtype=torch.long, device=tokens.device)
        capacity = next(layer.capacity for layer in cache.layers if isinstance(layer, PreallocatedLayer))
        keys_mask = attention[:, :capacity].bool()
        keys_mask[:, width:] = False
        mask4 = keys_mask[:, None, None, :]  # [b, 1, 1, capacity]: a 4-D mask the model uses as given

        def static() -> torch.Tensor:
            keys_mask.index_fill_(1, at, True)
            with write_at(cache, at):
                out = forward(
                    input_ids=feed,
                    attention_mask=mask4,
                    position_ids=positions,
                    cache_position=at,  # the model need not read the cache's length (a compiled step's guard)
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
            return out.logits[:, -1, :]

        recorded: list[Any] = []  # [CUDAGraph, its logits] once recorded

        def fixed(s: int) -> torch.Tensor:
            feed.copy_(tokens[:, s - 1 : s])
            positions.add_(1)
            at.add_(1)
            if recorded:
                recorded[0].replay()
                return recorded[1]
            if mode == "static" or self._graph_failed:
                return static()
            logits = _warm_up(static)  # step s itself: recording a graph runs nothing
            graph = self._capture(static)
            if graph is None:
                self._graph_failed = True
            else:
                recorded.extend(graph)
            return logits

        return fixed

    def _capture(self, step: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor] | None:
        """``step`` recorded as a CUDA graph with its output; None (with a warning) where it cannot be."""
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                logits = step()
        except Exception as error:  # any op that syncs or allocates on the host fails the recording
            warnings.warn(
                f"HFSampler could not record the decode step as a CUDA graph ({error}); decoding eagerly. "
                "Set rollout.sampler.decode_step=static to skip the attempt.",
                stacklevel=3,
            )
            return None
        return graph, logits

    def _hold(
        self,
        prompts: Sequence[Sequence[int]],
        ids: list[list[int]],
        cache: Any,
        prompt_mask: torch.Tensor,
        written: int,
    ) -> list[_Prefix]:
        """Each row's keys/values at its attended positions: prompt + sampled ids but the last.

        A row whose positions are one run (no padding inside: every row of a first turn's groups) holds a
        view of the batch's cache; the others are copied out by one indexing per layer (their positions
        padded to the longest), each a view of that copy. They are cut out when a later turn first asks for
        one: a last turn's (every turn of a single-turn task) never are, which was a tenth of the organism's
        rollout. Nothing writes the batch's cache after its last step (the next batch has its own)."""
        if not self.reuse_prefix or cache is None:
            return []
        for layer in cache.layers:
            if isinstance(layer, PreallocatedLayer):
                layer.written(written)  # a recorded step writes without moving the layer's views
        layers = cache_layers(cache, "HFSampler prefix reuse")
        width = prompt_mask.shape[1]

        @functools.cache
        def views() -> list[KV]:
            rows = [
                torch.nonzero(prompt_mask[i]).squeeze(-1).tolist()
                + list(range(width, width + len(ids[i]) - 1))
                for i in range(len(prompts))
            ]
            kv: list[KV] = [
                [(k[i : i + 1, :, r[0] : r[-1] + 1], v[i : i + 1, :, r[0] : r[-1] + 1]) for k, v in layers]
                if r[-1] - r[0] + 1 == len(r)
                else []
                for i, r in enumerate(rows)
            ]
            gaps = [i for i, held in enumerate(kv) if not held]
            if gaps:
                longest = max(len(rows[i]) for i in gaps)
                device = layers[0][0].device
                positions = torch.tensor(
                    [rows[i] + [0] * (longest - len(rows[i])) for i in gaps], device=device
                )
                batch = torch.tensor(gaps, device=device)[:, None]
                # [rows, longest, kv_heads, head_dim] seen as [rows, kv_heads, longest, head_dim]
                picked = [
                    (k[batch, :, positions].transpose(1, 2), v[batch, :, positions].transpose(1, 2))
                    for k, v in layers
                ]
                for j, i in enumerate(gaps):
                    n = len(rows[i])
                    kv[i] = [(k[j : j + 1, :, :n], v[j : j + 1, :, :n]) for k, v in picked]
            return kv

        return [
            _Prefix((*p, *ids[i][:-1]), functools.partial(lambda i: views()[i], i))
            for i, p in enumerate(prompts)
        ]


@functools.cache
def _compiled(forward: Callable[..., Any]) -> Callable[..., Any]:
    """A model class's forward compiled once per process: every sampler and model of the class shares it
    (its weights are inputs, so an update in place needs no new compilation)."""
    return torch.compile(forward, dynamic=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _warm_up(step: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``step`` run once on a side stream, as CUDA graph capture wants for the work it records."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = step()
    torch.cuda.current_stream().wait_stream(side)
    return out
