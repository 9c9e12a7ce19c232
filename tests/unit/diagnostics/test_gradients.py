"""Reward-variance buckets and the norm definitions of the gradient decomposition (pure math)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ragen2.diagnostics.gradients import (
    bucket_names,
    group_reward_variance,
    norm_metrics,
    plot_buckets,
    rv_buckets,
)


def test_group_reward_variance_is_bessel_corrected_per_group() -> None:
    returns = torch.tensor([1.0, 0.0, 1.0, 0.0, 2.0, 2.0, 2.0, 2.0, 3.0, 0.0, 0.0, 0.0, 7.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3])
    var = group_reward_variance(returns, groups)
    # g0: mean 0.5, Σ(x−m)² = 4·0.25 = 1, /3; g1: constant; g2: mean 0.75, 2.25² + 3·0.75² = 6.75, /3 = 2.25;
    # g3: a single sample varies by nothing
    torch.testing.assert_close(var, torch.tensor([1 / 3, 0.0, 2.25, 0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"\[B\]"):
        group_reward_variance(returns[:, None], groups)


def test_quantile_buckets_have_equal_counts_ties_in_group_order() -> None:
    var = torch.tensor([3.0, 0.0, 1.0, 0.0, 2.0, 5.0, 4.0, 0.0])
    # ranks (stable, ties by id): ids 1, 3, 7 (RV 0), 2, 4, 0, 6, 5; rank r goes to bucket ⌊r·6/8⌋ =
    # 0, 0, 1, 2, 3, 3, 4, 5: the three RV-0 groups straddle q1 and q2
    buckets = rv_buckets(var, 6)
    assert [b.tolist() for b in buckets] == [[1, 3], [7], [2], [4, 0], [6], [5]]
    # divisible: 12 groups, 6 buckets of 2, in RV order
    twelve = rv_buckets(torch.arange(12.0).flip(0), 6)
    assert [b.tolist() for b in twelve] == [[11, 10], [9, 8], [7, 6], [5, 4], [3, 2], [1, 0]]
    # fewer groups than buckets: one bucket per group
    assert [b.tolist() for b in rv_buckets(torch.tensor([0.5, 0.1, 0.3]), 6)] == [[1], [2], [0]]
    assert rv_buckets(torch.zeros(0), 6) == []
    assert bucket_names(3) == ["q1", "q2", "q3"]
    with pytest.raises(ValueError, match="num_buckets=0"):
        rv_buckets(var, 0)


def test_norms_divide_the_summed_gradient_by_the_normaliser_samples_and_tokens() -> None:
    # ‖∇S‖ = 6, W = 3 (a sequence-mean: the samples), 3 samples, 12 tokens
    assert norm_metrics("q2", "task", 6.0, 3.0, 3.0, 12.0) == {
        "grad/q2/task": 2.0,
        "grad/q2/task_per_sample": 2.0,
        "grad/q2/task_per_token": 0.5,
    }
    # an empty bucket (no sampled token) divides by 1: its gradient is 0 anyway
    assert norm_metrics("q1", "kl", 0.0, 0.0, 0.0, 0.0)["grad/q1/kl_per_token"] == 0.0


def test_plot_writes_a_png_with_a_panel_per_present_term(tmp_path: Path) -> None:
    metrics = {"grad/all/task": 1.0, "grad/all/entropy": 1e-3}
    for k in range(6):
        metrics |= {
            f"grad/q{k + 1}/task": 0.2 * k,
            f"grad/q{k + 1}/entropy": 1e-3,
            f"grad/q{k + 1}/rv_mean": k,
        }
    png = plot_buckets(metrics, tmp_path / "sub" / "figure.png", "iteration 0")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
