"""Cached cross-scoring against the naive one-forward-per-pair scorer, and the Z extraction rule."""

import math
from collections.abc import Sequence

import pytest
import torch
from transformers import LlamaForCausalLM

from ragen2.agent.reasoning import reasoning_ids as extract_reasoning
from ragen2.diagnostics.cross_scoring import CrossScores, cross_score, naive_cross_score, token_bound
from ragen2.diagnostics.mi import mi_metrics


@pytest.fixture
def model(small_llama: LlamaForCausalLM) -> LlamaForCausalLM:
    return small_llama


SYSTEM = list(range(10, 40))  # a 30-token prefix shared by the first three prompts
X1 = [*SYSTEM, 1, 2, 3]
X2 = [*SYSTEM, 4, 5]
X3 = [*SYSTEM, 1, 2]  # a prefix of X1
X4 = [7]  # a one-token prompt: nothing to cache, shares nothing
ROWS = [
    (X1, [5, 6, 7]),
    (X1, [9]),  # duplicate prompt
    (X2, [3, 3, 3, 3, 3, 3]),
    (X3, [8, 1, 2]),
    (X4, [4, 4]),
    (X2, [9]),  # duplicate reasoning under another prompt
    (X3, [0, 0, 1, 2, 3]),
]


def _assert_same(a: CrossScores, b: CrossScores) -> None:
    assert a.prompts == b.prompts
    assert torch.equal(a.prompt_index, b.prompt_index)
    assert torch.equal(a.num_tokens, b.num_tokens)
    assert a.logp_sum.dtype == torch.float32
    torch.testing.assert_close(a.logp_sum, b.logp_sum, atol=1e-4, rtol=0)


def test_cached_equals_naive(model: LlamaForCausalLM) -> None:
    naive = naive_cross_score(model, ROWS)
    assert naive.prompts == [tuple(X1), tuple(X2), tuple(X3), tuple(X4)]
    assert naive.prompt_index.tolist() == [0, 0, 1, 2, 3, 1, 2]
    assert naive.num_tokens.tolist() == [3, 1, 6, 3, 2, 1, 5]
    assert naive.logp_sum.shape == (7, 4)
    assert bool((naive.logp_sum < 0).all())
    _assert_same(cross_score(model, ROWS), naive)
    _assert_same(cross_score(model, ROWS, common_prefix=False), naive)
    _assert_same(cross_score(model, ROWS, max_batch_tokens=1), naive)  # every Z alone
    _assert_same(cross_score(model, ROWS, max_batch_tokens=7), naive)  # chunks of 2–3 packed Z
    _assert_same(naive_cross_score(model, ROWS, batch_size=3), naive)


def test_a_single_token_prompt_alone(model: LlamaForCausalLM) -> None:
    rows = [([5], [6]), ([5], [6, 7, 8])]
    _assert_same(cross_score(model, rows), naive_cross_score(model, rows))


def test_tokens_processed(model: LlamaForCausalLM) -> None:
    # Contexts (prompt minus its last token), in sorted order: () 0, SYSTEM+[1] 31, SYSTEM+[1,2] 32,
    # SYSTEM+[4] 31. Sharing prefixes runs 0 + 31 + 1 + 1 = 33 positions; from scratch 31 + 32 + 31 = 94.
    # Distinct reasonings: lengths 3, 1, 6, 3, 2, 5 = 20 positions per column, 4 columns = 80
    # (one row per batch under max_batch_tokens=1, so no padding).
    assert cross_score(model, ROWS, max_batch_tokens=1).tokens_processed == 33 + 80
    assert cross_score(model, ROWS, max_batch_tokens=1, common_prefix=False).tokens_processed == 94 + 80
    # Naive, one pair per forward: Σ_j Σ_r (|x_j| + |z_r|) = 7·(33 + 32 + 32 + 1) + 4·21 = 770.
    assert naive_cross_score(model, ROWS).tokens_processed == 770
    # Packed, the default budget runs each column's six reasonings in one forward, without padding.
    assert cross_score(model, ROWS).tokens_processed == 33 + 80
    assert cross_score(model, ROWS, max_batch_tokens=7).tokens_processed == 33 + 80


def test_token_bound(model: LlamaForCausalLM) -> None:
    # Prefix tree of the prompts: X1 33 nodes, X3 inside X1 0, X2 2 beyond the shared SYSTEM, X4 1 = 36;
    # every row's Z under every column: 4·(3 + 1 + 6 + 3 + 2 + 1 + 5) = 84.
    for scores in (cross_score(model, ROWS), naive_cross_score(model, ROWS)):
        assert scores.token_bound == 36 + 84
    # the cached scorer runs the contexts (prompts minus their last token, which opens every segment)
    # and each distinct Z once per column: never above the bound
    assert cross_score(model, ROWS).tokens_processed <= 120
    assert token_bound([(1, 2, 3)], [4, 4]) == 3 + 8
    # prompts (1,2,3), (1,2,4): prefix tree 1-2-{3,4} = 4 nodes; C = 2 columns; Σ|z| = 2 + 1 + 3 = 6
    assert token_bound([(1, 2, 3), (1, 2, 4)], [2, 1, 3]) == 4 + 2 * 6
    assert (
        token_bound([(1, 2), (1, 2, 3)], []) == 3
    )  # a prompt that is a prefix of another costs nothing more
    assert token_bound([(5,), (1, 2), (1, 3)], []) == 4


def test_scores_feed_mi_metrics(model: LlamaForCausalLM) -> None:
    scores = cross_score(model, ROWS)
    out = mi_metrics(scores.logp_sum, scores.prompt_index, scores.num_tokens)
    assert out["mi_upper_bound"] == pytest.approx(math.log(4))  # four distinct prompts, not seven rows
    assert out["retrieval_chance"] == 0.25


def test_model_mode_is_restored(model: LlamaForCausalLM) -> None:
    model.train()
    try:
        scores = cross_score(model, ROWS[:2])
        assert model.training
    finally:
        model.eval()
    _assert_same(scores, naive_cross_score(model, ROWS[:2]))


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([], "rows is empty"),
        ([([], [1])], "empty prompt"),
        ([([1], [])], "empty reasoning"),
        ([([1], [128])], "outside the model's vocabulary"),
        ([([1], [2], [3])], "pair"),
    ],
)
def test_bad_rows_raise(model: LlamaForCausalLM, rows: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cross_score(model, rows)


def test_bad_budget_raises(model: LlamaForCausalLM) -> None:
    with pytest.raises(ValueError, match="max_batch_tokens"):
        cross_score(model, ROWS, max_batch_tokens=0)
    with pytest.raises(TypeError, match="PreTrainedModel"):
        cross_score(torch.nn.Linear(2, 2), ROWS)  # type: ignore[arg-type]


VOCAB = {
    0: "I",
    1: " think",
    2: "</",  # "</" that is not the tag
    3: "b>",
    4: " go",
    5: "ing</",  # starts the tag
    6: "think>",
    7: "<answer>",
    8: " ok</think><ans",  # holds the whole tag and more
    9: " left",
}


def decode(ids: Sequence[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


@pytest.mark.parametrize(
    ("sampled", "expected"),
    [
        # "I think</b> going</think><answer>": the tag starts inside token 5, which is excluded;
        # the earlier "</" (token 2) is followed by "b>", not a tag, so nothing is cut there.
        ([0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4]),
        ([0, 9, 8, 7], [0, 9]),  # the token holding the tag and more is excluded
        ([6, 0], None),  # "think>I": no tag
        ([0, 1, 2, 3, 9], None),  # unclosed think: no valid Z
        ([5, 6, 7], []),  # the tag opens the sample: valid but empty
        ([], None),
    ],
)
def test_extract_reasoning(sampled: list[int], expected: list[int] | None) -> None:
    assert extract_reasoning(sampled, decode) == expected


def test_qwen_vocabulary_cached_equals_naive(tiny_qwen2, qwen_tokenizer) -> None:
    """Qwen2.5's 151,936-entry vocabulary: real ChatML prompts under the Qwen template and 4 distinct
    reasonings that pack 4 × 95 = 380 positions into a column, and the two columns (caches of one length) in
    one forward, so the head runs on their 760 positions in chunks of 331, 331 and 98 rows
    (``ragen2.algos.logprobs``); the naive scorer computes every pair's full logits at once."""
    from ragen2.agent import ChatRenderer

    renderer = ChatRenderer(qwen_tokenizer, "You walk on a frozen lake. Reach the goal G; avoid holes O.")
    prompts = [
        renderer.first_prompt(f"Turn 1:\nState:\nP _ _\n_ O _\n_ _ G\nYou are at row {r}.") for r in (1, 2)
    ]
    text = "I am at the top left; the goal is two steps down and two to the right, past the hole. " * 6
    z = list(qwen_tokenizer.encode(text, add_special_tokens=False))[:95]
    rows = [(x, z[k:] + z[:k]) for x in prompts for k in (0, 7, 14, 21)]
    naive = naive_cross_score(tiny_qwen2, rows, batch_size=4)
    heads: list[int] = []
    hook = tiny_qwen2.lm_head.register_forward_hook(lambda _m, args, _out: heads.append(args[0].shape[0]))
    cached = cross_score(tiny_qwen2, rows)
    hook.remove()
    # each prompt's cache (its last position's logits only), then both columns' 760 positions in three chunks
    assert heads == [1, 1, 331, 331, 98]
    assert cached.tokens_processed < naive.tokens_processed
    torch.testing.assert_close(cached.logp_sum, naive.logp_sum, atol=1e-3, rtol=1e-5)  # sums of 95 terms ≈ 12
