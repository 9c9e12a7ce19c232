"""LoRA (``model.lora``): only the adapters train, the reference is the base with them off, a rollout engine
gets the merged weights, the HF sampler samples from the adapted model. The tiny model, CPU, plain torch."""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from helpers import episode, turn

from ragen2.config import build, compose
from ragen2.data.batch import RolloutBatch, collate_episodes
from ragen2.models.loading import load_model
from ragen2.models.lora import LoRAConfig, adapters_off, has_adapters
from ragen2.models.weights import full_named_tensors
from ragen2.modules.policy import PolicyModule
from ragen2.modules.run_state import RunState
from ragen2.modules.update import build_optimizer

LORA = ("model=tiny", "model/lora=default", "algo.entropy_coef=0.0")


def make_module(*overrides: str) -> PolicyModule:
    module = build(compose([*LORA, *overrides]).module)
    module.configure_model()
    return module


def make_batch() -> RolloutBatch:
    """Two groups of four rows, rewards that differ within each group (every row has an advantage)."""
    returns = [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]]
    episodes = [
        episode(g, [turn([11, 12, 13, 14, 20 + g], [100 + 10 * k + t for t in range(3)], reward=r)], sample=k)
        for g, rewards in enumerate(returns)
        for k, r in enumerate(rewards)
    ]
    return collate_episodes(episodes, num_groups=2, pad_id=0)


def own_logp(model: Any, batch: RolloutBatch) -> torch.Tensor:
    """[B, T] log-probs of the sampled tokens from the model's own logits (0 off the loss mask)."""
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    out = torch.zeros_like(batch.loss_mask)
    picked = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    out[:, 1:] = picked * batch.loss_mask[:, 1:]
    return out


def adapted(module: PolicyModule) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(frozen, trained) parameters of the policy by name, cloned."""
    named = [(n, p.detach().clone(), p.requires_grad) for n, p in module.policy.named_parameters()]
    return {n: t for n, t, g in named if not g}, {n: t for n, t, g in named if g}


def nudge_adapters(model: torch.nn.Module) -> None:
    """B starts at 0 (the adapted model is the base): give every B a value, so that the two differ."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))


def test_only_the_adapters_train_and_the_base_stays_bit_identical() -> None:
    module = make_module("algo.optim.lr=1e-2", "algo.mini_batch_size=4", "algo.epochs=2")
    frozen, trained = adapted(module)
    # every targeted projection of both layers: base_layer frozen, lora_A / lora_B trained, nothing else
    assert len(trained) == 2 * 7 * 2 and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert not any("lora" in n for n in frozen)
    assert frozen.keys() >= {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.base_layer.weight"}
    update = module.update
    assert update is not None
    optimizer, scheduler = build_optimizer(module.algo, module.policy, None)
    # the optimizer holds the adapters alone
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {
        id(p) for p in module.policy.parameters() if p.requires_grad
    }
    out = update.run(make_batch(), optimizer, scheduler, torch.Tensor.backward, RunState())
    assert out.steps == 4  # 8 rows in mini-batches of 4, two epochs
    after = dict(module.policy.named_parameters())
    assert all(torch.equal(after[n], t) for n, t in frozen.items())
    # and the base is still the pretrained model, tensor for tensor
    base = load_model("tiny").state_dict()
    for name, tensor in frozen.items():
        assert torch.equal(tensor, base[name.replace(".base_layer", "")]), name
    assert all(not torch.equal(after[n], t) for n, t in trained.items() if ".lora_B." in n)
    assert any(not torch.equal(after[n], t) for n, t in trained.items() if ".lora_A." in n)


def test_the_reference_is_the_base_model_with_the_adapters_off_and_no_second_copy() -> None:
    module = make_module("algo.kl_coef=0.1")
    assert module.ref_policy is None  # no reference model of its own
    assert sum(p.numel() for p in module.parameters()) == sum(p.numel() for p in module.policy.parameters())
    nudge_adapters(module.policy)
    batch = make_batch()
    update = module.update
    assert update is not None
    inputs = update.prepare(batch, torch.arange(8), on_policy=torch.arange(0), kl_reward=None)
    assert inputs.ref_logp is not None
    base = load_model("tiny")  # the pretrained model, loaded on its own
    # fp32 log-probs near -10 (one ulp ~1e-6) from two forward passes: 1.9e-6 apart was seen once in the
    # full suite, rounding; the adapters move them by over 1e-3 (below)
    torch.testing.assert_close(inputs.ref_logp, own_logp(base, batch), rtol=0, atol=1e-5)
    # the policy's own log-probs are the adapted model's, not the base's
    torch.testing.assert_close(inputs.old_logp, own_logp(module.policy, batch), rtol=0, atol=1e-5)
    assert float((inputs.old_logp - inputs.ref_logp).abs().max()) > 1e-3
    # the adapters are on again, and trainable, after the reference pass
    assert float((own_logp(module.policy, batch) - inputs.ref_logp).abs().max()) > 1e-3
    assert all(p.requires_grad for n, p in module.policy.named_parameters() if "lora" in n)
    terms, _ = update.loss_terms(inputs, torch.arange(8))
    assert terms.kl is not None and float(terms.kl) > 0  # the KL term sees a policy off its reference


def test_adapters_off_runs_the_base_model_and_restores_the_flags() -> None:
    model = LoRAConfig(rank=4, alpha=8).attach(load_model("tiny"), "model.name_or_path='tiny'")
    nudge_adapters(model)
    model.model.layers[0].self_attn.q_proj.lora_A.default.weight.requires_grad_(False)  # a frozen adapter
    flags = [p.requires_grad for p in model.parameters()]
    batch = make_batch()
    with adapters_off(model):
        off = own_logp(model, batch)
    torch.testing.assert_close(off, own_logp(load_model("tiny"), batch), rtol=0, atol=1e-6)
    assert [p.requires_grad for p in model.parameters()] == flags
    assert float((own_logp(model, batch) - off).abs().max()) > 1e-3


def test_the_engine_gets_the_merged_weights_peft_itself_would_merge() -> None:
    lora = LoRAConfig(rank=4, alpha=8, target_modules=("q_proj", "v_proj", "down_proj"))
    model = lora.attach(load_model("tiny"), "model.name_or_path='tiny'")
    nudge_adapters(model)
    merged = dict(full_named_tensors(model))
    # PEFT's own merge of a copy: the same names (the plain model's), the same tensors
    wrapped = lora.wrap(load_model("tiny"), "model.name_or_path='tiny'")
    wrapped.get_base_model().load_state_dict(model.state_dict())
    expected = wrapped.merge_and_unload()
    assert merged.keys() == dict(full_named_tensors(expected)).keys()
    for name, tensor in expected.state_dict().items():
        if name in merged:
            assert torch.equal(merged[name], tensor), name
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"],
        load_model("tiny").state_dict()["model.layers.0.self_attn.q_proj.weight"],
    )
    # a plain model of the base architecture loads them and computes what the adapted model computes
    plain = load_model("tiny")
    plain.load_state_dict(merged, strict=False)
    plain.tie_weights()
    batch = make_batch()
    torch.testing.assert_close(own_logp(plain, batch), own_logp(model, batch), rtol=0, atol=1e-5)


def test_the_hf_sampler_samples_from_the_adapted_model(tokenizer: Any) -> None:
    from ragen2.rollout.base import SamplingParams
    from ragen2.rollout.hf import HFSampler

    module = make_module()
    nudge_adapters(module.policy)
    sampler = HFSampler(tokenizer)
    sampler.sync_weights(module.policy)
    assert sampler.model is module.policy  # same process, same tensors
    prompt = tokenizer.encode("Go left or right?")
    (sample,) = sampler.generate([prompt], SamplingParams(max_new_tokens=6, temperature=1.0), seed=3)
    ids = torch.tensor([prompt + sample.ids])
    mask = torch.ones_like(ids)

    def logp(model: Any) -> torch.Tensor:
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits[0, len(prompt) - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(sample.ids)[:, None]).squeeze(-1)

    assert sample.logprobs is not None
    drawn = torch.tensor(sample.logprobs)
    torch.testing.assert_close(drawn, logp(module.policy), rtol=0, atol=1e-4)
    assert float((drawn - logp(load_model("tiny"))).abs().max()) > 1e-3  # not the base model's


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_the_hf_sampler_can_sample_from_a_merged_copy(tokenizer: Any, autocast: bool) -> None:
    """``rollout.sampler.merge_adapters``: a plain model with the adapters merged samples what the adapted
    model samples, follows an optimizer step, holds no LoRA layer (so its projections can be fused), and is
    built in the autocast dtype; the policy is left as it was."""
    from ragen2.rollout.base import SamplingParams
    from ragen2.rollout.hf import HFSampler

    module = make_module()
    nudge_adapters(module.policy)
    frozen, _ = adapted(module)
    prompts = [tokenizer.encode("Go left or right?"), tokenizer.encode("Which way is the goal from here?")]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, stop=())
    merged = HFSampler(tokenizer, merge_adapters=True, fuse_projections=True)
    merged.sync_weights(module.policy)
    adapters = HFSampler(tokenizer, module.policy)

    def both(seed: int) -> tuple[list[Any], list[Any]]:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return merged.generate(prompts, params, seed), adapters.generate(prompts, params, seed)

    for seed in (0, 1):
        ours, theirs = both(seed)
        copy_model = merged.model
        assert copy_model is not module.policy and not has_adapters(copy_model)
        assert next(copy_model.parameters()).dtype == (torch.bfloat16 if autocast else torch.float32)
        assert merged.fused is not None and merged.fused.groups == 2 * copy_model.config.num_hidden_layers
        if not autocast:  # bf16 weights against fp32 ones under autocast: near-ties may go the other way
            assert [s.ids for s in ours] == [s.ids for s in theirs]
            for a, b in zip(ours, theirs, strict=True):
                torch.testing.assert_close(
                    torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-4
                )
        with torch.no_grad():  # an optimizer step: the adapters move, the copy must follow at the next call
            for name, p in module.policy.named_parameters():
                if "lora_B" in name:
                    p.mul_(-1.0)
    assert merged.model is copy_model  # one copy, refreshed in place
    for name, tensor in adapted(module)[0].items():
        assert torch.equal(frozen[name], tensor), name  # the base did not move
    plain = HFSampler(tokenizer, load_model("tiny"), merge_adapters=True)
    plain.generate(prompts[:1], params, seed=0)
    assert plain.model is plain.policy  # no adapters: nothing to merge, no copy


def test_the_merged_copy_is_written_tensor_by_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refreshing the copy holds a few of the streamed tensors at a time, not all of them: a dict of every
    merged weight was a second full model in the policy's dtype (12 GB more for a 3B fp32 base on a GPU)."""
    from ragen2.models import weights

    module = make_module()
    stream = weights.full_named_tensors
    alive: list[weakref.ref[torch.Tensor]] = []
    held: list[int] = []  # at each tensor, how many of the earlier ones are still referenced

    def watched(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in stream(model):
            held.append(sum(ref() is not None for ref in alive))
            alive.append(weakref.ref(tensor))
            yield name, tensor

    monkeypatch.setattr(weights, "full_named_tensors", watched)
    copy_model = weights.SamplingCopy(merge_adapters=True)(module.policy)
    assert len(held) >= 20 and max(held) <= 2, held  # the consumer's loop variable and the generator's own
    expected = dict(stream(module.policy))
    for name, tensor in copy_model.state_dict().items():
        torch.testing.assert_close(tensor, expected.get(name, tensor), rtol=0, atol=0, msg=name)


def test_gradient_checkpointing_gives_the_adapters_the_same_gradients() -> None:
    batch = make_batch()

    def grads(checkpointing: bool) -> dict[str, torch.Tensor]:
        module = make_module(f"model.gradient_checkpointing={str(checkpointing).lower()}")
        nudge_adapters(module.policy)
        update = module.update
        assert update is not None
        inputs = update.prepare(batch, torch.arange(8), on_policy=torch.arange(8), kl_reward=None)
        terms, _ = update.loss_terms(inputs, torch.arange(8))
        terms.total.backward()
        return {n: p.grad.clone() for n, p in module.policy.named_parameters() if p.grad is not None}

    plain, checkpointed = grads(False), grads(True)
    assert len(plain) == 28 and plain.keys() == checkpointed.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_a_critic_under_lora_trains_its_head_and_adapters_never_the_base() -> None:
    # a value head on the shared trunk: the value loss reaches the policy's adapters, not its frozen base
    module = make_module("algo=ppo", "algo.optim.lr=1e-2", "algo.critic.lr=1e-2", "algo.mini_batch_size=8")
    assert module.critic is not None and module.critic.trunk is None
    frozen, _ = adapted(module)
    optimizer, scheduler = build_optimizer(module.algo, module.policy, module.critic)
    policy_group, critic_group = optimizer.param_groups
    assert {id(p) for p in policy_group["params"]} == {
        id(p) for p in module.policy.parameters() if p.requires_grad
    }
    assert [p.shape for p in critic_group["params"]] == [torch.Size([1, 64]), torch.Size([1])]
    head = [p.detach().clone() for p in critic_group["params"]]
    update = module.update
    assert update is not None
    update.run(make_batch(), optimizer, scheduler, torch.Tensor.backward, RunState())
    after = dict(module.policy.named_parameters())
    assert all(torch.equal(after[n], t) for n, t in frozen.items())
    assert any(not torch.equal(p, h) for p, h in zip(critic_group["params"], head))
    # a separate trunk gets adapters of its own: only they and the head train
    separate = make_module("algo=ppo", "algo/critic=separate")
    assert separate.critic is not None and has_adapters(separate.critic)
    trained = [n for n, p in separate.critic.named_parameters() if p.requires_grad]
    assert trained and all(".lora_" in n or n.startswith("head.") for n in trained)


def test_the_default_trains_the_whole_model_with_a_frozen_copy_as_reference() -> None:
    module = build(compose(["model=tiny", "algo.kl_coef=0.1"]).module)
    module.configure_model()
    assert module.model_cfg.lora is None and not has_adapters(module.policy)
    assert all(p.requires_grad for p in module.policy.parameters())
    assert module.ref_policy is not None and module.ref_policy is not module.policy
    assert module._frozen_keys() and all(k.startswith("ref_policy.") for k in module._frozen_keys())


def test_lora_settings_are_checked_one_line_each() -> None:
    cases = [
        ({"rank": 0}, r"^model\.lora\.rank=0 is out of range: it must be ≥ 1\. Fix: model\.lora\.rank=16$"),
        (
            {"alpha": -1},
            r"^model\.lora\.alpha=-1 is out of range: it must be > 0\. Fix: model\.lora\.alpha=32",
        ),
        ({"dropout": 1.0}, r"^model\.lora\.dropout=1\.0 is out of range: it must be in \[0, 1\)\. Fix"),
        ({"dropout": -0.1}, r"^model\.lora\.dropout=-0\.1 is out of range"),
        ({"target_modules": []}, r"^model\.lora\.target_modules=\[\] names no layer.*Fix"),
    ]
    for values, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            LoRAConfig(**values)
        assert "\n" not in str(err.value)
    model = copy.deepcopy(load_model("tiny"))
    for entry, said in (
        ("qkv", "matches no module"),
        ("lm_head", "matches lm_head, not one of the decoder's"),
    ):
        with pytest.raises(
            ValueError, match=rf"'{entry}' {said}.*Fix: .*\[down_proj,gate_proj,k_proj,"
        ) as err:
            LoRAConfig(target_modules=("q_proj", entry)).attach(model, "model.name_or_path='tiny'")
        assert "\n" not in str(err.value)
    assert not has_adapters(model)  # refused before anything was injected


def test_adapters_over_a_half_precision_base_train_in_fp32() -> None:
    model = LoRAConfig(rank=4).attach(load_model("tiny", "bfloat16"), "model.name_or_path='tiny'")
    dtypes = {(".lora_" in n, p.dtype) for n, p in model.named_parameters()}
    assert dtypes == {(True, torch.float32), (False, torch.bfloat16)}
    batch = make_batch()
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logits.float().logsumexp(-1).mean().backward()
    assert all(
        p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters() if p.requires_grad
    )
