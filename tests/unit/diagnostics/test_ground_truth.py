"""Ground truth for the MI family: two real causal LMs with hand-set weights, through the real cross-scorer.

Both are one-layer Llamas over the same N prompts ``[BOS, S1, S2, P_i, S3, THINK]``: the prompts differ
in the middle and end on the same forced-think token, as the agent's prompts do, so whatever the
reasoning knows about X it must read through attention. Each writes a reasoning of L tokens:

* **grounded**: THINK's query finds the P_i token (its key carries a "prompt token" flag) and copies its
  identity into a context direction; the first reasoning token is uniform over M tokens read from that
  direction (specific to P_i), and every next token is a deterministic successor of the current one.
  So Z is uniform over M sequences of its own input: H(Z|X) = log M, I(X;Z) = H(Z) − H(Z|X) = log N.
* **template**: the attention output is switched off (o_proj = 0), and the first reasoning token is
  uniform over M tokens read from THINK's own identity: M sequences shared by every input.
  H(Z|X) = log M again, I(X;Z) = 0.

Every other query (the reasoning positions included) attends to BOS, whose value is zero.

Tolerance. The designed next-token distributions put a logit gap ≥ 40 nats between the intended tokens
and all others (all others sit at exactly 0), so probability mass leaks only as V·e^−40 < 1e-15 per
position. What remains is float32 arithmetic: log-softmax over logits of magnitude ≤ 60 is exact to a few
ulps of 60 (≈ 4e-6 each), and a sequence sums L = 3 positions and the marginal one more logsumexp over
N columns: |error| < 1e-4 nats on every per-sequence number, which is the tolerance used.

Retrieval: grounded rows score ≈ −(log M + 40) under any other prompt, so each is retrieved (1.0). Under
the template, the scores of a row are bitwise equal across prompts (THINK's state does not depend on X):
ties count against the true prompt (``mi.true_rank``), so retrieval is 0, and a random tie-break would
retrieve 1/N of the rows: chance.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ragen2.diagnostics.cross_scoring import cross_score
from ragen2.diagnostics.mi import mi_metrics, per_token

N, M, L = 4, 3, 3  # prompts, reasoning sequences per policy (per input when grounded), tokens per Z
K = 8  # sampled reasonings per prompt
TOL = 1e-4  # nats: see the module doc

BOS, S1, S2, S3, THINK = 0, 1, 2, 3, 4
P0 = 5  # P_i = P0 + i
R0 = P0 + N  # reasoning tokens


def reasoning_token(source: int, m: int, t: int) -> int:
    """Token t of sequence m; ``source`` is the input i (grounded) or 0 (the shared template)."""
    return R0 + (source * M + m) * L + t


VOCAB = R0 + N * M * L
HIDDEN = 64
# residual dimensions beyond the one-hot token identity (dims 0 … VOCAB − 1)
IS_PROMPT, IS_BOS, ASKS_PROMPT, ASKS_BOS, CONTEXT = VOCAB, VOCAB + 1, VOCAB + 2, VOCAB + 3, VOCAB + 4
# query/key dimensions of the one head: RoPE rotates dims k and k + 32 by theta^(−2k/64) per position;
# at k = 30, 31 with theta = 1e9 that is < 4e-9 rad per position, so these scores ignore position
Q_PROMPT, Q_BOS = 31, 30


def prompt(i: int) -> list[int]:
    return [BOS, S1, S2, P0 + i, S3, THINK]


def build(grounded: bool) -> LlamaForCausalLM:
    assert CONTEXT + N <= HIDDEN
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e9},
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in (model.model.norm, model.model.layers[0].input_layernorm):
            norm.weight.fill_(1.0)
        model.model.layers[0].post_attention_layernorm.weight.fill_(1.0)  # the MLP's output is 0 anyway

        emb = model.model.embed_tokens.weight  # [VOCAB, HIDDEN]
        emb[torch.arange(VOCAB), torch.arange(VOCAB)] = 1.0
        emb[P0 : P0 + N, IS_PROMPT] = 1.0
        emb[BOS, IS_BOS] = 1.0
        emb[:, ASKS_BOS] = 1.0
        emb[THINK, ASKS_BOS], emb[THINK, ASKS_PROMPT] = 0.0, 1.0

        attn = model.model.layers[0].self_attn
        attn.q_proj.weight[Q_PROMPT, ASKS_PROMPT] = 10.0  # scores ≈ 10·4.6·4.6/8 ≈ 27 nats over the rest
        attn.q_proj.weight[Q_BOS, ASKS_BOS] = 10.0
        attn.k_proj.weight[Q_PROMPT, IS_PROMPT] = 1.0
        attn.k_proj.weight[Q_BOS, IS_BOS] = 1.0
        for i in range(N):
            attn.v_proj.weight[i, P0 + i] = 1.0  # only prompt tokens carry a value: P_i's identity
            if grounded:
                attn.o_proj.weight[CONTEXT + i, i] = 10.0

        head = model.lm_head.weight  # [VOCAB, HIDDEN]; logits = head · RMSNorm(residual)
        for source in range(N if grounded else 1):
            for m in range(M):
                first = reasoning_token(source, m, 0)
                head[first, CONTEXT + source if grounded else THINK] = 8.0
                for t in range(1, L):
                    head[reasoning_token(source, m, t), reasoning_token(source, m, t - 1)] = 8.0
    return model


@pytest.fixture(scope="module")
def policies() -> dict[str, LlamaForCausalLM]:
    return {"grounded": build(grounded=True), "template": build(grounded=False)}


def sample(model: LlamaForCausalLM, x: list[int], gen: torch.Generator) -> list[int]:
    """One reasoning of L tokens drawn from the model's own next-token distributions."""
    ids = list(x)
    with torch.no_grad():
        for _ in range(L):
            probs = model(input_ids=torch.tensor([ids])).logits[0, -1].double().softmax(-1)
            ids.append(int(torch.multinomial(probs, 1, generator=gen)))
    return ids[len(x) :]


def test_the_policies_are_what_they_were_built_to_be(policies: dict[str, LlamaForCausalLM]) -> None:
    for name, model in policies.items():
        for i in range(N):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt(i)])).logits[0, -1].double()
            probs = logits.softmax(-1)
            source = i if name == "grounded" else 0
            support = [reasoning_token(source, m, 0) for m in range(M)]
            torch.testing.assert_close(probs[support], torch.full((M,), 1.0 / M, dtype=torch.float64))
            others = logits[[v for v in range(VOCAB) if v not in support]]
            assert bool((logits[support].min() - others.max() >= 40).all()), "logit gap below the design"


def test_mi_separates_what_entropy_cannot(policies: dict[str, LlamaForCausalLM]) -> None:
    gen = torch.Generator().manual_seed(0)
    out, scores = {}, {}
    for name, model in policies.items():
        rows = [(prompt(i), sample(model, prompt(i), gen)) for i in range(N) for _ in range(K)]
        source = (lambda i: i) if name == "grounded" else (lambda i: 0)
        for r, (_, z) in enumerate(rows):  # each Z is one of the M sequences of its source
            first = (z[0] - R0) // L
            assert z == [reasoning_token(source(r // K), first % M, t) for t in range(L)]
        s = cross_score(model, rows)
        scores[name], out[name] = s, mi_metrics(s.logp_sum, s.prompt_index, s.num_tokens)
    grounded, template = out["grounded"], out["template"]

    # H(Z|X) = log M for both (per sequence; per token it is log M / L): entropy cannot tell them apart
    for m in (grounded, template):
        assert m["cond_entropy_seq"] == pytest.approx(math.log(M), abs=TOL)
        assert m["cond_entropy"] == pytest.approx(math.log(M) / L, abs=TOL)
    assert abs(grounded["cond_entropy_seq"] - template["cond_entropy_seq"]) < TOL

    # I(X;Z) = log N vs 0, and so H(Z) = log(M·N) vs log M
    assert grounded["mi_est_seq"] == pytest.approx(math.log(N), abs=TOL)
    assert template["mi_est_seq"] == pytest.approx(0.0, abs=TOL)
    assert grounded["mi_est_seq"] - template["mi_est_seq"] == pytest.approx(math.log(N), abs=2 * TOL)
    assert grounded["mi_upper_bound"] == template["mi_upper_bound"] == pytest.approx(math.log(N))
    assert grounded["reasoning_entropy_seq"] == pytest.approx(math.log(M * N), abs=TOL)
    assert template["reasoning_entropy_seq"] == pytest.approx(math.log(M), abs=TOL)

    # retrieval: 1 vs chance (all ties; counted against the true prompt, so 0 here)
    assert grounded["retrieval_acc"] == 1.0
    assert template["retrieval_acc"] == 0.0 <= template["retrieval_chance"] == 1.0 / N
    tied = scores["template"].logp_sum
    assert bool((tied == tied[:, :1]).all()), "template scores must not depend on the prompt"
    token_scores = per_token(tied, scores["template"].num_tokens)
    top = token_scores.max(dim=1, keepdim=True).values
    expected_random_tiebreak = (1.0 / (token_scores == top).sum(dim=1)).mean()
    assert float(expected_random_tiebreak) == pytest.approx(1.0 / N)
