"""Exact I(X;Z) over a reasoning grammar: hand-derived tables, and the prefix-tree scorer against per-pair
forwards on a real model."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaForCausalLM

from ragen2.diagnostics.cross_scoring import naive_cross_score
from ragen2.diagnostics.exact import PrefixTree, exact_mi, grammar_logprobs


def test_a_reasoning_that_names_the_prompt_carries_one_bit() -> None:
    # p(z|x1) = (1/2, 1/2, 0, 0), p(z|x2) = (0, 0, 1/2, 1/2): q̄ = 1/4 each, H(Z) = log 4, H(Z|X) = log 2,
    # I = log 4 − log 2 = log 2 (the ceiling of 2 prompts), and all mass inside the grammar
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]], dtype=torch.float64)
    out = exact_mi(p.log())
    assert out["mi"] == pytest.approx(math.log(2), abs=1e-12)
    assert out["cond_entropy"] == pytest.approx(math.log(2), abs=1e-12)
    assert out["entropy"] == pytest.approx(math.log(4), abs=1e-12)
    assert out["grammar_mass"] == pytest.approx(1.0, abs=1e-12)
    assert out["mi_upper_bound"] == pytest.approx(math.log(2))
    assert (out["prompts"], out["sentences"]) == (2.0, 4.0)


def test_mass_outside_the_grammar_is_renormalised_away_and_reported() -> None:
    # half of each prompt's mass is outside the grammar; inside it q(z|x1) = (.4, .3, .2, .1), q(z|x2) reversed:
    # q̄ = 1/4 each, H(Z) = log 4 = 1.386294; H(Z|X) = −(.4 ln .4 + .3 ln .3 + .2 ln .2 + .1 ln .1)
    # = .366516 + .361192 + .321888 + .230259 = 1.279854; I = 1.386294 − 1.279854 = 0.106440
    q = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)
    out = exact_mi((0.5 * q).log())
    assert out["cond_entropy"] == pytest.approx(1.279854, abs=1e-6)
    assert out["mi"] == pytest.approx(0.106440, abs=1e-6)
    assert out["grammar_mass"] == pytest.approx(0.5, abs=1e-12)


def test_a_reasoning_blind_to_its_prompt_has_none() -> None:
    # template collapse: the same diverse distribution under every prompt, I = 0 while H(Z|X) = log 4
    p = torch.full((3, 4), 0.25, dtype=torch.float64)
    out = exact_mi(p.log())
    assert out["mi"] == pytest.approx(0.0, abs=1e-12)
    assert out["cond_entropy"] == pytest.approx(math.log(4), abs=1e-12)


def test_a_malformed_table_is_refused() -> None:
    with pytest.raises(ValueError, match="prompts, sentences"):
        exact_mi(torch.zeros(4))


def test_the_prefix_tree_shares_prefixes() -> None:
    tree = PrefixTree.of([[1, 2, 9], [1, 3, 9], [1, 2, 8], [4]])
    # root, 1, 2, 9, 3, 9', 8, 4: eight nodes, the shared "1" and "1 2" once
    assert tree.token == [-1, 1, 2, 9, 3, 9, 8, 4]
    assert tree.parent == [-1, 0, 1, 2, 1, 4, 2, 0]
    assert tree.leaf == [3, 5, 6, 7]
    assert tree.inner() == [0, 1, 2, 4]
    with pytest.raises(ValueError, match="no token ids"):
        PrefixTree.of([[1], []])


def test_tree_scores_equal_per_pair_forwards(small_llama: LlamaForCausalLM) -> None:
    # every (prompt, sentence) scored by a full forward of prompt + sentence, against the tree's batched pass;
    # prompts of two lengths (two batches) sharing a prefix, sentences of three lengths sharing prefixes
    system = list(range(10, 30))
    prompts = [[*system, 1, 2], [*system, 3, 4], [*system, 5], [7, 8, 9]]
    sentences = [[40, 41, 42], [40, 41, 43], [40, 44], [45], [46, 41, 42, 47]]
    tree = grammar_logprobs(small_llama, prompts, sentences)
    naive = naive_cross_score(small_llama, [(x, z) for x in prompts for z in sentences], batch_size=4)
    for r, (x, z) in enumerate((x, z) for x in prompts for z in sentences):
        j, g = prompts.index(x), sentences.index(z)
        assert float(tree[j, g]) == pytest.approx(float(naive.logp_sum[r, naive.prompt_index[r]]), abs=2e-4)
    assert tree.dtype == torch.float64 and tree.shape == (4, 5)


def test_a_wide_deepest_level_runs_in_segments_with_the_same_scores(small_llama: LlamaForCausalLM) -> None:
    # 100 sentences of 3 tokens: the deepest inner level holds 100 nodes, scored in two segments (64 + 36), each
    # seeing the prompt and the shallower levels but not the other segment; every score as a per-pair forward
    prompts = [[1, 2, 3], [4, 5, 6]]
    sentences = [[40 + a, 60 + b, 99] for a in range(10) for b in range(10)]
    tree = grammar_logprobs(small_llama, prompts, sentences)
    naive = naive_cross_score(small_llama, [(x, z) for x in prompts for z in sentences], batch_size=50)
    for r, (x, z) in enumerate((x, z) for x in prompts for z in sentences):
        j, g = prompts.index(x), sentences.index(z)
        assert float(tree[j, g]) == pytest.approx(float(naive.logp_sum[r, naive.prompt_index[r]]), abs=2e-4)
