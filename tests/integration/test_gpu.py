"""The GPU path (``gpu``-marked: never in CI; run on a CUDA machine with ``pytest -m gpu``).

One real iteration under ``trainer=gpu`` (bf16-mixed) with HF sampling, whose log-prob gap between the
sampler and the training model stays small (the sampler runs under the trainer's autocast); DDP (NCCL)
and FSDP2 (``trainer=fsdp``) on one device; each phase's peak memory is logged. Throughput and memory
at real sizes come from bench/bench_gpu.py, not from here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize(
    "model",
    [
        "tiny",
        "tiny_qwen2",
        "tiny model/lora=default",
    ],  # SmolLM2's tokenizer; Qwen2.5's; LoRA adapters on bf16
)
def test_one_bf16_iteration_on_gpu(train: Callable, model: str) -> None:
    name, *lora = model.split()
    metrics, _ = train(
        [
            f"model={name}",
            *lora,
            "trainer=gpu",
            "rollout=hf",
            "filter=none",
            "iterations=1",
            "rollout.max_new_tokens=16",
        ]
    )
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    assert metrics["train/optimizer_steps"] >= 1
    # the sampler ran the same bf16 weights as the update's recomputation: bf16 rounding only
    assert metrics["rollout/logprob_gap_max"] < 0.5
    assert metrics["rollout/logprob_gap_abs"] < 0.05
    for phase in ("rollout", "update"):
        assert (
            0
            < metrics[f"perf/{phase}_peak_memory_gb"]
            < torch.cuda.get_device_properties(0).total_memory / 2**30
        )
        assert metrics[f"perf/{phase}_tokens_per_s"] > 0


def test_ddp_over_nccl_on_one_gpu(train: Callable) -> None:
    metrics, _ = train(["trainer=ddp", "trainer.devices=1", "trainer.accelerator=gpu", "iterations=1"])
    assert metrics["train/optimizer_steps"] >= 1


def test_fsdp_on_one_gpu(train: Callable, tmp_path: Path) -> None:
    metrics, cfg = train(
        [
            "trainer=fsdp",
            "trainer.devices=1",
            "trainer.accelerator=gpu",
            "trainer.precision=bf16-mixed",
            "rollout=hf",
            "rollout.max_new_tokens=16",
            "filter=none",
            "iterations=2",
        ]
    )
    assert metrics["train/optimizer_steps"] >= 1
    assert (Path(cfg.run_dir) / "checkpoints" / "last.ckpt").is_file()
    # the sampling copy of the sharded policy samples on the GPU (a peak is logged only for a CUDA phase)
    assert metrics["perf/rollout_peak_memory_gb"] > 0
    assert metrics["rollout/logprob_gap_abs"] < 0.05
