"""Exact I(X;Z) and H(Z|X) over a finite reasoning grammar (``diag/exact/*``; docs/diagnostics.md).

Where an env holds the reasoning to a finite grammar (``TextEnv.reasoning_grammar``: every accepted
reasoning listed), the policy's distribution over reasonings can be read whole, with no sampling and no
proxy: for every prompt x of a fixed set and every sentence z of the grammar, ``log π(z + </think> | x)``,
the probability that the sampled reasoning is exactly z (the closing tag included: a reasoning that goes on
past z is another one). Renormalised over the grammar, ``q(z|x) = π(z|x) / Σ_z' π(z'|x)``; with the prompts
uniform, ``q̄(z) = mean_x q(z|x)`` and

* ``mi`` = I(X;Z) = mean_x Σ_z q(z|x) log(q(z|x) / q̄(z)), at most log P (P prompts) and log G (G sentences);
* ``cond_entropy`` = H(Z|X) = −mean_x Σ_z q(z|x) log q(z|x); ``entropy`` = H(Z) = −Σ_z q̄(z) log q̄(z);
* ``grammar_mass`` = mean_x Σ_z π(z|x): the policy's probability of writing a grammatical reasoning at all
  (the rest is a format failure, and is not in the figures above).

Each sentence is scored as the token ids its text encodes to. That is exact for a tokenizer that writes a
sentence only one way (the organism's word-level vocabulary); under a BPE vocabulary the other spellings of a
sentence count as mass outside the grammar.

Cost: the sentences form a prefix tree, scored under each prompt in one forward of the tree's inner nodes
(each node sees the prompt's cache and its own ancestors), on prompt caches from one batched forward: Σ
over prompts of the tree's inner nodes, 547 positions a prompt for the organism's 512 sentences of 4 tokens;
the LM head runs on those nodes too, each child's log-prob read off its parent's row.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel

from ragen2.algos.logprobs import chunk_rows_for
from ragen2.diagnostics.cross_scoring import embedding_weight, scoring
from ragen2.models.forward import lm_head
from ragen2.models.kv import KV, as_cache, cache_layers, cache_len

EXACT = "exact"  # the figures' name: diag/exact/*
EXACT_KEYS = ("mi", "cond_entropy", "entropy", "grammar_mass", "mi_upper_bound", "prompts", "sentences")


@dataclass(frozen=True)
class PrefixTree:
    """The sentences' token ids as a tree: node 0 is the root (it stands for the prompt's last token); node
    i > 0 is ``token[i]`` after its ``parent[i]``, at ``depth[i]`` tokens into a sentence."""

    token: list[int]
    parent: list[int]
    depth: list[int]
    leaf: list[int]  # the node that ends each sentence, in the sentences' order

    @classmethod
    def of(cls, sentences: Sequence[Sequence[int]]) -> PrefixTree:
        tree = cls(token=[-1], parent=[-1], depth=[0], leaf=[])
        children: dict[tuple[int, int], int] = {}
        for ids in sentences:
            if not ids:
                raise ValueError(
                    "a sentence of the grammar has no token ids; every sentence needs at least one"
                )
            node = 0
            for t in ids:
                key = (node, int(t))
                if key not in children:
                    children[key] = len(tree.token)
                    tree.token.append(int(t))
                    tree.parent.append(node)
                    tree.depth.append(tree.depth[node] + 1)
                node = children[key]
            tree.leaf.append(node)
        return tree

    def inner(self) -> list[int]:
        """The nodes with children: the positions a forward runs (the root included)."""
        return sorted({p for p in self.parent[1:]})


def _ancestry(tree: PrefixTree, order: list[int]) -> Tensor:
    """[n, n] bool over the inner nodes in ``order`` (parents before children): each sees its ancestors and
    itself."""
    at = {node: i for i, node in enumerate(order)}
    allowed = torch.zeros(len(order), len(order), dtype=torch.bool)
    for i, node in enumerate(order):
        if node:
            allowed[i] = allowed[at[tree.parent[node]]]
        allowed[i, i] = True
    return allowed


def _paths(tree: PrefixTree) -> Tensor:
    """[G, nodes − 1] float64: 1 where a child node lies on a sentence's path (its log-prob sums them)."""
    on_path = torch.zeros(len(tree.leaf), len(tree.token) - 1, dtype=torch.float64)
    for g, node in enumerate(tree.leaf):
        while node:
            on_path[g, node - 1] = 1.0
            node = tree.parent[node]
    return on_path


def grammar_logprobs(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    sentences: Sequence[Sequence[int]],
    max_batch_positions: int = 1 << 16,
) -> Tensor:
    """[P, G] float64 ``log π(sentence g | prompt p)``: each sentence's ids summed under teacher forcing.

    Prompts of one length score the sentence tree together, as many per forward as fit
    ``max_batch_positions`` (2¹⁶: the organism's 64 prompts × 547 nodes in one batch), on their caches from one
    batched forward (``_prompt_batches``), one
    forward per depth of the tree on the cache the shallower depths left (the deepest depth in segments): a
    node attends to the prompt, its ancestors and itself, so the attention is each segment's nodes × (prompt +
    the shallower nodes + the segment), not every node × every node."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("grammar_logprobs needs at least one prompt, each with at least one token id")
    tree = PrefixTree.of(sentences)
    order = sorted(tree.inner(), key=lambda node: (tree.depth[node], node))  # the root first, then by depth
    at = {node: i for i, node in enumerate(order)}
    parent_rows = torch.tensor([at[p] for p in tree.parent[1:]])
    targets = torch.tensor(tree.token[1:])
    ancestry, paths = _ancestry(tree, order), _paths(tree)
    depths = [tree.depth[node] for node in order]
    levels = [(depths.index(d), len(depths) - depths[::-1].index(d)) for d in sorted(set(depths))]
    # the deepest level (most of the nodes) in segments as wide as what they attend to besides themselves: each
    # segment's attention is segment × (prompt + shallower + segment), not level × (prompt + whole tree)
    deepest = levels[-1][0]
    segments = levels[:-1] + [
        (s, min(s + max(deepest, 64), len(order))) for s in range(deepest, len(order), max(deepest, 64))
    ]
    distinct = [tuple(int(t) for t in p) for p in prompts]
    device = model.device
    dtype, vocab = embedding_weight(model).dtype, embedding_weight(model).shape[0]
    out = torch.zeros(len(distinct), len(sentences), dtype=torch.float64)
    columns = max(1, max_batch_positions // len(order))
    with scoring(model):
        for rows, stacked in _prompt_batches(model, distinct, columns):
            past = cache_len(stacked)
            inputs = torch.tensor([[distinct[j][-1], *(tree.token[n] for n in order[1:])] for j in rows])
            kv, hidden = stacked, []
            for start, stop in segments:
                # a segment sees the prompt, the shallower levels (their keys and values in ``kv``) and itself;
                # a deeper level's needs the segment's own, and the deepest level's are never read again
                allowed = torch.cat(
                    [
                        torch.ones(stop - start, past, dtype=torch.bool),
                        ancestry[start:stop, : min(start, deepest)],
                        ancestry[start:stop, start:stop],
                    ],
                    dim=1,
                )
                mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
                level = model.get_decoder()(
                    input_ids=inputs[:, start:stop].to(device),
                    attention_mask=mask[None, None].expand(len(rows), 1, -1, -1).to(device),
                    position_ids=torch.tensor([past + d for d in depths[start:stop]], device=device).expand(
                        len(rows), -1
                    ),
                    past_key_values=as_cache(kv),
                    use_cache=True,
                )
                if start < deepest:
                    kv = cache_layers(level.past_key_values, "exact MI")
                hidden.append(level.last_hidden_state)  # [b, nodes of the segment, H]
            inner = torch.cat(hidden, dim=1).reshape(-1, hidden[0].shape[-1])  # [b · inner nodes, H]
            # child c of row j reads the log-softmax of its parent's row: flat row j · inner + parent_rows[c]
            parents = (torch.arange(len(rows))[:, None] * len(order) + parent_rows).reshape(-1)
            logp = child_logprobs(
                inner, parents.to(device), targets.to(device).repeat(len(rows)), lm_head(model), vocab
            )
            out[rows] = logp.double().cpu().view(len(rows), -1) @ paths.T
    return out


def _prompt_batches(
    model: PreTrainedModel, prompts: Sequence[tuple[int, ...]], columns: int
) -> Iterator[tuple[list[int], KV | None]]:
    """Prompts of one length, up to ``columns`` at a time: their indices and their caches (each prompt but its
    last token, stacked along the batch) from one forward. The held-out prompts are few and short: one
    batched forward beats ``cache_batches``'s walk of their prefix tree, a forward per prompt (64 → 1 for the
    organism). Call it under ``scoring``."""
    by_length: dict[int, list[int]] = {}
    for j, prompt in enumerate(prompts):
        by_length.setdefault(len(prompt), []).append(j)
    for same in by_length.values():
        for start in range(0, len(same), columns):
            rows = same[start : start + columns]
            if len(prompts[rows[0]]) == 1:  # nothing before the last token: no cache
                yield rows, None
                continue
            ids = torch.tensor([prompts[j][:-1] for j in rows], device=model.device)
            out = model.get_decoder()(input_ids=ids, use_cache=True)
            yield rows, cache_layers(out.past_key_values, "exact MI")


def child_logprobs(
    inner: Tensor, parents: Tensor, targets: Tensor, head: torch.nn.Module, vocab: int
) -> Tensor:
    """[C] ``log softmax(head(inner[parents[c]]))[targets[c]]``, in fp32 (fp64 for an fp64 model): the head
    runs once per inner node, not once per child (half the rows for the organism's tree: 547 inner nodes,
    1,058 children), a chunk of rows at a time (``chunk_rows_for``) so that no [nodes, V] tensor outlives its
    chunk at any vocabulary."""
    out = torch.empty(
        parents.shape[0], dtype=torch.promote_types(inner.dtype, torch.float32), device=inner.device
    )
    rows = chunk_rows_for(vocab)
    for start in range(0, inner.shape[0], rows):
        logsoftmax = head(inner[start : start + rows]).to(out.dtype).log_softmax(-1)
        here = (parents >= start) & (parents < start + rows)
        out[here] = logsoftmax[parents[here] - start, targets[here]]
    return out


def exact_mi(logp: Tensor) -> dict[str, float]:
    """``EXACT_KEYS`` from a [P, G] table of ``log π(z_g | x_p)`` (the module's docstring), in float64."""
    if logp.dim() != 2 or logp.shape[0] < 1 or logp.shape[1] < 1:
        raise ValueError(f"logp must be [prompts, sentences] with both ≥ 1, got {tuple(logp.shape)}")
    logp = logp.double()
    prompts, sentences = logp.shape
    mass = torch.logsumexp(logp, dim=1)  # [P] log Σ_z π(z|x)
    log_q = logp - mass[:, None]
    log_qbar = torch.logsumexp(log_q, dim=0) - math.log(prompts)  # [G]
    q = log_q.exp()
    # 0 · log 0 = 0: a sentence the policy never writes under x adds nothing
    plogp = torch.where(q > 0, q * log_q, torch.zeros_like(q))
    cond_entropy = float(-plogp.sum(dim=1).mean())
    qbar = log_qbar.exp()
    entropy = float(-torch.where(qbar > 0, qbar * log_qbar, torch.zeros_like(qbar)).sum())
    return {
        "mi": entropy - cond_entropy,
        "cond_entropy": cond_entropy,
        "entropy": entropy,
        "grammar_mass": float(mass.exp().mean()),
        "mi_upper_bound": math.log(min(prompts, sentences)),
        "prompts": float(prompts),
        "sentences": float(sentences),
    }
