"""A training iteration whose env hangs twice (once in reset, once in step) completes: both episodes are
counted failures, their groups keep every row, the filter, the diagnostics and the update run on."""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from ragen2_envs.sokoban.env import SokobanEnv

from ragen2.data.rollout_config import EnvConfig


class HangsTwice(SokobanEnv):
    """Real Sokoban; (seed 1, sample 2) sleeps in reset and (seed 2, sample 0) spins in its first step."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        rollout = (seed, (options or {}).get("sample", 0))
        self.spins = rollout == (2, 0)
        if rollout == (1, 2):
            time.sleep(3600)
        return super().reset(seed=seed, options=options)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        while self.spins:
            pass
        return super().step(action)


@pytest.mark.slow  # a real training iteration (tiny model)
@pytest.mark.timeout(300)  # without env.step_timeout_s the first hang never returns
def test_an_iteration_with_hung_env_calls_trains_on(train, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(EnvConfig, "make", lambda self: HangsTwice())
    metrics, cfg = train(["env=sokoban", "env.step_timeout_s=0.5", "iterations=1", "rollout.save_jsonl=true"])
    with (Path(cfg.run_dir) / "csv" / "metrics.csv").open() as f:
        (row,) = [r for r in csv.DictReader(f) if r.get("train/iteration")]
    assert float(row["rollout/env_timeouts"]) == 2.0
    assert float(row["train/optimizer_steps"]) >= 1
    assert all(math.isfinite(v) for k, v in metrics.items() if k.startswith("train/"))
    assert "diag/first_turn/mi_est" in row
    records = [
        json.loads(line) for line in (Path(cfg.run_dir) / "rollouts.rank0.jsonl").read_text().splitlines()
    ]
    assert len(records) == 16
    hung = sorted((r["seed"], r["sample"]) for r in records if r["end_reason"] == "env_timeout")
    assert hung == [(1, 2), (2, 0)]
