"""HFSampler on a GPU (``gpu``-marked: run on a CUDA machine with ``pytest -m gpu``).

The decode step recorded as a CUDA graph (``decode_step=graph``, the default on CUDA) samples what the
eager step samples: same ids and finish reasons, log-probs to float rounding, across batch chunks,
stop strings and a second turn on held prefixes, also with its forward compiled
(``rollout.sampler.compile``) and with fused projections (``rollout.sampler.fuse_projections``); under the trainer's bf16 autocast it records without falling back.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from ragen2.rollout import SamplingParams
from ragen2.rollout.hf import HFSampler

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _prompts(tokenizer: Any) -> list[list[int]]:
    users = ["Hi", "Push the box onto the target.\n#####\n#P_XO#\n#####", "What is 2 + 2?", "Name a colour."]
    out = []
    for u in users:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": u}], tokenize=False, add_generation_prompt=True
        )
        out.append(list(tokenizer.encode(text + "<think>", add_special_tokens=False)))
    return [out[i] for i in (0, 0, 1, 2, 2, 3, 1)]


def _two_turns(
    tokenizer: Any, model: Any, decode_step: str, compile: bool = False, fuse: bool = False
) -> list[Any]:
    sampler = HFSampler(
        tokenizer, model, max_batch_size=4, decode_step=decode_step, compile=compile, fuse_projections=fuse
    )
    prompts = _prompts(tokenizer)
    first = sampler.generate(prompts, SamplingParams(max_new_tokens=24, temperature=1.0, stop=("e",)), seed=1)
    closer = list(
        tokenizer.encode(
            "<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
        )
    )
    nxt = [[*p, *s.ids, *closer] for p, s in zip(prompts, first, strict=True)]
    second = sampler.generate(nxt, SamplingParams(max_new_tokens=24, temperature=0.7), seed=2)
    return first + second


@pytest.mark.parametrize("fuse", [False, True], ids=["", "fused"])
@pytest.mark.parametrize("compile", [False, True], ids=["", "compiled"])
def test_cuda_graph_step_samples_what_the_eager_step_samples(
    tokenizer, tiny_model, compile: bool, fuse: bool
) -> None:
    model = tiny_model.to("cuda")
    try:
        with warnings.catch_warnings():
            # any warning fails the test (a fallback to eager decoding warns); compiled, only the fallback's,
            # since the compiler warns about unrelated settings (TF32 matmuls)
            warnings.simplefilter("error")
            if compile:
                warnings.filterwarnings("default")
                warnings.filterwarnings("error", message="HFSampler could not record")
            graph = _two_turns(tokenizer, model, "graph", compile, fuse)
        eager = _two_turns(tokenizer, model, "eager")
    finally:
        tiny_model.to("cpu")
    assert [s.ids for s in graph] == [s.ids for s in eager]
    assert [s.finish_reason for s in graph] == [s.finish_reason for s in eager]
    assert {s.finish_reason for s in graph} >= {"stop", "length"}
    for g, e in zip(graph, eager, strict=True):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(e.logprobs), rtol=0, atol=1e-4)


def test_cuda_graph_step_under_bf16_autocast(tokenizer, tiny_model) -> None:
    model = tiny_model.to("cuda")
    try:
        with warnings.catch_warnings(), torch.autocast("cuda", dtype=torch.bfloat16):
            warnings.simplefilter("error")
            graph = _two_turns(tokenizer, model, "graph")
            eager = _two_turns(tokenizer, model, "eager")
    finally:
        tiny_model.to("cpu")
    same = sum(g.ids == e.ids for g, e in zip(graph, eager, strict=True))
    assert same >= len(graph) - 2  # bf16 near-ties may split a row or two
    assert all(torch.isfinite(torch.tensor(s.logprobs)).all() for s in graph)
