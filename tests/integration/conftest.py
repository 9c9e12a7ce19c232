"""Running the real training loop in-process with a composed config."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from omegaconf import DictConfig

from ragen2.config import compose
from ragen2.train import run

# The tiny model and scripted responses (oracle moves, wrong moves, an unclosed <think>) give
# well-formed, differently rewarded episodes in seconds; lr is large so one step visibly moves weights.
# No curves.png at the end: drawing it took about a third of such a run (test_loop.py draws and checks it).
FAST = (
    "model=tiny",
    "rollout=scripted",
    "algo.optim.lr=1e-3",
    "algo.entropy_coef=0.0",
    "diagnostics.every_n_iterations=1",
    "trainer.limit_val_batches=0",
    "callbacks.curves=null",
)
#: the override that puts the end-of-run curves.png back
CURVES = "callbacks.curves={_target_:ragen2.callbacks.CurvesPNG}"


@pytest.fixture
def train(tmp_path: Path) -> Callable[..., tuple[dict[str, float], DictConfig]]:
    def _train(overrides: Sequence[str] = (), name: str = "run") -> tuple[dict[str, float], DictConfig]:
        cfg = compose([*FAST, *overrides], run_dir=str(tmp_path / name))
        return run(cfg), cfg

    return _train
