"""A short organism run through ragen2-train (experiment=organism, its shipped warm start): the exact figures
and the unsaturated proxy are logged at the MI pass, success is logged per kind, and the warm start reads its
input (its exact I(X;Z) well above 0, its reasoning almost always grammatical)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from ragen2.config import compose
from ragen2.diagnostics.exact import EXACT_KEYS
from ragen2.train import run


@pytest.mark.slow
def test_an_organism_run_logs_the_exact_figures_and_the_contrast(tmp_path: Path) -> None:
    cfg = compose(
        [
            "experiment=organism",
            "iterations=2",
            "diagnostics.every_n_iterations=1",
            "diagnostics.exact.num_prompts=8",
            "callbacks.curves=null",
        ],
        run_dir=str(tmp_path / "run"),
    )
    metrics = run(cfg)
    assert {f"diag/exact/{k}" for k in EXACT_KEYS} <= set(metrics)
    assert metrics["diag/exact/prompts"] == 8 and metrics["diag/exact/sentences"] == 512
    assert metrics["diag/exact/grammar_mass"] > 0.9  # the warm start writes grammatical reasoning
    # the warm start's reasoning depends on its input: well above 0, below the ceiling log 8
    assert 1.0 < metrics["diag/exact/mi"] <= math.log(8) + 1e-9
    assert metrics["diag/first_turn/contrast"] > 0  # matched beats mismatched
    assert "rollout/success_learnable" in metrics
    with (tmp_path / "run" / "csv" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    passes = [r for r in rows if r.get("diag/exact/mi")]
    assert len(passes) == 2  # iterations 0 and 1
