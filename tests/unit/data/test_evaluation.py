"""Held-out evaluation: pass@k by hand, seeds disjoint from training, one path for eval and validation."""

from __future__ import annotations

import pytest

from ragen2.data.evaluation import heldout_seeds, pass_at_k, validation_metrics


def test_pass_at_k_hand_values() -> None:
    # n = 4, c = 1: pass@1 = 1/4; pass@2 = 1 − C(3,2)/C(4,2) = 1 − 3/6 = 0.5; pass@4 = 1
    one = [[True, False, False, False]]
    assert pass_at_k(one, 1) == pytest.approx(0.25)
    assert pass_at_k(one, 2) == pytest.approx(0.5)
    assert pass_at_k(one, 4) == pytest.approx(1.0)
    # averaged with an all-fail instance: (0.5 + 0)/2
    assert pass_at_k([*one, [False] * 4], 2) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="val.samples"):
        pass_at_k(one, 5)


def test_heldout_seeds_never_meet_training_seeds() -> None:
    # training instance seeds: seed·1,000,003 + iteration·groups…, far below 1e9 for any real run length
    for seed in (0, 1, 7):
        held = heldout_seeds(seed, 64)
        assert len(set(held)) == 64 and min(held) > 10**9
        assert held[:2] == heldout_seeds(seed, 2)  # a prefix: more seeds extend the same set


def test_validation_logs_the_evaluation_numbers() -> None:
    results = {
        "greedy/success": 0.5,
        "greedy/return": 0.4,
        "sampled/success": 0.25,
        "pass@1": 0.25,
        "pass@2": 0.5,
    }
    assert validation_metrics(results) == {
        "val/success": 0.5,
        "val/return": 0.4,
        "val/sampled_success": 0.25,
        "val/pass@1": 0.25,
        "val/pass@2": 0.5,
    }
