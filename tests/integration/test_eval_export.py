"""ragen2-eval and ragen2-export on a real checkpoint of the real loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ragen2.config import compose


def test_eval_reports_greedy_sampled_pass_at_k_and_oracle(tmp_path: Path) -> None:
    from ragen2.eval import run

    out = tmp_path / "eval.json"
    cfg = compose(
        ["model=tiny", "rollout=scripted", "num_seeds=4", "samples=4", "ks=[1,2,4]", f"output={out}"],
        config_name="eval",
    )
    results = run(cfg)
    written = json.loads(out.read_text())
    for key in ("greedy/success", "sampled/success", "pass@1", "pass@2", "pass@4", "oracle/success"):
        assert key in results and key in written
    # the solver, through the same agent protocol, solves every generated Sokoban puzzle
    assert results["oracle/success"] == 1.0
    assert 0.0 <= results["pass@1"] <= results["pass@2"] <= results["pass@4"] <= 1.0


def test_export_roundtrip_from_a_trained_checkpoint(train, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragen2.export import main as export_main
    from ragen2.models.checkpoint import load_policy

    _, cfg = train(["iterations=1"])
    ckpt = Path(cfg.run_dir) / "checkpoints" / "last.ckpt"
    out = tmp_path / "exported"
    export_main([str(ckpt), str(out)])  # the base model is the one saved in the checkpoint
    exported = AutoModelForCausalLM.from_pretrained(out)
    trained = load_policy("tiny", str(ckpt))
    for (name, a), (_, b) in zip(exported.state_dict().items(), trained.state_dict().items()):
        assert torch.equal(a, b), name
    assert AutoTokenizer.from_pretrained(out).chat_template is not None


def test_load_policy_rejects_a_mismatched_base(train, tmp_path: Path) -> None:
    from ragen2.models.checkpoint import load_policy

    with pytest.raises(FileNotFoundError, match="checkpoint"):
        load_policy("tiny", str(tmp_path / "missing.ckpt"))
    bogus = tmp_path / "bogus.ckpt"
    torch.save({"state_dict": {"other.weight": torch.zeros(1)}}, bogus)
    with pytest.raises(ValueError, match="no 'policy"):
        load_policy("tiny", str(bogus))


def test_eval_of_a_checkpoint_uses_the_runs_own_settings(train, tmp_path: Path) -> None:
    from ragen2.eval import run

    # a Bandit run (the env's own single turn) with a short token limit and a low temperature
    _, cfg = train(["iterations=1", "env=bandit", "rollout.max_new_tokens=24", "rollout.temperature=0.7"])
    ckpt = Path(cfg.run_dir) / "checkpoints" / "last.ckpt"

    def evaluate(*overrides: str) -> dict:
        out = tmp_path / f"eval{len(overrides)}.json"
        args = [
            f"checkpoint={ckpt}",
            "rollout=scripted",
            "num_seeds=2",
            "samples=2",
            "ks=[1,2]",
            f"output={out}",
            *overrides,
        ]
        eval_cfg = compose(args, config_name="eval")  # eval.yaml's defaults: Sokoban, the built-in model
        run(eval_cfg, overrides=args)
        return json.loads(out.read_text())

    own = evaluate()
    assert (own["env"], own["max_turns"], own["model"]) == ("ragen2/Bandit-v0", 1, "tiny")
    assert own["greedy/turns"] == 1.0  # one turn, as trained (not Sokoban's 5, not the CPU cap of 3)
    assert own["greedy/response_length"] <= 24
    # the command line still wins: another env (its own turn limit), or one key of the run's env
    sokoban = evaluate("env=sokoban")
    assert (sokoban["env"], sokoban["max_turns"]) == ("ragen2/Sokoban-v0", 5)
    assert evaluate("env.max_turns=2")["max_turns"] == 2
