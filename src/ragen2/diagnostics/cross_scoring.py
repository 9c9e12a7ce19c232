"""In-batch cross-scoring: ``L[r, j] = Σ_t log π(z_r,t | x_j, z_r,<t)`` for every row r and prompt j.

The reference runs one full forward of ``x_j + z_r`` per pair: C·R sequences of |x| + |z| tokens.
``cross_score`` reuses key/value caches instead (docs/method.md §3 "Cost"):

* identical prompts are one column and identical reasonings are scored once;
* the causal model's keys/values for a token depend only on the tokens before it, so the cache of
  any prompt, cut to length l, is the cache of its first l tokens. Walking the distinct prompts in
  sorted order of their contexts, each context starts from the previous one's cache cut to their
  longest common prefix and runs only the tokens after it: every node of the contexts' prefix
  tree is encoded once (the shared system prompt included);
* a prompt's context is the prompt minus its last token; each reasoning is the segment
  ``[x_last, z_1 … z_{n−1}]`` at positions ``|context| …``, so it costs exactly |z| positions per
  column and a prompt that is a prefix of another needs no special case;
* a column's segments are packed side by side into one batch-1 sequence (chunks of at most
  ``max_batch_tokens`` positions) under a block mask: each segment sees the cache and itself; the LM
  head runs on the decoder's hidden states in chunks of rows (``ragen2.algos.logprobs.token_stats``),
  so no [positions, vocabulary] logits exist at once (Qwen2.5's 151,936 entries). A
  batch of right-padded rows against a cache expanded along the batch ran padding, copied the cache
  once per row in every layer and computed logits it threw away; on the built-in model on CPU it
  ran ~1.8× slower per position than the naive scorer (bench/bench_cross_scoring.py).

Cost: ``Σ |prefix-tree nodes of the contexts| + C·Σ_unique |z|`` positions, never more than
``token_bound`` (``CrossScores.token_bound``: the prompts' prefix tree plus C·Σ_r |z_r|); below it when
reasonings repeat. Only full-attention decoders whose cache layers are plain ``DynamicLayer``s are
supported; others raise (use ``naive_cross_score``).
"""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel

from ragen2.algos.logprobs import token_stats
from ragen2.models.forward import lm_head
from ragen2.models.kv import KV, as_cache, cache_len, extend, truncate
from ragen2.progress import bar

Row = tuple[tuple[int, ...], tuple[int, ...]]


@dataclass
class CrossScores:
    """One cross-scoring pass; rows keep the caller's order, columns are distinct prompts."""

    logp_sum: Tensor  # [R, C] float32, Σ_t log π(z_r,t | x_j, z_r,<t)
    num_tokens: Tensor  # [R] long, |z_r|
    prompt_index: Tensor  # [R] long, column of row r's own prompt
    prompts: list[tuple[int, ...]]  # [C] distinct prompt ids, in order of first appearance
    tokens_processed: int  # token positions the model ran forward on (padding included)
    token_bound: int  # the minimum: Σ unique prefix tokens of the prompts + C·Σ_r |z_r|


def _validate_rows(rows: Sequence[tuple[Sequence[int], Sequence[int]]], vocab_size: int) -> list[Row]:
    if len(rows) == 0:
        raise ValueError("rows is empty; pass at least one (prompt_ids, reasoning_ids) pair")
    clean: list[Row] = []
    for r, row in enumerate(rows):
        if len(row) != 2:
            raise ValueError(f"rows[{r}] must be a (prompt_ids, reasoning_ids) pair, got {len(row)} items")
        x, z = (tuple(int(t) for t in part) for part in row)
        if not x:
            raise ValueError(f"rows[{r}] has empty prompt ids; the first reasoning token needs a context")
        if not z:
            raise ValueError(f"rows[{r}] has empty reasoning ids; drop rows without a valid Z before scoring")
        bad = [t for t in x + z if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"rows[{r}] holds ids {bad[:5]} outside the model's vocabulary [0, {vocab_size})"
            )
        clean.append((x, z))
    return clean


def _index(items: Sequence[tuple[int, ...]]) -> tuple[list[tuple[int, ...]], Tensor]:
    """Distinct items in order of first appearance and each item's position among them."""
    position: dict[tuple[int, ...], int] = {}
    index = [position.setdefault(item, len(position)) for item in items]
    return list(position), torch.tensor(index, dtype=torch.long)


def _target_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """log softmax(logits)[target] per position; [T, V], [T] -> [T] float32.

    Gathers the target's logit and subtracts the logsumexp: no [T, V] log-softmax copy and no
    full-vocabulary entropy.
    """
    logits = logits.float()
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _token_logprob_sums(logits: Tensor, targets: Tensor, valid: Tensor) -> Tensor:
    """Σ over valid positions of log softmax(logits)[target]; [B, T, V], [B, T], [B, T] -> [B]."""
    per_position = torch.zeros(valid.shape, dtype=torch.float32, device=logits.device)
    per_position[valid] = _target_logprobs(logits[valid], targets[valid])
    return per_position.sum(dim=1)


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for s, t in zip(a, b):
        if s != t:
            break
        n += 1
    return n


def token_bound(prompts: Sequence[tuple[int, ...]], num_tokens: Sequence[int]) -> int:
    """The fewest positions any scorer runs: every node of the prompts' prefix tree once (a shared
    prefix counts once) plus every row's |z| under every column, Σ_j Σ_r |z_r|.

    In sorted order a prompt's longest common prefix with any earlier prompt is the one it shares
    with its predecessor, so the tree's nodes are Σ (|p| − lcp(p, predecessor)).
    """
    nodes, previous = 0, ()
    for p in sorted(prompts):
        nodes += len(p) - _common_prefix_len(previous, p)
        previous = p
    return nodes + len(prompts) * sum(num_tokens)


def _chunks(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Consecutive groups of items whose lengths sum to at most ``max_batch_tokens`` (at least one each)."""
    chunks: list[list[int]] = []
    used = 0
    for i, n in enumerate(lengths):
        if chunks and used + n <= max_batch_tokens:
            chunks[-1].append(i)
            used += n
        else:
            chunks.append([i])
            used = n
    return chunks


def _packed_mask(lengths: Sequence[int], past: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Additive [1, 1, T, past + T] mask: every segment sees the whole cache and itself, causally."""
    segment = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    causal = torch.ones(len(segment), len(segment), dtype=torch.bool).tril()
    allowed = torch.cat(
        [torch.ones(len(segment), past, dtype=torch.bool), causal & (segment[:, None] == segment[None, :])],
        dim=1,
    )
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def _score_columns(
    model: PreTrainedModel,
    kv: KV | None,
    lasts: Sequence[int],
    zs: Sequence[tuple[int, ...]],
    max_batch_tokens: int,
) -> tuple[Tensor, int]:
    """[len(zs), C] Σ log π(z | prompt) for each z under each of C prompts whose caches (minus each prompt's
    last token ``lasts[c]``) have one length and are stacked along ``kv``'s batch.

    The reasonings are packed side by side into one sequence per chunk of ``max_batch_tokens`` positions,
    the same for every column, each segment ``[last, z_1 … z_{n−1}]`` at positions ``past … past + n − 1``
    under a block mask. Against a batch of rows this runs no padding, copies the cache once per chunk
    instead of once per row, and every logit it computes is used.
    """
    device = model.device
    dtype = embedding_weight(model).dtype
    past, columns = cache_len(kv), len(lasts)
    sums = torch.zeros(len(zs), columns, dtype=torch.float32)
    processed = 0
    for chunk in _chunks([len(z) for z in zs], max_batch_tokens):
        lengths = [len(zs[i]) for i in chunk]
        inputs = torch.tensor([t for i in chunk for t in (0, *zs[i][:-1])]).repeat(columns, 1)
        starts = torch.cumsum(torch.tensor([0, *lengths[:-1]]), 0)
        inputs[:, starts] = torch.tensor(lasts)[:, None]  # each segment opens on its column's last token
        targets = torch.tensor([t for i in chunk for t in zs[i]], device=device)
        positions = torch.cat([torch.arange(past, past + n) for n in lengths]).to(device)
        mask = _packed_mask(lengths, past, dtype, device)
        hidden = model.get_decoder()(
            input_ids=inputs.to(device),
            attention_mask=mask.expand(columns, -1, -1, -1),
            position_ids=positions[None].expand(columns, -1),
            past_key_values=as_cache(kv),
            use_cache=True,
        ).last_hidden_state  # [C, T, H]
        # the head in chunks of rows (ragen2.algos.logprobs): no [positions, vocab] logits at once
        logp, _ = token_stats(hidden.reshape(-1, hidden.shape[-1]), targets.repeat(columns), lm_head(model))
        segment = torch.repeat_interleave(torch.arange(len(chunk)), torch.tensor(lengths)).to(device)
        per_segment = torch.zeros(columns, len(chunk), device=device)
        sums[chunk] = per_segment.index_add_(1, segment, logp.view(columns, -1)).T.cpu()
        processed += len(targets) * columns
    return sums, processed


def embedding_weight(model: PreTrainedModel) -> torch.Tensor:
    """The input embedding table, one row per token id."""
    weight = model.get_input_embeddings().weight
    assert isinstance(weight, torch.Tensor)  # nn.Module's attributes are typed Tensor | Module
    return weight


def _check_model(model: PreTrainedModel) -> int:
    if not isinstance(model, PreTrainedModel):
        raise TypeError(
            f"model must be a transformers PreTrainedModel (causal LM), got {type(model).__name__}"
        )
    return embedding_weight(model).shape[0]


@contextmanager
def scoring(model: PreTrainedModel) -> Iterator[None]:
    """Eval mode and no gradients within the block; the model's train/eval mode is restored after it."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def prompt_caches(
    model: PreTrainedModel, prompts: Sequence[tuple[int, ...]], desc: str, common_prefix: bool = True
) -> Iterator[tuple[int, KV | None, int]]:
    """``(j, cache of prompts[j] minus its last token, positions run for it)`` for every prompt, in sorted
    order of the contexts: a context's longest common prefix with any earlier one is the one it shares with
    its predecessor, so each node of the contexts' prefix tree is encoded once (``common_prefix=False``:
    each context from scratch). Call it under ``scoring``."""
    previous: tuple[int, ...] = ()
    kv: KV | None = None
    with bar(len(prompts), desc, "prompt") as progress:
        for j in sorted(range(len(prompts)), key=lambda c: prompts[c][:-1]):
            context = prompts[j][:-1]
            shared = _common_prefix_len(previous, context) if common_prefix else 0
            kv = extend(model, truncate(kv, shared), context[shared:], f"{desc} (else use naive_cross_score)")
            previous = context
            yield j, kv, len(context) - shared
            progress.update()


def _stacked(caches: Sequence[KV | None]) -> KV | None:
    """Caches of one length, stacked along the batch (None: every context was empty)."""
    if caches[0] is None:
        return None
    return [
        (torch.cat([c[layer][0] for c in caches]), torch.cat([c[layer][1] for c in caches]))  # type: ignore[index]
        for layer in range(len(caches[0]))
    ]


def cache_batches(
    model: PreTrainedModel,
    prompts: Sequence[tuple[int, ...]],
    desc: str,
    max_columns: int,
    common_prefix: bool = True,
) -> Iterator[tuple[list[int], KV | None, int]]:
    """``prompt_caches`` in batches of up to ``max_columns`` prompts whose caches have one length: their
    indices, their caches stacked along the batch, and the positions run to encode them since the last
    batch. One forward then serves a whole batch: with a small model, a forward's fixed cost is most of it."""
    pending: dict[int, list[tuple[int, KV | None]]] = {}
    cost = 0
    for j, kv, positions in prompt_caches(model, prompts, desc, common_prefix):
        cost += positions
        group = pending.setdefault(cache_len(kv), [])
        group.append((j, kv))
        if len(group) == max_columns:
            yield [i for i, _ in group], _stacked([c for _, c in group]), cost
            cost = 0
            del pending[cache_len(kv)]
    for group in pending.values():
        yield [i for i, _ in group], _stacked([c for _, c in group]), cost
        cost = 0


def cross_score(
    model: PreTrainedModel,
    rows: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    max_batch_tokens: int = 512,
    max_batch_positions: int = 8192,
    common_prefix: bool = True,
) -> CrossScores:
    """Score every row's reasoning Z under every distinct prompt X with KV-cache reuse.

    rows: (prompt_ids X, reasoning_ids Z) pairs, both non-empty. ``max_batch_tokens`` bounds the
    reasoning positions packed into one forward (a longer reasoning runs alone): its attention is
    [max_batch_tokens, cached + max_batch_tokens] (its logits come in ``token_stats``'s chunks), so
    larger chunks feed the matrix products better but spend more attention on masked pairs.
    Prompts whose caches have one length are scored together, as many per forward as keep the forward within
    ``max_batch_positions`` positions (``cache_batches``).
    ``common_prefix=False`` encodes each distinct prompt from scratch instead of sharing prefixes across
    prompts (for the cost benchmark).
    Runs under ``torch.no_grad()`` in eval mode; the model's train/eval mode is restored.
    """
    vocab_size = _check_model(model)
    if max_batch_tokens < 1 or max_batch_positions < 1:
        raise ValueError(
            f"max_batch_tokens and max_batch_positions must be >= 1, got {max_batch_tokens}, {max_batch_positions}"
        )
    clean = _validate_rows(rows, vocab_size)
    prompts, prompt_index = _index([x for x, _ in clean])
    reasonings, reasoning_index = _index([z for _, z in clean])
    unique_scores = torch.zeros(len(reasonings), len(prompts), dtype=torch.float32)
    processed = 0
    per_column = min(sum(len(z) for z in reasonings), max_batch_tokens)
    columns = max(1, max_batch_positions // per_column)
    with scoring(model):
        for batch, kv, cost in cache_batches(model, prompts, "MI cross-scoring", columns, common_prefix):
            lasts = [prompts[j][-1] for j in batch]
            scores, positions = _score_columns(model, kv, lasts, reasonings, max_batch_tokens)
            unique_scores[:, batch] = scores
            processed += cost + positions
    return CrossScores(
        logp_sum=unique_scores[reasoning_index],
        num_tokens=torch.tensor([len(z) for _, z in clean], dtype=torch.long),
        prompt_index=prompt_index,
        prompts=prompts,
        tokens_processed=processed,
        token_bound=token_bound(prompts, [len(z) for _, z in clean]),
    )


def naive_cross_score(
    model: PreTrainedModel, rows: Sequence[tuple[Sequence[int], Sequence[int]]], *, batch_size: int = 1
) -> CrossScores:
    """The reference's way: one full forward of ``x_j + z_r`` per (column, row) pair, no reuse.

    ``batch_size`` pairs of one column run together, right-padded (the reference batches 16).
    The ground truth for ``cross_score``'s tests and the baseline of its benchmark.
    """
    vocab_size = _check_model(model)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    clean = _validate_rows(rows, vocab_size)
    prompts, prompt_index = _index([x for x, _ in clean])
    device = model.device
    logp_sum = torch.zeros(len(clean), len(prompts), dtype=torch.float32)
    processed = 0
    with scoring(model):
        for j, x in enumerate(prompts):
            for start in range(0, len(clean), batch_size):
                batch = range(start, min(start + batch_size, len(clean)))
                width = len(x) + max(len(clean[r][1]) for r in batch)
                inputs = torch.zeros(len(batch), width, dtype=torch.long)
                targets = torch.zeros(len(batch), width, dtype=torch.long)
                valid = torch.zeros(len(batch), width, dtype=torch.bool)
                attention = torch.zeros(len(batch), width, dtype=torch.long)
                for b, r in enumerate(batch):
                    z = clean[r][1]
                    inputs[b, : len(x) + len(z)] = torch.tensor(x + z)
                    attention[b, : len(x) + len(z)] = 1
                    # position p predicts token p + 1: z's tokens from the last prompt position on
                    targets[b, len(x) - 1 : len(x) + len(z) - 1] = torch.tensor(z)
                    valid[b, len(x) - 1 : len(x) + len(z) - 1] = True
                logits = model(input_ids=inputs.to(device), attention_mask=attention.to(device)).logits
                logp_sum[list(batch), j] = _token_logprob_sums(
                    logits, targets.to(device), valid.to(device)
                ).cpu()
                processed += len(batch) * width
    return CrossScores(
        logp_sum=logp_sum,
        num_tokens=torch.tensor([len(z) for _, z in clean], dtype=torch.long),
        prompt_index=prompt_index,
        prompts=prompts,
        tokens_processed=processed,
        token_bound=token_bound(prompts, [len(z) for _, z in clean]),
    )
