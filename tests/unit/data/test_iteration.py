"""One iteration's rollouts without a Trainer (``collect_iteration``): the tiny model sampled through the real
runner and env, the batch built once from the seeds, the filter's choice and the metrics.
tests/integration/test_multirank_iteration.py runs the same on two ranks."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from ragen2.agent.episode import Episode
from ragen2.config import build, compose
from ragen2.data import DynamicSampling, GroupFilter, IterationPlan, collect_iteration
from ragen2.data.batch import KeptShare, collate_episodes
from ragen2.data.iteration import Collect
from ragen2.data.rollout_log import RolloutLog
from ragen2.models.loading import load_model

TENSORS = ("input_ids", "attention_mask", "loss_mask", "turn_index", "sampler_logprobs", "returns")


def _parts(*overrides: str) -> tuple[IterationPlan, Collect]:
    """The run's plan and a fresh ``Collect`` (its own sampler, synced to the tiny model)."""
    data = build(compose(["model=tiny", "rollout.groups=4", "rollout.group_size=4", *overrides]).data)
    data.setup()
    policy = load_model("tiny")
    data.sampler.sync_weights(policy)
    return data.plan(), data.collect


def test_the_batch_is_the_seeds_episodes_with_the_filters_choice(tmp_path: Path) -> None:
    torch.manual_seed(0)
    # one turn of at most 8 tokens per episode: the model's own samples, cheaply
    overrides = (
        "rollout.max_new_tokens=8",
        "max_turns_cap=1",
        "filter=none",
        "filter.trajectory_fraction=0.5",
    )
    plan, collect = _parts(*overrides)
    batch = collect_iteration(1, plan, collect, log=RolloutLog(tmp_path / "rollouts.jsonl"))
    # iteration 1 of seed 0: instances 4..7 (1·groups), sampler seed 104_729; the same episodes again
    _, again = _parts(*overrides)
    episodes: Sequence[Episode] = again([4, 5, 6, 7], 104_729)
    by_hand = collate_episodes(episodes, 4, plan.pad_id, 1)
    for name in TENSORS:
        torch.testing.assert_close(getattr(batch, name), getattr(by_hand, name), equal_nan=True, msg=name)
    assert [(e.seed, e.sample) for e in batch.episodes] == [(e.seed, e.sample) for e in episodes]
    # the filter's choice, made once: every group (filter=none), the 2 extreme rollouts of each
    keep, scores, _ = plan.filter(by_hand)
    assert torch.equal(batch.keep, keep) and torch.equal(batch.group_scores, scores)
    assert torch.equal(batch.keep_rows, plan.filter.rows(by_hand)) and batch.kept_rows.numel() == 8
    assert batch.share == KeptShare(0, 8, 16)
    m = batch.record.as_metrics()
    assert m["filter/kept"] == 4 and m["filter/kept_ratio"] == 1.0
    assert m["filter/kept_rows"] == 8 and m["filter/kept_row_ratio"] == batch.share.ratio == 0.5
    assert m["rollout/return"] == pytest.approx(statistics.fmean(e.episode_return for e in episodes))
    assert m["perf/rollout_tokens"] == sum(e.sampled_tokens for e in episodes) and m["time/rollout"] > 0
    assert (tmp_path / "rollouts.jsonl").read_text().count('"kept": true') == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.keep = keep  # type: ignore[misc]


def test_dynamic_sampling_rounds_and_the_filter_compose() -> None:
    # scripted responses through the real env: round 0 of iteration 1 holds all-equal groups
    plan, collect = _parts("rollout=scripted", "filter=top_p")
    plan = dataclasses.replace(plan, sampling=DynamicSampling(max_rounds=4))
    batch = collect_iteration(1, plan, collect)
    m = batch.record.as_metrics()
    assert m["filter/dynamic_rounds"] >= 2 and m["filter/dynamic_groups_kept"] == 4
    assert m["filter/dynamic_groups_sampled"] == 4 * m["filter/dynamic_rounds"]
    # the SNR filter then chooses among the informative groups, as it would among any batch's
    by_hand = collate_episodes(batch.episodes, 4, plan.pad_id, 1)
    keep, scores, stats = plan.filter(by_hand)
    assert torch.equal(batch.keep, keep) and torch.equal(batch.group_scores, scores)
    assert {k: m[f"filter/{k}"] for k in stats} == stats
    assert batch.share == KeptShare(0, 4 * int(keep.sum()), 16)


def test_nothing_trainable_keeps_the_last_round_and_trains_nothing() -> None:
    plan, collect = _parts("rollout=scripted", "rollout.sampler.responses=[I am not sure what to do here]")
    plan = dataclasses.replace(plan, filter=GroupFilter(), sampling=DynamicSampling(max_rounds=2))
    batch = collect_iteration(0, plan, collect)
    assert batch.num_groups == 4 and not batch.keep.any() and batch.share == KeptShare(0, 0, 16)
    assert batch.record.filter["empty"] == 1 and batch.record.filter["kept_row_ratio"] == 0.0
    # round 1 of iteration 0 (its last): slot 0, instances 2_000_000_011 + 0…3
    assert {e.seed for e in batch.episodes} == set(range(2_000_000_011, 2_000_000_015))
