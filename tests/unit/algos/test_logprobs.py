"""Chunked token log-probs / entropies against hand values and the naive full-vocabulary versions."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaForCausalLM

from ragen2.algos import logprobs
from ragen2.algos.logprobs import LOGIT_BUDGET, chunk_rows_for, masked_mean, sampled_logprobs, token_stats
from ragen2.models.forward import decoder_hidden, lm_head


def test_hand_values() -> None:
    # logits (0, 0): p = (.5, .5) → log p = log .5, H = log 2.
    # logits (0, log 3): p = (.25, .75) → log p(1) = log .75, H = −(.25 log .25 + .75 log .75).
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)]], dtype=torch.float64)
    lp, ent = token_stats(logits, torch.tensor([0, 1]), with_entropy=True)
    torch.testing.assert_close(lp, torch.tensor([math.log(0.5), math.log(0.75)], dtype=torch.float64))
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(ent, torch.tensor([math.log(2.0), h], dtype=torch.float64))


def test_temperature_scales_the_logits() -> None:
    # logits (0, 2 log 3) at T = 2 are (0, log 3): p = (.25, .75), as in the hand values above
    logits = torch.tensor([[0.0, 2 * math.log(3.0)]], dtype=torch.float64)
    lp, _ = token_stats(logits, torch.tensor([1]), temperature=2.0)
    assert lp.item() == pytest.approx(math.log(0.75))
    greedy, _ = token_stats(logits, torch.tensor([1]), temperature=0.0)  # greedy is scored at T = 1
    assert greedy.item() == pytest.approx(math.log(9 / 10))


@pytest.mark.parametrize("checkpointed", [False, True])
@pytest.mark.parametrize("chunk_rows", [1, 3, 4096])
def test_matches_naive_with_gradients(
    chunk_rows: int, checkpointed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 10 rows: chunk 3 leaves a partial last chunk, 4096 is one chunk; 110 logits are checkpointed only below
    # a threshold of 0
    monkeypatch.setattr(
        logprobs, "CHECKPOINT_MIN_LOGITS", 0 if checkpointed else logprobs.CHECKPOINT_MIN_LOGITS
    )
    gen = torch.Generator().manual_seed(4)
    base = torch.randn(10, 11, generator=gen, dtype=torch.float64) * 3
    ids = torch.randint(0, 11, (10,), generator=gen)
    w = torch.randn(10, generator=gen, dtype=torch.float64)  # upstream gradient

    def naive(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp_all = torch.log_softmax(x, -1)
        return logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)

    x_ref = base.clone().requires_grad_(True)
    lp_ref, h_ref = naive(x_ref)
    g_lp_ref = torch.autograd.grad([(lp_ref * w).sum()], [x_ref], retain_graph=True)[0]
    g_h_ref = torch.autograd.grad([(h_ref * w).sum()], [x_ref])[0]

    x = base.clone().requires_grad_(True)
    lp, h = token_stats(x, ids, with_entropy=True, chunk_rows=chunk_rows)
    assert h is not None
    torch.testing.assert_close(lp, lp_ref)
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(torch.autograd.grad([(lp * w).sum()], [x], retain_graph=True)[0], g_lp_ref)
    torch.testing.assert_close(torch.autograd.grad([(h * w).sum()], [x])[0], g_h_ref)


@pytest.mark.parametrize("logits", [99, 100])
def test_a_pass_above_the_threshold_keeps_no_logits_for_the_backward(
    logits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10 rows of a 10-token head: 100 logits. At a threshold of 99 they are checkpointed, so nothing the
    size of the logits is saved for the backward; at 100 the pass keeps them."""
    monkeypatch.setattr(logprobs, "CHECKPOINT_MIN_LOGITS", logits)
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(4, 10)
    hidden = torch.randn(10, 4, generator=gen, requires_grad=True)
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, _ = token_stats(hidden, torch.arange(10), head, with_entropy=True)
    lp.sum().backward()  # the checkpointed chunk recomputes its logits here
    assert (max(saved) >= 100) is (logits == 100)
    assert hidden.grad is not None and head.weight.grad is not None


def test_bfloat16_is_upcast() -> None:
    # bf16 logits give fp32 results equal to the fp32 computation on the same (rounded) logits.
    gen = torch.Generator().manual_seed(5)
    logits = (torch.randn(12, 300, generator=gen) * 5).to(torch.bfloat16)
    ids = torch.randint(0, 300, (12,), generator=gen)
    lp, ent = token_stats(logits, ids, with_entropy=True, chunk_rows=5)
    assert lp.dtype == torch.float32
    want_lp, want_ent = token_stats(logits.float(), ids, with_entropy=True)
    torch.testing.assert_close(lp, want_lp)
    torch.testing.assert_close(ent, want_ent)


def test_no_grad_path_and_errors() -> None:
    logits = torch.zeros(6, 4)
    with torch.no_grad():
        lp, ent = token_stats(logits, torch.zeros(6, dtype=torch.long))
    torch.testing.assert_close(lp, torch.full((6,), math.log(0.25)))
    assert ent is None
    with pytest.raises(ValueError, match="ids"):
        token_stats(logits, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"torch\.long"):
        token_stats(logits, torch.zeros(6, dtype=torch.int32))
    with pytest.raises(ValueError, match="chunk_rows"):
        token_stats(logits, torch.zeros(6, dtype=torch.long), chunk_rows=0)


def test_masked_mean() -> None:
    # Masked entries 1, 3, 4: all → 8/3; rows → (1, 3.5); columns → (2, 4).
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    m = torch.tensor([[1, 0], [1, 1]])
    assert masked_mean(x, m).item() == pytest.approx(8 / 3)
    torch.testing.assert_close(masked_mean(x, m, dim=1), torch.tensor([1.0, 3.5]))
    torch.testing.assert_close(masked_mean(x, m, dim=0), torch.tensor([2.0, 4.0]))
    # Empty mask (or an empty row) → 0, not NaN.
    assert masked_mean(x, torch.zeros(2, 2)).item() == 0.0
    torch.testing.assert_close(
        masked_mean(x, torch.tensor([[0, 0], [1, 1]]), dim=1), torch.tensor([0.0, 3.5])
    )


@pytest.fixture
def model(small_llama: LlamaForCausalLM) -> LlamaForCausalLM:
    return small_llama


def _logprobs(model: LlamaForCausalLM, ids, attn, mask, temperature=1.0, with_entropy=False, chunk_rows=1024):
    hidden = decoder_hidden(model, ids, attn)
    return sampled_logprobs(hidden, ids, mask, lm_head(model), temperature, with_entropy, chunk_rows)


def test_sampled_logprobs_match_full_log_softmax(model: LlamaForCausalLM) -> None:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (3, 12), generator=g)
    attn = torch.ones_like(ids)
    attn[2, 9:] = 0  # right padding
    mask = torch.zeros(3, 12)
    mask[0, 4:8] = 1
    mask[1, 2:3] = 1
    mask[1, 6:11] = 1
    mask[2, 5:9] = 1
    for temperature in (1.0, 0.7):
        logp, ent = _logprobs(model, ids, attn, mask, temperature, with_entropy=True, chunk_rows=3)
        logits = model(input_ids=ids, attention_mask=attn).logits / temperature
        full = torch.log_softmax(logits[:, :-1], -1)
        want = torch.zeros(3, 12)
        want[:, 1:] = full.gather(-1, ids[:, 1:, None]).squeeze(-1)
        want_ent = torch.zeros(3, 12)
        want_ent[:, 1:] = -(full.exp() * full).sum(-1)
        assert torch.allclose(logp, want * mask, atol=1e-5)
        assert torch.allclose(ent, want_ent * mask, atol=1e-5)


def test_sampled_logprobs_gradient_matches_naive(model: LlamaForCausalLM) -> None:
    ids = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(2))
    attn = torch.ones_like(ids)
    mask = torch.zeros(2, 10)
    mask[:, 5:] = 1
    model.zero_grad()
    logp, _ = _logprobs(model, ids, attn, mask, chunk_rows=2)
    logp.sum().backward()
    ours = model.model.layers[0].mlp.up_proj.weight.grad.clone()
    model.zero_grad()
    full = torch.log_softmax(model(input_ids=ids).logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    (full * mask[:, 1:]).sum().backward()
    assert torch.allclose(ours, model.model.layers[0].mlp.up_proj.weight.grad, atol=1e-5)


def _shared_prompt_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded rows: two groups of three rollouts on one prompt each (12 and 10 tokens), one lone row."""
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, 128, (12,), generator=gen), torch.randint(1, 128, (10,), generator=gen)]
    rows = [(prompts[g], int(n)) for g in (0, 1) for n in torch.randint(1, 7, (3,), generator=gen)]
    rows.append((torch.randint(1, 128, (9,), generator=gen), 4))
    width = max(len(p) + n for p, n in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn, loss = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (p, n) in enumerate(rows):
        ids[i, : len(p) + n] = torch.cat([p, torch.randint(1, 128, (n,), generator=gen)])
        attn[i, : len(p) + n] = 1
        loss[i, len(p) : len(p) + n] = 1
    return ids, attn, loss


def _small_llama(attention: str = "sdpa") -> LlamaForCausalLM:
    """A 2-layer float64 Llama with grouped-query attention (4 heads over 2 key-value heads)."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        num_hidden_layers=2,
        attn_implementation=attention,
    )
    return LlamaForCausalLM(config).double()


@pytest.mark.parametrize(
    ("layout", "attention", "checkpointed"),
    [
        ("packed", "sdpa", False),
        ("packed", "eager", False),
        ("packed", "sdpa", True),
        ("cache", "sdpa", False),
    ],
)
def test_shared_prefix_pass_equals_the_plain_pass_with_gradients(
    layout: str, attention: str, checkpointed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """decoder_hidden(share_prefix=True) runs each group's prompt once, in one forward of packed rows or (rows
    wider than ``PACKED_MAX_WIDTH``) on its cached keys and values; hidden states and weight gradients equal
    the plain pass (float64, grouped-query attention, uneven rows, a lone row; SDPA and eager attention; the
    packed layout under gradient checkpointing too)."""
    from ragen2.models import forward
    from ragen2.models.forward import prefix_groups

    passes = {"packed": [], "cache": []}
    for name, fn in (("packed", "packed_prefix_hidden"), ("cache", "shared_prefix_hidden")):
        run = getattr(forward, fn)
        monkeypatch.setattr(forward, fn, lambda *a, run=run, name=name: passes[name].append(1) or run(*a))
    if layout == "cache":
        monkeypatch.setattr(forward, "PACKED_MAX_WIDTH", 16)  # each group's packed row is wider
    torch.manual_seed(0)
    model = _small_llama(attention).train()
    if checkpointed:
        model.gradient_checkpointing_enable()
    ids, attn, _ = _shared_prompt_batch()
    groups = prefix_groups(ids, attn)
    assert [(g.rows, g.length) for g in groups] == [([0, 1, 2], 12), ([3, 4, 5], 10), ([6], 0)]
    upstream = torch.randn(*ids.shape, 64, dtype=torch.float64)  # a loss reading every real position
    results = []
    for share in (False, True):
        model.zero_grad()
        hidden = decoder_hidden(model, ids, attn, share_prefix=share)
        (hidden * upstream)[attn.bool()].sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.model.parameters()])  # the trunk (no LM head)
        results.append((hidden.detach()[attn.bool()], grads))
    (h0, g0), (h1, g1) = results
    assert len(passes[layout]) == 1 and sum(map(len, passes.values())) == 1
    # eager attention takes its softmax in float32 (transformers' eager_attention_forward), over rows of
    # other widths than the plain pass's: float32 rounding
    tol = 1e-10 if attention == "sdpa" else 1e-5
    torch.testing.assert_close(h1, h0, rtol=tol, atol=tol)
    # float64, yet the shared prefix's gradients (summed over its rows) agree only to ~1e-7 of the largest
    # entry: some kernel on this path accumulates in float32; far inside float32 training's own rounding
    torch.testing.assert_close(g1, g0, rtol=1e-6, atol=1e-6 * float(g0.abs().max()))
    assert g0.abs().max() > 0


@pytest.mark.parametrize(("width", "forwards"), [(1024, 1), (16, 2)])
def test_groups_share_their_whole_prompt_rather_than_the_system_prefix_all_rows_share(
    width: int, forwards: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four groups of three rows whose 20-token prompts share a 10-token system prefix: four groups of their
    whole prompt skip 4 × 2 × 19 = 152 tokens, one group of every row 11 × 10 = 110. Packed (each group's
    prompt then its rows' two tokens each: 26 wide), the batch is one forward; on the cache (rows wider than
    ``PACKED_MAX_WIDTH``) the four prompts, of one length, run in one batched forward and the rows' own tokens
    in another; either way the pass equals the plain one."""
    from ragen2.models import forward
    from ragen2.models.forward import prefix_groups

    monkeypatch.setattr(forward, "PACKED_MAX_WIDTH", width)

    torch.manual_seed(0)
    system = list(range(10, 20))
    ids = torch.tensor(
        [[*system, *[30 + g] * 10, 60 + r, 70 + r] for g in range(4) for r in range(3)], dtype=torch.long
    )
    attn = torch.ones_like(ids)
    groups = prefix_groups(ids, attn)
    assert [(g.rows, g.length) for g in groups] == [([3 * g, 3 * g + 1, 3 * g + 2], 20) for g in range(4)]
    model = _small_llama().eval()
    calls: list[int] = []
    hook = model.get_decoder().register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        shared = decoder_hidden(model, ids, attn, share_prefix=True)
    hook.remove()
    assert len(calls) == forwards
    with torch.no_grad():
        plain = decoder_hidden(model, ids, attn, share_prefix=False)
    torch.testing.assert_close(shared, plain, rtol=1e-10, atol=1e-10)


def test_shared_prefix_needs_right_padding() -> None:
    from ragen2.models.forward import prefix_groups

    ids, attn = torch.ones(2, 12, dtype=torch.long), torch.ones(2, 12, dtype=torch.long)
    attn[0, 0] = 0  # left-padded row
    with pytest.raises(ValueError, match="right-padded"):
        prefix_groups(ids, attn)


def test_a_chunk_holds_the_logit_budget_whatever_the_vocabulary() -> None:
    # 1024 · 49152 logits per chunk: 1024 rows of SmolLM2's vocabulary, ⌊50331648 / 151936⌋ = 331 of Qwen2.5's
    assert LOGIT_BUDGET == 1024 * 49152
    assert (chunk_rows_for(49152), chunk_rows_for(151936)) == (1024, 331)
    assert chunk_rows_for(10**9) == 1  # a vocabulary above the budget: one row at a time
    assert chunk_rows_for(998) == 1024  # a small one (the organism's): no more rows than the cache holds
    assert chunk_rows_for(100, budget=250) == 2


def test_qwen_vocabulary_in_budgeted_chunks_equals_one_full_softmax(tiny_qwen2) -> None:
    """Qwen2.5's 151,936 logits per row: 400 rows run as chunks of 331 and 69 by default. Log-probs,
    entropies and the gradients through the head and the trunk equal one unchunked pass and the naive
    full-vocabulary log-softmax (all rows' logits at once)."""
    model = tiny_qwen2
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 151665, (1, 401), generator=gen)
    mask = torch.ones_like(ids)

    def run(chunk_rows: int | None) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], set[int]]:
        model.zero_grad()
        rows: set[int] = set()  # the head's input rows per call (forward, and its recomputation)
        hook = model.lm_head.register_forward_hook(lambda _m, args, _out: rows.add(args[0].shape[0]))
        hidden = decoder_hidden(model, ids, torch.ones_like(ids))
        logp, ent = sampled_logprobs(
            hidden, ids, mask, lm_head(model), with_entropy=True, chunk_rows=chunk_rows
        )
        assert ent is not None
        (logp.sum() + 0.5 * ent.sum()).backward()
        hook.remove()
        grads = [
            p.grad.clone()
            for p in (model.model.embed_tokens.weight, model.model.layers[0].mlp.up_proj.weight)
        ]
        return logp.detach(), ent.detach(), grads, rows

    chunked, whole = run(None), run(400)
    assert (chunked[3], whole[3]) == ({331, 69}, {400})  # no [400, 151936] logits at once by default
    model.zero_grad()
    logits = model(input_ids=ids).logits[:, :-1]  # [1, 400, 151936]: the naive pass
    full = torch.log_softmax(logits, -1)
    want_logp = full.gather(-1, ids[:, 1:, None]).squeeze(-1)
    want_ent = -(full.exp() * full).sum(-1)
    (want_logp.sum() + 0.5 * want_ent.sum()).backward()
    naive_grads = [model.model.embed_tokens.weight.grad, model.model.layers[0].mlp.up_proj.weight.grad]
    for logp, ent, grads, _ in (chunked, whole):
        # log-probs and entropies near log 151936 ≈ 11.9: a few float32 ulps apart
        torch.testing.assert_close(logp[:, 1:], want_logp.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent[:, 1:], want_ent.detach(), atol=1e-5, rtol=1e-5)
        for ours, naive in zip(grads, naive_grads, strict=True):
            torch.testing.assert_close(ours, naive, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(chunked[0], whole[0], atol=1e-5, rtol=1e-5)
    model.zero_grad(set_to_none=True)
