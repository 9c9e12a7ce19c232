"""ragen2-eval and ragen2-diagnose on a GPU (``gpu``-marked: run on a CUDA machine with ``pytest -m gpu``).

Both take training's ``trainer.*`` keys and place the model there: with the tiny model and the real HF
sampler, the run reports the CUDA device it ran on and its numbers are finite; under ``bf16-mixed`` the
sampling runs under autocast.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from ragen2.config import compose

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_eval_runs_on_the_gpu(tmp_path: Path, precision: str) -> None:
    from ragen2.eval import run

    out = tmp_path / "eval.json"
    overrides = [
        "model=tiny",
        "env=frozenlake",
        "rollout.max_new_tokens=16",
        "num_seeds=4",
        "samples=2",
        "ks=[1,2]",
        "trainer.accelerator=gpu",
        f"trainer.precision={precision}",
        f"output={out}",
    ]
    results = run(compose(overrides, config_name="eval"), overrides)
    written = json.loads(out.read_text())
    assert written["device"] == "cuda:0" and written["precision"] == precision
    assert all(math.isfinite(v) for v in results.values())
    # random weights never close </answer>: every turn is a format penalty, and the run still ends
    assert results["greedy/success"] == 0.0


def test_diagnose_scores_on_the_gpu(tmp_path: Path) -> None:
    from ragen2.diagnose import run

    out = tmp_path / "report"
    overrides = [
        "model=tiny",
        "rollout=scripted",
        "env=sokoban",
        "num_seeds=4",
        "samples=2",
        "trainer.accelerator=gpu",
        f"output={out}",
    ]
    diag = run(compose(overrides, config_name="diagnose"), overrides)
    record = json.loads((out / "metrics.json").read_text())
    assert record["device"].startswith("cuda:0")
    assert math.isfinite(diag.metrics["mi_est"]) and diag.metrics["rows"] >= 4
