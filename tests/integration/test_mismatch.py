"""The sampler–trainer mismatch in a real iteration: a sampler whose temperature is off from the
trainer's shows in ``rollout/logprob_gap_*``, and truncated importance sampling (``algo.tis.cap``)
re-weights its tokens; a matched one shows neither."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.mark.slow
def test_a_sampler_off_from_the_trainer_shows_in_the_metrics_and_the_correction(train: Callable) -> None:
    """The HF sampler draws at temperature 1.0 while the trainer scores at 0.35 (``module.temperature``): a
    real mismatch, as a sampler with other kernels or precision would have, on the tiny model."""
    common = [
        "rollout=hf",
        "rollout.max_new_tokens=8",
        "rollout.groups=2",
        "rollout.group_size=2",
        "max_turns_cap=1",
        "algo.mini_batch_size=4",
        "filter=none",
        "iterations=1",
        "algo.tis.cap=1.2",
    ]
    matched, _ = train(common, name="matched")
    off, _ = train([*common, "module.temperature=0.35"], name="off")
    assert matched["rollout/logprob_gap_k3"] < 1e-6 and matched["rollout/logprob_gap_large_share"] == 0.0
    assert matched["train/tis_weight"] == pytest.approx(1.0, abs=1e-3) and matched["train/tis_capped"] == 0.0
    # sharpening the trainer's distribution moves every token's log-prob: the metrics see it ...
    assert off["rollout/logprob_gap_k3"] > 0.01 and off["rollout/logprob_gap_large_share"] > 0.2
    # ... and the correction re-weights the tokens: importance weights average 1 under the sampler, so
    # the cap shows as tokens held at it and a mean below 1
    assert off["train/tis_capped"] > 0.05 and off["train/tis_weight"] < 0.99
