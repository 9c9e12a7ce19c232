"""HFSampler: seeded sampling, greedy parity with ``model.generate``, exact log-probs, stopping, filtering."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers import ScriptLM

from ragen2.rollout import SamplingParams
from ragen2.rollout.hf import HFSampler, _exponential, _filter_logits

NO_STOP = SamplingParams(max_new_tokens=10, temperature=1.0, stop=())
GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0, stop=())


def _enc(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    """Chat prompts of different lengths (so the batch is left-padded), each ending with the forced <think>."""
    users = ["Hi", "Push the box onto the target.\n#####\n#P_XO#\n#####", "What is 2 + 2? Answer briefly."]
    out = []
    for u in users:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": u}], tokenize=False, add_generation_prompt=True
        )
        out.append(_enc(tokenizer, text + "<think>"))
    assert len({len(p) for p in out}) == len(out)
    return out


@pytest.fixture(scope="module")
def sampler(tokenizer, tiny_model) -> HFSampler:
    return HFSampler(tokenizer, tiny_model)


def _forward_logits(model, prompt: list[int], ids: list[int]) -> torch.Tensor:
    """Logits predicting each of ``ids`` from one unpadded forward over prompt + ids: (len(ids), V)."""
    full = torch.tensor([prompt + ids])
    with torch.no_grad():
        logits = model(input_ids=full).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(ids)]


def test_same_seed_same_samples_and_different_seed_differs(sampler, prompts) -> None:
    a = sampler.generate(prompts, NO_STOP, seed=11)
    b = sampler.generate(prompts, NO_STOP, seed=11)
    c = sampler.generate(prompts, NO_STOP, seed=12)
    assert [s.ids for s in a] == [s.ids for s in b]
    assert [s.logprobs for s in a] == [s.logprobs for s in b]
    assert [s.ids for s in a] != [s.ids for s in c]
    assert all(len(s.ids) == NO_STOP.max_new_tokens or s.finish_reason == "eos" for s in a)


def test_greedy_matches_model_generate_and_ignores_padding(sampler, tiny_model, prompts, tokenizer) -> None:
    batch = sampler.generate(prompts, GREEDY, seed=0)
    again = sampler.generate(prompts, GREEDY, seed=123)  # greedy does not depend on the seed
    one_by_one = [sampler.generate([p], GREEDY, seed=0)[0] for p in prompts]
    assert [s.ids for s in batch] == [s.ids for s in again] == [s.ids for s in one_by_one]
    for p, s in zip(prompts, batch, strict=True):
        out = tiny_model.generate(
            torch.tensor([p]),
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            do_sample=False,
            max_new_tokens=GREEDY.max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )[0, len(p) :].tolist()
        if tokenizer.eos_token_id in out:
            out = out[: out.index(tokenizer.eos_token_id) + 1]
        assert s.ids == out
        assert s.finish_reason == ("eos" if out[-1] == tokenizer.eos_token_id else "length")
    for s, o in zip(batch, one_by_one, strict=True):
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(o.logprobs), atol=1e-4, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_a_full_forward(sampler, tiny_model, prompts, temperature: float) -> None:
    params = SamplingParams(max_new_tokens=8, temperature=temperature, stop=())
    samples = sampler.generate(prompts, params, seed=3)  # batched, left-padded, with a KV cache
    for p, s in zip(prompts, samples, strict=True):
        logp = torch.log_softmax(_forward_logits(tiny_model, p, s.ids) / temperature, dim=-1)
        want = logp.gather(-1, torch.tensor(s.ids)[:, None]).squeeze(-1)
        assert s.logprobs is not None and len(s.logprobs) == len(s.ids)
        torch.testing.assert_close(torch.tensor(s.logprobs), want, atol=1e-4, rtol=0)


def test_greedy_logprobs_are_the_untempered_distribution(sampler, tiny_model, prompts) -> None:
    s = sampler.generate(prompts[:1], GREEDY, seed=0)[0]
    logits = _forward_logits(tiny_model, prompts[0], s.ids)
    assert s.ids == logits.argmax(-1).tolist()
    want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.ids)[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(s.logprobs), want, atol=1e-4, rtol=0)


def test_batch_chunking_does_not_change_greedy_results(tokenizer, tiny_model, prompts) -> None:
    small = HFSampler(tokenizer, tiny_model, max_batch_size=2).generate(prompts, GREEDY, seed=0)
    big = HFSampler(tokenizer, tiny_model).generate(prompts, GREEDY, seed=0)
    assert [s.ids for s in small] == [s.ids for s in big]


@pytest.mark.parametrize(("top_k", "top_p"), [(1, 1.0), (0, 1e-6)])
def test_top_k_1_or_tiny_top_p_sample_the_argmax(sampler, prompts, top_k: int, top_p: float) -> None:
    params = SamplingParams(
        max_new_tokens=GREEDY.max_new_tokens, temperature=1.0, top_k=top_k, top_p=top_p, stop=()
    )
    greedy = sampler.generate(prompts, GREEDY, seed=0)
    assert [s.ids for s in sampler.generate(prompts, params, seed=1)] == [s.ids for s in greedy]


def test_top_k_samples_stay_in_the_top_k(sampler, tiny_model, prompts) -> None:
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=3, stop=())
    for s, p in zip(sampler.generate(prompts, params, seed=5), prompts, strict=True):
        top3 = _forward_logits(tiny_model, p, s.ids).topk(3, dim=-1).indices
        assert all(t in row.tolist() for t, row in zip(s.ids, top3, strict=True))


@pytest.mark.parametrize("shape", [(1, 7), (128, 998), (3, 5, 11)])
def test_the_race_draws_exponentials_very_floats(shape: tuple[int, ...]) -> None:
    """The CPU race's draws are the floats exponential_ gives from the same generator, call after call (a
    seeded run samples what it always sampled), and leave the generator where exponential_ does."""
    ours, torchs = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    like = torch.empty(shape)
    for _ in range(3):
        drawn = _exponential(like, ours)
        assert drawn.dtype == torch.float32 and drawn.shape == like.shape
        assert torch.equal(drawn, torch.empty_like(like).exponential_(1, generator=torchs))
    assert torch.equal(ours.get_state(), torchs.get_state())


def test_filter_logits_keeps_the_argmax() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 100, generator=gen) * 5
    best = logits.argmax(-1, keepdim=True)
    for top_k, top_p in [(1, 1.0), (5, 1.0), (0, 1e-9), (0, 0.3), (0, 0.9), (7, 0.5)]:
        kept = torch.isfinite(_filter_logits(logits, top_k, top_p))
        assert kept.gather(-1, best).all()
        if top_k:
            assert (kept.sum(-1) <= top_k).all()
    assert (torch.isfinite(_filter_logits(logits, 1, 1.0)).sum(-1) == 1).all()
    assert (torch.isfinite(_filter_logits(logits, 0, 1e-9)).sum(-1) == 1).all()


def test_top_p_is_the_smallest_nucleus_reaching_p() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    # cumulative mass 0.5, 0.8, 0.95, 1.0: p = 0.6 needs two tokens, p = 0.9 three
    assert torch.isfinite(_filter_logits(logits, 0, 0.6)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(_filter_logits(logits, 0, 0.9)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(_filter_logits(logits, 0, 1.0)).all()


def _assert_logprobs_match_forward(model, prompts, samples, temperature: float = 1.0) -> None:
    for p, s in zip(prompts, samples, strict=True):
        logp = torch.log_softmax(_forward_logits(model, p, s.ids) / temperature, dim=-1)
        want = logp.gather(-1, torch.tensor(s.ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(s.logprobs), want, atol=1e-4, rtol=0)


def _next_turn(tokenizer, prompt: list[int], sampled: list[int], user: str) -> list[int]:
    return [
        *prompt,
        *sampled,
        *_enc(tokenizer, f"<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n<think>"),
    ]


def test_prefix_reuse_across_turns_and_groups_is_exact(tokenizer, tiny_model, prompts) -> None:
    """Held keys/values (next turn extends a held sequence; a group's identical prompts) change nothing."""
    params = SamplingParams(max_new_tokens=6, temperature=1.0, stop=())
    group = [prompts[0], prompts[0], prompts[1], prompts[2], prompts[2]]
    reuse, fresh = HFSampler(tokenizer, tiny_model), HFSampler(tokenizer, tiny_model, reuse_prefix=False)
    turn1 = reuse.generate(group, params, seed=1)
    held = list(reuse._held)
    assert held and all(callable(h.held) for h in held)  # cut out of the batch's cache when first asked for
    assert [s.ids for s in turn1] == [s.ids for s in fresh.generate(group, params, seed=1)]
    _assert_logprobs_match_forward(tiny_model, group, turn1)
    nxt = [
        _next_turn(tokenizer, p, s.ids, f"turn two of row {i}") for i, (p, s) in enumerate(zip(group, turn1))
    ]
    before = reuse.tokens_prefilled
    turn2 = reuse.generate(nxt, params, seed=2)
    # only the new tokens were run: the closer, the user message and <think>, plus each row's last sampled id
    assert reuse.tokens_prefilled - before == sum(
        len(n) - len(p) - len(s.ids) + 1 for n, p, s in zip(nxt, group, turn1)
    )
    assert [s.ids for s in turn2] == [s.ids for s in fresh.generate(nxt, params, seed=2)]
    _assert_logprobs_match_forward(tiny_model, nxt, turn2)
    assert not any(callable(h.held) for h in held)  # every row's next turn read its own


def test_in_place_weight_update_drops_held_caches(tokenizer, tiny_model, prompts) -> None:
    """An optimizer step that leaves the first parameter alone (e.g. frozen embeddings) still invalidates."""
    model = copy.deepcopy(tiny_model)
    sampler = HFSampler(tokenizer, model)
    (s1,) = sampler.generate(prompts[:1], GREEDY, seed=0)
    with torch.no_grad():  # layer 0's output feeds every later layer's cached keys/values
        model.model.layers[0].mlp.down_proj.weight.mul_(-3.0)
    nxt = [_next_turn(tokenizer, prompts[0], s1.ids, "again")]
    _assert_logprobs_match_forward(model, nxt, sampler.generate(nxt, GREEDY, seed=0))


def test_sync_weights_drops_held_caches(tokenizer, tiny_model, prompts) -> None:
    other = copy.deepcopy(tiny_model)
    with torch.no_grad():
        other.model.layers[0].mlp.down_proj.weight.mul_(-3.0)
    sampler = HFSampler(tokenizer, tiny_model)
    (s1,) = sampler.generate(prompts[:1], GREEDY, seed=0)
    sampler.sync_weights(other)
    nxt = [_next_turn(tokenizer, prompts[0], s1.ids, "again")]
    _assert_logprobs_match_forward(other, nxt, sampler.generate(nxt, GREEDY, seed=0))


def _script_sampler(tokenizer, scripts: dict[int, list[int]], default: int) -> HFSampler:
    return HFSampler(tokenizer, ScriptLM(len(tokenizer), scripts, default), reuse_prefix=False)


def test_stops_right_after_the_stop_string(tokenizer) -> None:
    vocab = tokenizer.get_vocab()
    start = _enc(tokenizer, " Hello")  # the prompt's last token starts the chain
    reply = _enc(tokenizer, "ok</think><answer>Up</answer>")
    after = _enc(tokenizer, " trailing words")
    sampler = _script_sampler(tokenizer, {start[-1]: [*reply, *after]}, default=vocab["x"])
    s = sampler.generate([start], SamplingParams(max_new_tokens=40, temperature=0.0), seed=0)[0]
    assert s.ids == reply
    assert s.finish_reason == "stop"


def test_stop_string_spelled_one_character_per_token(tokenizer) -> None:
    """``</answer>`` as nine single-character tokens is still a stop, however the model spells it."""
    vocab = tokenizer.get_vocab()
    chars = [vocab[c] for c in "</answer>"]
    assert tokenizer.decode(chars) == "</answer>"
    start = _enc(tokenizer, " Hello")
    reply = [*_enc(tokenizer, "ok</think><answer>Up"), *chars]
    sampler = _script_sampler(tokenizer, {start[-1]: [*reply, *_enc(tokenizer, " more")]}, default=vocab["x"])
    s = sampler.generate([start], SamplingParams(max_new_tokens=40, temperature=0.0), seed=0)[0]
    assert s.ids == reply
    assert s.finish_reason == "stop"


def test_eos_length_and_stop_rows_in_one_batch(tokenizer) -> None:
    vocab = tokenizer.get_vocab()
    eos = tokenizer.eos_token_id
    p_stop, p_eos, p_len = [vocab["A"]], [vocab["B"]], [vocab["C"]]
    stop_reply = _enc(tokenizer, "a</think><answer>Up</answer>")
    eos_reply = [vocab["y"], vocab["z"], eos]
    sampler = _script_sampler(
        tokenizer,
        {p_stop[-1]: [*stop_reply, vocab["q"]], p_eos[-1]: [*eos_reply, vocab["q"]]},
        default=vocab["x"],  # the "C" row: x, x, x, …: never stops
    )
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    assert len(stop_reply) < params.max_new_tokens
    out = sampler.generate([p_len + p_len, p_stop, p_eos], params, seed=0)
    assert out[0].ids == [vocab["x"]] * 12 and out[0].finish_reason == "length"
    assert out[1].ids == stop_reply and out[1].finish_reason == "stop"
    assert out[2].ids == eos_reply and out[2].finish_reason == "eos"


def test_length_on_the_tiny_model(sampler, prompts, tokenizer) -> None:
    params = SamplingParams(max_new_tokens=4, temperature=1.0, stop=())
    samples = sampler.generate(prompts, params, seed=9)
    assert all(tokenizer.eos_token_id not in s.ids for s in samples)  # a random 49k-way draw, 12 times
    assert [(len(s.ids), s.finish_reason) for s in samples] == [(4, "length")] * len(prompts)


def test_restores_training_mode_and_needs_a_model(tokenizer, tiny_model, prompts) -> None:
    tiny_model.train()
    try:
        HFSampler(tokenizer, tiny_model).generate(prompts[:1], GREEDY, seed=0)
        assert tiny_model.training
    finally:
        tiny_model.eval()
    with pytest.raises(RuntimeError, match="sync_weights"):
        HFSampler(tokenizer).generate(prompts[:1], GREEDY, seed=0)


def test_compile_without_a_fixed_shape_step_is_refused(tokenizer) -> None:
    with pytest.raises(ValueError, match=r"^rollout\.sampler\.compile=true .*decode_step='eager'.*Fix: "):
        HFSampler(tokenizer, decode_step="eager", compile=True)


@pytest.mark.slow
def test_builtin_model_greedy_chat_answers() -> None:
    from ragen2.models import load_model, load_tokenizer

    tok = load_tokenizer("builtin")
    model = load_model("builtin")
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    params = SamplingParams(max_new_tokens=24, temperature=0.0, stop=())
    s = HFSampler(tok, model).generate([_enc(tok, text)], params, seed=0)[0]
    answer = tok.decode(s.ids, skip_special_tokens=True).strip()
    assert answer
    assert "Paris" in answer


@pytest.fixture(scope="module")
def gqa_model(tokenizer):
    """A random 2-layer Llama with grouped-query attention (4 query heads over 2 key/value heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).eval()


def test_grouped_query_model_decodes_exactly(tokenizer, gqa_model, prompts) -> None:
    """The decode path without repeat_kv (grouped_sdpa) on a GQA model: greedy = generate, log-probs = forward."""
    params = SamplingParams(max_new_tokens=8, temperature=0.7, stop=())
    group = [prompts[0], prompts[0], prompts[1], prompts[2]]
    sampler = HFSampler(tokenizer, gqa_model)
    turn1 = sampler.generate(group, params, seed=5)
    _assert_logprobs_match_forward(gqa_model, group, turn1, 0.7)
    nxt = [_next_turn(tokenizer, p, s.ids, "next") for p, s in zip(group, turn1)]
    _assert_logprobs_match_forward(gqa_model, nxt, sampler.generate(nxt, params, seed=6), 0.7)
    (greedy,) = sampler.generate(prompts[1:2], GREEDY, seed=0)
    want = gqa_model.generate(
        torch.tensor(prompts[1:2]), do_sample=False, max_new_tokens=GREEDY.max_new_tokens, pad_token_id=0
    )[0, len(prompts[1]) :].tolist()
    assert greedy.ids == want[: len(greedy.ids)]
    assert gqa_model.config._attn_implementation == "sdpa"  # restored after sampling


def test_preallocated_layer_equals_concatenation_and_writes_at_a_device_position() -> None:
    from ragen2.models.kv import PreallocatedLayer, preallocated_cache, write_at

    torch.manual_seed(0)
    steps = [(torch.randn(2, 3, n, 4), torch.randn(2, 3, n, 4)) for n in (5, 1, 1, 7, 1)]
    layer = PreallocatedLayer(capacity=16)
    for k, v in steps:
        keys, values = layer.update(k, v)
    torch.testing.assert_close(keys, torch.cat([k for k, _ in steps], -2), rtol=0, atol=0)
    torch.testing.assert_close(values, torch.cat([v for _, v in steps], -2), rtol=0, atol=0)
    assert layer.get_seq_length() == 15
    # a recorded step's write: at position 15 (a device tensor), attention sees the whole zero-padded buffer
    k, v = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
    cache = preallocated_cache([None], 0, 16, layers=1)
    cache.layers = [layer]
    with write_at(cache, torch.tensor([15])):
        full_k, full_v = layer.update(k, v)
    assert full_k.shape == full_v.shape == (2, 3, 16, 4) and layer.at is None
    torch.testing.assert_close(full_k[:, :, 15:], k, rtol=0, atol=0)
    torch.testing.assert_close(full_v[:, :, 15:], v, rtol=0, atol=0)
    layer.written(16)
    assert layer.get_seq_length() == 16
    with pytest.raises(ValueError, match="capacity of 16"):
        layer.update(k, v)


def test_preallocated_cache_right_aligns_each_rows_prefix() -> None:
    from ragen2.models.kv import preallocated_cache

    a = [(torch.full((1, 2, 3, 4), 1.0), torch.full((1, 2, 3, 4), 2.0))]  # one layer, 3 positions
    b = [(torch.full((1, 2, 1, 4), 3.0), torch.full((1, 2, 1, 4), 4.0))]  # 1 position
    cache = preallocated_cache([a, None, b], width=3, capacity=8, layers=1)
    layer = cache.layers[0]
    assert layer.get_seq_length() == 3 and layer.buffers[0].shape == (3, 2, 8, 4)
    keys = layer.keys[:, 0, :, 0]  # [rows, positions]
    assert keys.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 3.0]]
    assert (layer.buffers[1][:, :, 3:] == 0).all()  # unwritten room is zero: masked, never NaN


@pytest.mark.parametrize(
    ("tokenizer_fixture", "check_every"),
    [("tokenizer", 1), ("tokenizer", 5), pytest.param("qwen_tokenizer", 5, marks=pytest.mark.slow)],
)
def test_stop_rule_matches_decoding_every_tail(
    request: pytest.FixtureRequest, tokenizer_fixture: str, check_every: int
) -> None:
    """Random scripts of pieces that spell stop strings in many ways (single characters, split UTF-8
    bytes, "</answer>" in one to nine tokens, newlines), under SmolLM2's and Qwen2.5's tokenizers (Qwen's
    ">\n\n" and ">." carry text past the stop): the sampler, which decodes only candidate tokens, stops
    each row where decoding the tail after every token does (``cut_at_stop``, the rule itself)."""
    from ragen2.rollout.vllm import cut_at_stop

    tokenizer = request.getfixturevalue(tokenizer_fixture)

    vocab = tokenizer.get_vocab()
    pieces = [
        *(_enc(tokenizer, t) for t in ["</answer>", "</", "answer", ">", "er>", " </answer>", "\n", "\n\n"]),
        *(_enc(tokenizer, t) for t in ["</answer>\n\n", "</answer>.", ".</think>"]),
        *([vocab[c]] for c in "</answer>x"),
        *(_enc(tokenizer, t) for t in ["😀", "日本", "é", " the", "<answer>Up", "<|im_end|>"]),
        [tokenizer.eos_token_id],
    ]
    gen = torch.Generator().manual_seed(0)
    scripts = {}
    for row in range(64):
        script: list[int] = []
        while len(script) < 40:
            script += pieces[int(torch.randint(len(pieces), (1,), generator=gen))]
        scripts[row] = script
    # row i's prompt ends with id 1000 + i, the key of its script
    sampler = _script_sampler(tokenizer, {1000 + i: s for i, s in scripts.items()}, default=vocab["x"])
    sampler.check_every = check_every
    eos = {tokenizer.eos_token_id}
    for stop in [("</answer>",), ("</answer>", "\n\n"), ("😀", "é"), ("本",), ("r>",)]:
        params = SamplingParams(max_new_tokens=24, temperature=0.0, stop=stop)
        out = sampler.generate([[1000 + i] for i in scripts], params, seed=0)
        finished = 0
        for i, s in enumerate(out):
            want, reason = cut_at_stop(scripts[i][:24], eos, stop, tokenizer.decode, sampler.stop_window)
            assert (s.ids, s.finish_reason) == (want, reason or "length"), (stop, i)
            finished += reason == "stop"
        assert finished >= 8, stop  # the scripts do reach each stop set


def test_stop_candidates_are_the_ids_that_can_end_a_stop_string(tokenizer) -> None:
    from ragen2.rollout.hf import stop_candidates

    vocab = tokenizer.get_vocab()
    table = stop_candidates(tokenizer, ("</answer>",), len(tokenizer))
    assert all(table[vocab[t]] for t in [">", ">,", ">>"])
    assert all(table[i] for i in _enc(tokenizer, "😀"))  # partial UTF-8 bytes: always looked at
    assert not any(table[vocab[t]] for t in ["</", "answer", "<", "x", "Ġthe"])  # never its last piece
    assert 0.001 < table.float().mean() < 0.02  # most steps decode nothing
    assert table is stop_candidates(tokenizer, ("</answer>",), len(tokenizer))  # built once
    wider = stop_candidates(tokenizer, ("</answer>",), len(tokenizer) + 5)
    assert wider[len(tokenizer) :].all()  # ids the tokenizer does not know (a padded vocabulary)


def test_a_new_stop_set_does_not_decode_the_vocabulary_again(tokenizer) -> None:
    """The vocabulary's texts are decoded once per tokenizer; each stop set only reads them."""
    from ragen2.rollout.hf import stop_candidates

    class Counting:  # the tokenizer, counting whole-vocabulary decodes
        def __init__(self) -> None:
            self.batches = 0

        def __len__(self) -> int:
            return len(tokenizer)

        def encode(self, *args, **kwargs):
            return tokenizer.encode(*args, **kwargs)

        def decode(self, *args, **kwargs):
            return tokenizer.decode(*args, **kwargs)

        def batch_decode(self, *args, **kwargs):
            self.batches += 1
            return tokenizer.batch_decode(*args, **kwargs)

    counting = Counting()
    first = stop_candidates(counting, ("</answer>",), len(tokenizer))
    assert counting.batches == 2  # each id alone and after a letter
    second = stop_candidates(counting, ("</answer>", "\n\n"), len(tokenizer))
    assert counting.batches == 2
    # the same tables as a tokenizer decoded afresh gives, and a second stop string only adds candidates
    assert torch.equal(first, stop_candidates(tokenizer, ("</answer>",), len(tokenizer)))
    assert bool((second >= first).all()) and bool((second > first).any())


class CountingTokenizer:
    """The tokenizer, counting ``decode`` calls (the stop rule's per-token cost on the host)."""

    def __init__(self, tokenizer) -> None:
        self.inner, self.decodes = tokenizer, 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def __len__(self) -> int:
        return len(self.inner)

    def decode(self, *args, **kwargs):
        self.decodes += 1
        return self.inner.decode(*args, **kwargs)


def test_stop_strings_are_decoded_only_for_tokens_that_could_end_one(tokenizer, tiny_model, prompts) -> None:
    """A tail is decoded only after an id that could end a stop string (~0.7 % of the vocabulary for
    "</answer>"), not for every row at every step; the samples are those of a plain tokenizer."""
    counting = CountingTokenizer(tokenizer)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, stop=("</answer>",))
    out = HFSampler(counting, tiny_model).generate(prompts, params, seed=4)
    assert [s.ids for s in out] == [
        s.ids for s in HFSampler(tokenizer, tiny_model).generate(prompts, params, seed=4)
    ]
    sampled = sum(len(s.ids) for s in out)
    assert sampled == 3 * 12
    assert counting.decodes <= 2  # 36 draws from a near-uniform 49k-way distribution


@pytest.mark.parametrize("decode_step", ["eager", "static"])
def test_mixed_precision_decoding_across_turns(tokenizer, tiny_model, prompts, decode_step: str) -> None:
    """Under the trainer's bf16 autocast (trainer=gpu), rotary keys come out in fp32 and values in bf16:
    the held caches and the preallocated buffers take both in the autocast dtype, across a group's shared
    prefill and a second turn on held prefixes, with the fixed-shape step (a CUDA graph's) and the eager one.
    (The fixed-shape step once failed here with a dtype mismatch in index_copy_.)"""
    params = SamplingParams(max_new_tokens=6, temperature=1.0, stop=())
    group = [prompts[0], prompts[0], prompts[1]]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sampler = HFSampler(tokenizer, tiny_model, decode_step=decode_step)
        turn1 = sampler.generate(group, params, seed=1)
        nxt = [_next_turn(tokenizer, p, s.ids, "again") for p, s in zip(group, turn1)]
        turn2 = sampler.generate(nxt, params, seed=2)
    for s in turn1 + turn2:
        assert len(s.ids) == 6 and all(math.isfinite(x) for x in s.logprobs)
