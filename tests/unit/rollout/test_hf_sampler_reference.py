"""HFSampler against recorded outputs: the same sampled ids, finish reasons, log-probs and entropies for a seed.

``hf_sampler_reference.json`` holds what the sampler of commit 0bbda19 returned for the cases below: the
decode loop that synced every token, checked stop strings by decoding every row's tail every step and
drew with ``torch.multinomial``. The sampler that checks on the host every ``check_every`` steps, draws
``torch.multinomial``'s own exponential race itself and decodes only candidate rows must reproduce them.
The cases cover sampling, greedy, top-k/top-p, stop strings that end most rows early, batches split by
``max_batch_size`` (the generator runs on across chunks) and a second turn on held prefixes.

Re-record (only when the sampling rule itself changes on purpose):
  python tests/unit/rollout/test_hf_sampler_reference.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ragen2.rollout import SamplingParams
from ragen2.rollout.hf import HFSampler

REFERENCE = Path(__file__).with_name("hf_sampler_reference.json")
USERS = [
    "Hi",
    "Push the box onto the target.\n#####\n#P_XO#\n#####",
    "What is 2 + 2? Answer briefly.",
    "Name a colour.",
]
# tiny-model cases: (prompt indices, sampling params, seed, max_batch_size)
CASES: dict[str, tuple[list[int], dict[str, Any], int, int]] = {
    "sample": ([0, 1, 2], dict(max_new_tokens=12, temperature=1.0, stop=()), 11, 64),
    # "e" ends most rows within a few tokens; "th" can span two tokens; greedy repeats ">", so ">>>>" spans four
    "stop_chunked": ([0, 1, 2, 0, 3, 1, 2], dict(max_new_tokens=16, temperature=0.8, stop=("e", "th")), 3, 3),
    "top_k_top_p": ([0, 1, 2, 3], dict(max_new_tokens=10, temperature=1.0, top_k=40, top_p=0.9, stop=("a",)), 5, 64),
    "greedy_stop": ([0, 1, 2, 3], dict(max_new_tokens=10, temperature=0.0, stop=(">>>>", "xyz")), 0, 64),
}  # fmt: skip
TURN2_PARAMS = dict(max_new_tokens=12, temperature=1.0, stop=("o",))


def _enc(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _prompts(tokenizer: Any) -> list[list[int]]:
    out = []
    for u in USERS:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": u}], tokenize=False, add_generation_prompt=True
        )
        out.append(_enc(tokenizer, text + "<think>"))
    return out


def _record(samples: list[Any]) -> list[dict[str, Any]]:
    return [
        {"ids": s.ids, "finish": s.finish_reason, "logprobs": s.logprobs, "entropies": s.entropies}
        for s in samples
    ]


def run_cases(tokenizer: Any, model: Any, **sampler_kwargs: Any) -> dict[str, list[dict[str, Any]]]:
    """Every case's samples; ``sampler_kwargs`` go to each HFSampler (the recorded run passed none)."""
    prompts = _prompts(tokenizer)
    out = {}
    for name, (rows, params, seed, batch) in CASES.items():
        sampler = HFSampler(tokenizer, model, max_batch_size=batch, **sampler_kwargs)
        out[name] = _record(sampler.generate([prompts[i] for i in rows], SamplingParams(**params), seed=seed))
    # a second turn on the held prefixes of the chunked case: each prompt extends its row's first turn
    rows, params, seed, batch = CASES["stop_chunked"]
    sampler = HFSampler(tokenizer, model, max_batch_size=batch, **sampler_kwargs)
    first = sampler.generate([prompts[i] for i in rows], SamplingParams(**params), seed=seed)
    closer = _enc(tokenizer, "<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n<think>")
    nxt = [[*prompts[i], *s.ids, *closer] for i, s in zip(rows, first, strict=True)]
    out["turn2"] = _record(sampler.generate(nxt, SamplingParams(**TURN2_PARAMS), seed=seed + 1))
    return out


def _assert_same(got: dict[str, list[dict[str, Any]]], want: dict[str, list[dict[str, Any]]]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert [r["ids"] for r in got[name]] == [r["ids"] for r in want[name]], name
        assert [r["finish"] for r in got[name]] == [r["finish"] for r in want[name]], name
        for g, w in zip(got[name], want[name], strict=True):
            # a few float32 ulps (~1e-6 near 10): the recording machine's vector kernels (AVX2 or AVX-512)
            # sum in another order than this one's; entropies also sum p·log p with p from the softmax the
            # draw uses rather than exp(log p). The ids above are exact on every machine.
            torch.testing.assert_close(
                torch.tensor(g["logprobs"]), torch.tensor(w["logprobs"]), rtol=0, atol=5e-6
            )
            torch.testing.assert_close(
                torch.tensor(g["entropies"]), torch.tensor(w["entropies"]), rtol=0, atol=2e-5
            )


@pytest.fixture(scope="module")
def reference() -> dict[str, list[dict[str, Any]]]:
    return json.loads(REFERENCE.read_text())


def test_recorded_outputs_are_reproduced(tokenizer, tiny_model, reference) -> None:
    got = run_cases(tokenizer, tiny_model)
    assert any(r["finish"] == "stop" for r in got["stop_chunked"]) and any(
        r["finish"] == "length" for r in got["sample"]
    )
    _assert_same(got, reference)


def test_checking_every_k_steps_changes_nothing(tokenizer, tiny_model, reference) -> None:
    """Rows that stopped keep decoding until the next check, and the generator is wound back to where the
    last row stopped, so a later chunk of the same call draws what it drew before."""
    _assert_same(run_cases(tokenizer, tiny_model, check_every=5), reference)


def test_the_static_decode_step_changes_nothing(tokenizer, tiny_model, reference) -> None:
    """The decode step a CUDA graph records (inputs, mask and cache write position in fixed buffers,
    attention over the whole preallocated cache), run eagerly here."""
    _assert_same(run_cases(tokenizer, tiny_model, check_every=4, decode_step="static"), reference)


def test_the_compiled_static_decode_step_changes_nothing(tokenizer, tiny_model, reference) -> None:
    """``compile=True``: the same step through torch.compile (one compilation for every batch size and cache
    length of the cases, the second turn's included)."""
    _assert_same(run_cases(tokenizer, tiny_model, decode_step="static", compile=True), reference)


if __name__ == "__main__":
    from ragen2.models import load_model, load_tokenizer

    model = load_model("tiny").eval()
    REFERENCE.write_text(json.dumps(run_cases(load_tokenizer("tiny"), model)) + "\n")
    print(f"wrote {REFERENCE}")
