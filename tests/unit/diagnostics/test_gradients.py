"""Reward-variance buckets and the norm definitions of the gradient decomposition (pure math)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ragen2.diagnostics.gradients import (
    ALL,
    Bucket,
    GradientPass,
    TermNorm,
    bucket_names,
    group_reward_variance,
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
    assert TermNorm.of(6.0, 3.0, 3.0, 12.0) == TermNorm(norm=2.0, per_sample=2.0, per_token=0.5)
    # an empty bucket (no sampled token) divides by 1: its gradient is 0 anyway
    assert TermNorm.of(0.0, 0.0, 0.0, 0.0).per_token == 0.0
    # a bucket's numbers under their logged names; rv_min and rv_max are a quantile bucket's only
    q2 = Bucket("q2", 1, 3.0, 12.0, 0.5, 0.25, 0.75, {"task": TermNorm.of(6.0, 3.0, 3.0, 12.0)})
    assert q2.as_metrics() == {
        "grad/q2/groups": 1.0,
        "grad/q2/samples": 3.0,
        "grad/q2/tokens": 12.0,
        "grad/q2/rv_mean": 0.5,
        "grad/q2/rv_min": 0.25,
        "grad/q2/rv_max": 0.75,
        "grad/q2/task": 2.0,
        "grad/q2/task_per_sample": 2.0,
        "grad/q2/task_per_token": 0.5,
    }
    everything = Bucket(ALL, 1, 3.0, 12.0, 0.5)
    found = GradientPass(7, (q2,), everything, seconds=1.5)
    assert found.bucket("q2") is q2 and found.bucket(ALL) is everything
    assert "grad/all/rv_min" not in found.as_metrics() and found.as_metrics()["time/gradient_buckets"] == 1.5
    with pytest.raises(KeyError, match="no bucket 'q3'"):
        found.bucket("q3")


def test_plot_writes_a_png_with_a_panel_per_present_term(tmp_path: Path) -> None:
    def norms(task: float) -> dict[str, TermNorm]:
        return {"task": TermNorm(task, task, task), "entropy": TermNorm(1e-3, 1e-3, 1e-3)}

    buckets = tuple(Bucket(f"q{k + 1}", 1, 4.0, 20.0, k, k, k, norms(0.2 * k)) for k in range(6))
    found = GradientPass(0, buckets, Bucket(ALL, 6, 24.0, 120.0, 2.5, norms=norms(1.0)))
    png = plot_buckets(found, tmp_path / "sub" / "figure.png", "iteration 0")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
