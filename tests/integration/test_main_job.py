"""The main job's own config (the README's command 1) for one iteration with the real built-in model."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from ragen2.config import compose
from ragen2.train import run


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_main_job_config_one_iteration_with_the_builtin_model(tmp_path: Path) -> None:
    cfg = compose(["iterations=1", "trainer.limit_val_batches=0"], run_dir=str(tmp_path))
    assert cfg.model.name_or_path == "builtin" and cfg.rollout.sampler._target_.endswith("HFSampler")
    metrics = run(cfg)
    # the real model really sampled: sampler and training log-probs agree on the sampled tokens
    assert metrics["rollout/response_length"] > 0
    assert metrics["rollout/logprob_gap_abs"] < 1e-2
    assert metrics["diag/first_turn/valid_rows"] >= 0
    with (tmp_path / "csv" / "metrics.csv").open() as f:
        header = next(csv.reader(f))
    for ns in ("rollout/", "filter/", "diag/", "time/"):
        assert any(k.startswith(ns) for k in header), ns
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    if metrics["filter/kept"] >= 1:
        assert metrics["train/optimizer_steps"] >= 1 and metrics["train/grad_norm"] > 0
    else:
        assert metrics["filter/skipped"] == 1.0
