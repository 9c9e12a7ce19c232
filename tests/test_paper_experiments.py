"""Every ``experiment=paper_*`` measures what the paper's evidence reads: gradients by RV bucket with the MI pass."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate

from ragen2.config import CONF_DIR, compose

PAPER = sorted(p.stem for p in (CONF_DIR / "experiment").glob("paper_*.yaml"))


def test_every_paper_experiment_is_listed() -> None:
    assert PAPER == ["paper_countdown", "paper_frozenlake", "paper_metamathqa", "paper_sokoban"]


@pytest.mark.parametrize("experiment", PAPER)
def test_a_paper_experiment_turns_gradient_buckets_on_at_the_mi_cadence(experiment: str) -> None:
    cfg = compose([f"experiment={experiment}", "model=tiny"])
    buckets = instantiate(cfg.callbacks.gradient_buckets)
    assert buckets.every_n_iterations == cfg.diagnostics.every_n_iterations == 5
    assert buckets.num_buckets == 6  # the paper's six equal-count buckets
