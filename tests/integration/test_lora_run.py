"""LoRA through the real loop: a run's checkpoint holds the adapters and their optimizer state, resumes
exactly, and ragen2-eval, -diagnose and -export read it (merged by default, the adapter folder on request)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ragen2.config import compose
from ragen2.errors import ConfigError
from ragen2.models.loading import load_model
from ragen2.models.lora import LoRAConfig, has_adapters
from ragen2.train import run

FAST = (
    "model=tiny",
    "model/lora=default",
    "rollout=scripted",
    "algo.optim.lr=1e-2",
    "algo.entropy_coef=0.0",
    "algo.kl_coef=0.1",  # the reference pass (the base, adapters off) runs every iteration
    "diagnostics.every_n_iterations=1",
    "trainer.limit_val_batches=0",
    "callbacks.curves=null",
)


def _train(run_dir: Path, *overrides: str) -> dict[str, float]:
    return run(compose([*FAST, *overrides], run_dir=str(run_dir)))


@pytest.fixture(scope="module")
def lora_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    metrics = _train(run_dir, "iterations=1")
    assert metrics["train/optimizer_steps"] >= 1 and "diag/first_turn/mi_est" in metrics  # the MI pass ran
    return run_dir / "checkpoints" / "last.ckpt"


def _adapted(ckpt: Path) -> Any:
    """The run's policy rebuilt by hand: the base model, the saved LoRA settings, the saved adapters."""
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    model = LoRAConfig(**state["ragen2"]["model"]["lora"]).attach(load_model("tiny"), "tiny")
    adapters = {
        k.removeprefix("policy."): v for k, v in state["state_dict"].items() if k.startswith("policy.")
    }
    assert not model.load_state_dict(adapters, strict=False).unexpected_keys
    return model.eval()


def _logits(model: Any) -> torch.Tensor:
    ids = torch.tensor([[1, 17, 300, 52, 9, 4001, 77]])
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def test_the_checkpoint_holds_the_adapters_and_their_optimizer_state(lora_ckpt: Path) -> None:
    state = torch.load(lora_ckpt, map_location="cpu", weights_only=True)
    weights = state["state_dict"]
    policy = [k for k in weights if k.startswith("policy.")]
    # 2 layers × 7 projections × (A, B); no frozen base (the config names it), no reference copy
    assert len(policy) == 28 and all(".lora_A.default." in k or ".lora_B.default." in k for k in policy)
    assert not any(k.startswith("ref_policy.") for k in weights)
    (opt,) = state["optimizer_states"]
    shapes = sorted(tuple(s["exp_avg"].shape) for s in opt["state"].values())
    assert shapes == sorted(tuple(weights[k].shape) for k in policy)
    assert state["ragen2"]["model"]["lora"] == {
        "rank": 16,
        "alpha": 32,
        "target_modules": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        "dropout": 0.0,
    }
    moved = [k for k in policy if ".lora_B." in k and weights[k].abs().max() > 0]
    assert moved  # B starts at 0: the update trained it


def test_load_policy_merges_the_adapters_into_a_plain_model(lora_ckpt: Path) -> None:
    from ragen2.models.checkpoint import load_policy

    merged = load_policy("tiny", str(lora_ckpt))
    assert not has_adapters(merged) and not any("lora" in k for k in merged.state_dict())
    torch.testing.assert_close(_logits(merged), _logits(_adapted(lora_ckpt)), rtol=0, atol=1e-5)
    assert float((_logits(merged) - _logits(load_model("tiny"))).abs().max()) > 1e-3


def test_export_writes_the_merged_model_or_the_adapter_folder(lora_ckpt: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ragen2.export import export, main

    main([str(lora_ckpt), str(tmp_path / "merged")])
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in k for k in plain.state_dict())
    torch.testing.assert_close(_logits(plain), _logits(_adapted(lora_ckpt)), rtol=0, atol=1e-5)
    main([str(lora_ckpt), str(tmp_path / "adapter"), "--adapter"])
    files = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= files
    assert "model.safetensors" not in files  # the adapters alone, not the base
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (16, 32, "LORA")
    loaded = PeftModel.from_pretrained(load_model("tiny"), tmp_path / "adapter").eval()
    torch.testing.assert_close(_logits(loaded), _logits(plain), rtol=0, atol=1e-5)
    # a run that trained the whole model has no adapters to write
    state = torch.load(lora_ckpt, map_location="cpu", weights_only=True)
    state["ragen2"]["model"]["lora"] = None
    full = tmp_path / "full.ckpt"
    torch.save(state, full)
    with pytest.raises(
        ValueError, match=r"^--adapter: checkpoint=.* holds no LoRA adapters .*Fix: drop"
    ) as err:
        export(str(full), str(tmp_path / "refused"), adapter=True)
    assert "\n" not in str(err.value) and not (tmp_path / "refused").exists()


def test_eval_and_diagnose_run_the_adapted_policy(lora_ckpt: Path, tmp_path: Path) -> None:
    from ragen2.diagnose import run as diagnose
    from ragen2.diagnostics.cross_scoring import cross_score
    from ragen2.eval import run as evaluate

    out = tmp_path / "eval.json"
    args = [f"checkpoint={lora_ckpt}", "num_seeds=1", "samples=1", "ks=[1]", "oracle=false", f"output={out}"]
    results = evaluate(compose(args, config_name="eval"), overrides=args)
    assert "greedy/success" in results and json.loads(out.read_text())["checkpoint"] == str(lora_ckpt)
    args = [
        f"checkpoint={lora_ckpt}",
        "rollout=scripted",
        "num_seeds=3",
        "samples=2",
        f"output={tmp_path / 'd'}",
    ]
    report = diagnose(compose(args, config_name="diagnose"), args)
    rows = [(r.prompt_ids, r.reasoning_ids) for r in report.rows]
    expected = cross_score(_adapted(lora_ckpt), rows).logp_sum
    torch.testing.assert_close(report.scores.logp_sum, expected, rtol=1e-5, atol=1e-4)


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "csv" / "metrics.csv").open() as f:
        return [r for r in csv.DictReader(f) if r.get("train/iteration")]


@pytest.mark.slow
def test_a_resumed_lora_run_equals_the_run_that_went_on(lora_ckpt: Path, tmp_path: Path) -> None:
    _train(tmp_path / "straight", "iterations=2")
    _train(tmp_path / "resumed", "iterations=2", f"ckpt_path={lora_ckpt}")
    a, b = (
        torch.load(p / "checkpoints" / "last.ckpt", weights_only=True)
        for p in (tmp_path / "straight", tmp_path / "resumed")
    )
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key, value in a["state_dict"].items():
        assert (
            torch.equal(value, b["state_dict"][key])
            if isinstance(value, torch.Tensor)
            else value == b["state_dict"][key]
        ), key
    for mine, theirs in zip(
        a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()
    ):
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    straight, resumed = _rows(tmp_path / "straight")[-1], _rows(tmp_path / "resumed")[-1]
    for key in ("rollout/return", "filter/kept", "train/loss", "train/kl", "train/grad_norm"):
        assert resumed[key] == straight[key], key
    assert float(straight["train/kl"]) > 0  # the second iteration's policy is off the base


def test_a_lora_checkpoint_does_not_continue_as_a_full_model(lora_ckpt: Path, tmp_path: Path) -> None:
    """The resume check builds the configured model with its adapters: without them, the checkpoint's
    adapter tensors are not in the model, one line before anything loads."""
    overrides = [o for o in FAST if o != "model/lora=default"]
    cfg = compose([*overrides, "iterations=2", f"ckpt_path={lora_ckpt}"], run_dir=str(tmp_path / "run"))
    with pytest.raises(
        ConfigError, match=r"holds the weights of another model .*lora_A.* is not in the model"
    ):
        run(cfg)
