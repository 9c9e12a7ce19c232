"""Fused projections (``rollout.sampler.fuse_projections``): q/k/v and gate/up as one matmul each sample what
the unfused model samples, follow weight changes, leave the model as it was, and leave LoRA layers alone."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ragen2.models.fused import FusedProjections
from ragen2.models.weights import weights_version
from ragen2.rollout import SamplingParams
from ragen2.rollout.hf import HFSampler

PARAMS = SamplingParams(max_new_tokens=8, temperature=1.0, stop=())


def _prompts(tokenizer) -> list[list[int]]:
    users = ["Hi", "Push the box onto the target.\n#####\n#P_XO#\n#####", "What is 2 + 2?"]
    out = [
        list(
            tokenizer.encode(
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": u}], tokenize=False, add_generation_prompt=True
                )
                + "<think>",
                add_special_tokens=False,
            )
        )
        for u in users
    ]
    return [out[0], out[0], out[1], out[2]]


def _next_turn(tokenizer, prompt: list[int], sampled: list[int]) -> list[int]:
    closer = "<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n<think>"
    return [*prompt, *sampled, *tokenizer.encode(closer, add_special_tokens=False)]


def _two_turns(sampler: HFSampler, tokenizer) -> list:
    prompts = _prompts(tokenizer)
    first = sampler.generate(prompts, PARAMS, seed=3)
    nxt = [_next_turn(tokenizer, p, s.ids) for p, s in zip(prompts, first, strict=True)]
    return first + sampler.generate(nxt, PARAMS, seed=4)


def _assert_same(fused: list, plain: list) -> None:
    assert [s.ids for s in fused] == [s.ids for s in plain]
    for f, p in zip(fused, plain, strict=True):
        torch.testing.assert_close(torch.tensor(f.logprobs), torch.tensor(p.logprobs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("decode_step", ["eager", "static"])
@pytest.mark.parametrize("model_name", ["tiny_model", "tiny_qwen2"])  # Llama; Qwen2 with q/k/v biases
def test_fused_samples_what_the_unfused_model_samples(request, model_name: str, decode_step: str) -> None:
    model = request.getfixturevalue(model_name)
    tokenizer = request.getfixturevalue("tokenizer" if model_name == "tiny_model" else "qwen_tokenizer")
    if (
        model_name == "tiny_qwen2"
    ):  # its q/k/v biases are built as zeros: values, or a dropped bias would pass
        model = copy.deepcopy(model)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("_proj.bias"):
                    p.copy_(torch.randn(p.shape, generator=gen))
    fused = HFSampler(tokenizer, model, decode_step=decode_step, fuse_projections=True)
    plain = HFSampler(tokenizer, model, decode_step=decode_step)
    out = _two_turns(fused, tokenizer)
    _assert_same(out, _two_turns(plain, tokenizer))
    assert fused.fused is not None and fused.fused.groups == 2 * model.config.num_hidden_layers
    # the second turn ran on held prefixes, as unfused: only the new tokens were prefilled
    assert fused.tokens_prefilled == plain.tokens_prefilled


def test_the_model_is_left_as_it_was(tokenizer, tiny_model) -> None:
    layer = tiny_model.model.layers[0]
    before = {n: m for n, m in tiny_model.named_modules()}
    version = weights_version(tiny_model)
    sampler = HFSampler(tokenizer, tiny_model, fuse_projections=True)
    sampler.generate(_prompts(tokenizer), PARAMS, seed=0)
    assert dict(tiny_model.named_modules()) == before
    assert type(layer.self_attn.q_proj) is nn.Linear and type(layer.mlp.up_proj) is nn.Linear
    assert weights_version(tiny_model) == version
    # an error inside the block restores the modules too
    fused = FusedProjections()
    with pytest.raises(RuntimeError, match="boom"), fused(tiny_model):
        assert type(layer.self_attn.q_proj) is not nn.Linear
        raise RuntimeError("boom")
    assert dict(tiny_model.named_modules()) == before


def test_fused_weights_follow_in_place_updates_and_a_new_model(tokenizer, tiny_model) -> None:
    model = copy.deepcopy(tiny_model)
    sampler = HFSampler(tokenizer, model, fuse_projections=True)
    prompts = _prompts(tokenizer)
    sampler.generate(prompts, PARAMS, seed=0)
    with torch.no_grad():  # an optimizer step on q and up: the fused copies must be written again
        model.model.layers[0].self_attn.q_proj.weight.mul_(-2.0)
        model.model.layers[1].mlp.up_proj.weight.add_(0.05)
    _assert_same(
        sampler.generate(prompts, PARAMS, seed=1),
        HFSampler(tokenizer, model).generate(prompts, PARAMS, seed=1),
    )
    sampler.sync_weights(tiny_model)  # another model: built for it
    _assert_same(
        sampler.generate(prompts, PARAMS, seed=2),
        HFSampler(tokenizer, tiny_model).generate(prompts, PARAMS, seed=2),
    )


def test_lora_layers_are_not_fused(tokenizer) -> None:
    from ragen2.models.loading import ModelConfig
    from ragen2.models.lora import LoRAConfig

    policy = (
        ModelConfig(name_or_path="tiny", lora=LoRAConfig(target_modules=("q_proj", "v_proj"))).load().eval()
    )
    with torch.no_grad():  # adapters that move the output (B starts at zero)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.1)
    fused = HFSampler(tokenizer, policy, fuse_projections=True)
    out = fused.generate(_prompts(tokenizer), PARAMS, seed=0)
    _assert_same(out, HFSampler(tokenizer, policy).generate(_prompts(tokenizer), PARAMS, seed=0))
    assert fused.fused is not None and fused.fused.groups == policy.config.num_hidden_layers  # gate/up only


@pytest.mark.slow
def test_compiled_fused_step_is_not_compiled_again_after_a_weight_change(tokenizer, tiny_model) -> None:
    """After an optimizer step the compiled fused step runs the new weights without compiling again."""
    from torch._dynamo.utils import counters

    model = copy.deepcopy(tiny_model)
    prompts = _prompts(tokenizer)
    sampler = HFSampler(tokenizer, model, decode_step="static", compile=True, fuse_projections=True)
    _assert_same(
        sampler.generate(prompts, PARAMS, seed=0),
        HFSampler(tokenizer, model).generate(prompts, PARAMS, seed=0),
    )
    graphs = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(-1.0)
    _assert_same(
        sampler.generate(prompts, PARAMS, seed=1),
        HFSampler(tokenizer, model).generate(prompts, PARAMS, seed=1),
    )
    assert counters["stats"]["unique_graphs"] == graphs
