"""DAPO dynamic sampling in the DataModule: real env, real tokenizer, scripted responses (no Trainer)."""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from ragen2.agent.episode import Episode
from ragen2.data import DynamicSampling, GroupFilter, RolloutBatch, RolloutDataModule, collate_episodes
from ragen2.data.batch import by_group
from ragen2.data.sampling import regroup
from ragen2.data.seeds import instance_seeds
from ragen2.errors import ConfigError
from ragen2.rollout.scripted import DEFAULT_RESPONSES, ScriptedSampler

ENV = {"id": "ragen2/FrozenLake-v0", "max_turns": 3, "max_actions_per_turn": 3}
NOT_SURE = "I am not sure what to do here"  # never closes </think>: −0.1 on each of 3 turns, return −0.3
TENSORS = ("input_ids", "attention_mask", "loss_mask", "turn_index", "token_rewards", "turn_rewards")


def _dm(
    responses: Sequence[str] = DEFAULT_RESPONSES, save_jsonl: bool = False, **kw: Any
) -> RolloutDataModule:
    sampler = functools.partial(ScriptedSampler, responses=list(responses))
    return RolloutDataModule(
        env=ENV,
        rollout={
            "sampler": sampler,
            "groups": 4,
            "group_size": 4,
            "max_new_tokens": 32,
            "save_jsonl": save_jsonl,
        },
        tokenizer="tiny",
        filter=kw.pop("filter", GroupFilter(strategy="none")),
        **kw,
    )


def _assert_same(a: RolloutBatch, b: RolloutBatch) -> None:
    for name in (*TENSORS, "returns", "group_index", "keep"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert [(e.seed, e.group, e.sample, e.token_ids) for e in a.episodes] == [
        (e.seed, e.group, e.sample, e.token_ids) for e in b.episodes
    ]


def test_without_sampling_the_batch_is_todays_single_round() -> None:
    dm = _dm()
    batch = dm.rollout(3)
    # seeds: seed·1_000_003 + iteration·groups + rank·local = 12.. ; sampler seed 3·104_729
    assert dm.runner is not None and dm.sampler is not None
    episodes = dm.runner.collect(dm.sampler, [12, 13, 14, 15], 4, sample_seed=3 * 104_729)
    today = collate_episodes(episodes, 4, dm.tokenizer.pad_token_id, 3)
    _assert_same(batch, today)
    assert batch.record.dynamic is None and not any(
        k.startswith("filter/dynamic") for k in batch.record.as_metrics()
    )


def test_round_zero_of_dynamic_sampling_is_todays_round() -> None:
    plain, dynamic = _dm(), _dm(sampling=DynamicSampling(max_rounds=4))
    today = {(e.seed, e.sample): e.token_ids for e in plain.rollout(1).episodes}
    batch = dynamic.rollout(1)
    from_round_zero = [e for e in batch.episodes if e.seed in instance_seeds(0, 1, 4)]
    assert from_round_zero, "round 0 kept no group: pick an iteration where it does"
    for ep in from_round_zero:
        assert ep.token_ids == today[(ep.seed, ep.sample)]


def test_dynamic_sampling_fills_the_batch_with_informative_groups() -> None:
    batch = _dm(sampling=DynamicSampling(max_rounds=4)).rollout(1)
    m = batch.record.as_metrics()
    rounds = m["filter/dynamic_rounds"]
    # with these seeds round 0 holds all-equal groups, so a second round was needed ...
    assert rounds >= 2 and m["filter/dynamic_groups_dropped"] >= 1
    assert m["filter/dynamic_groups_sampled"] == 4 * rounds
    assert m["filter/dynamic_groups_kept"] == 4 and m["filter/dynamic_shortfall"] == 0
    # ... and found more informative groups than were missing: the surplus was cut off
    surplus = m["filter/dynamic_groups_sampled"] - m["filter/dynamic_groups_dropped"] - 4
    assert surplus >= 1
    # exactly `groups` groups, indexed densely, group_size episodes each, sharing one seed
    assert batch.num_groups == 4 and batch.keep.all()
    assert torch.bincount(batch.group_index).tolist() == [4, 4, 4, 4]
    assert [e.group for e in batch.episodes] == batch.group_index.tolist()
    seeds = [{e.seed for e in batch.episodes if e.group == g} for g in range(4)]
    assert all(len(s) == 1 for s in seeds) and len(set.union(*seeds)) == 4
    # no all-equal group reaches the kept rows
    per_group = by_group(batch.returns, batch.group_index, 4)[batch.keep]
    assert ((per_group.max(1).values - per_group.min(1).values) > 1e-6).all()


def test_a_short_batch_trains_on_the_groups_found_and_logs_the_shortfall() -> None:
    # one round only: iteration 1's round 0 holds all-equal groups (see above), so the batch comes up short
    batch = _dm(sampling=DynamicSampling(max_rounds=1)).rollout(1)
    m = batch.record.as_metrics()
    found = int(m["filter/dynamic_groups_kept"])
    assert 1 <= found < 4 and m["filter/dynamic_rounds"] == 1
    assert m["filter/dynamic_shortfall"] == 4 - found and m["filter/dynamic_groups_dropped"] == 4 - found
    # a smaller batch, densely indexed, every group trainable and informative
    assert batch.num_groups == found and batch.keep.all()
    assert torch.bincount(batch.group_index).tolist() == [4] * found
    per_group = by_group(batch.returns, batch.group_index, found)
    assert ((per_group.max(1).values - per_group.min(1).values) > 1e-6).all()


@pytest.mark.parametrize("filter", [GroupFilter(strategy="none"), GroupFilter()], ids=["none", "top_p"])
def test_only_degenerate_groups_log_the_shortfall_and_train_nothing(filter: GroupFilter) -> None:
    dm = _dm([NOT_SURE], sampling=DynamicSampling(max_rounds=3), filter=filter)
    batch = dm.rollout(0)
    m = batch.record.as_metrics()
    assert m["filter/dynamic_rounds"] == 3 and m["filter/dynamic_groups_sampled"] == 12
    assert m["filter/dynamic_groups_dropped"] == 12 and m["filter/dynamic_groups_kept"] == 0
    assert m["filter/dynamic_shortfall"] == 4
    # the module's "kept no group" path: the last round's groups are there, none is kept
    assert batch.kept_rows.numel() == 0 and batch.keep.tolist() == [False] * 4
    assert m["filter/kept"] == 0 and m["filter/empty"] == 1
    assert sorted({e.seed for e in batch.episodes}) == instance_seeds(0, 0, 4, 2, max_rounds=3)
    assert batch.returns.tolist() == pytest.approx([-0.3] * 16)


def test_same_iteration_twice_gives_the_same_batch() -> None:
    a = _dm(sampling=DynamicSampling(max_rounds=4)).rollout(1)
    b = _dm(sampling=DynamicSampling(max_rounds=4)).rollout(1)
    _assert_same(a, b)

    def untimed(metrics: dict[str, float]) -> dict[str, float]:  # seconds and rates vary run to run
        return {k: v for k, v in metrics.items() if not k.startswith("time/") and not k.endswith("_per_s")}

    assert untimed(a.record.as_metrics()) == untimed(b.record.as_metrics())
    perf_a, perf_b = a.record.perf, b.record.perf
    assert perf_a is not None and perf_b is not None and perf_a.tokens == perf_b.tokens > 0


def test_rollout_metrics_and_jsonl_cover_every_round(tmp_path: Path) -> None:
    dm = _dm(sampling=DynamicSampling(max_rounds=4), save_jsonl=True, output_dir=str(tmp_path))
    batch = dm.rollout(1)
    assert batch.record.dynamic is not None
    rounds = batch.record.dynamic.rounds
    records = [json.loads(line) for line in (tmp_path / "rollouts.rank0.jsonl").read_text().splitlines()]
    assert len(records) == rounds * 16 and {r["round"] for r in records} == set(range(rounds))
    assert batch.record.as_metrics()["rollout/return"] == pytest.approx(
        statistics.fmean(r["return"] for r in records)
    )
    kept = {(r["seed"], r["sample"]) for r in records if r["kept"]}
    assert kept == {(e.seed, e.sample) for e in batch.episodes}


def test_dynamic_sampling_validates_max_rounds() -> None:
    with pytest.raises(ValueError, match=r"algo\.sampling\.max_rounds=0 .*Fix"):
        DynamicSampling(max_rounds=0)
    with pytest.raises(ValueError, match=r"algo\.sampling\.max_rounds"):
        _dm(sampling={"max_rounds": -1})
    assert _dm(sampling={"max_rounds": 2}).sampling == DynamicSampling(max_rounds=2)


def test_informative_groups_and_regroup() -> None:
    # spreads 0, 1, 1e-9: only the middle group carries signal at atol 1e-6
    per_group = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.3, 0.3 + 1e-9]], dtype=torch.float64)
    assert DynamicSampling().informative(per_group).tolist() == [False, True, False]
    eps = [
        Episode(env_id="x", seed=10 + g, group=g, sample=k, system_prompt="")
        for g in range(3)
        for k in range(2)
    ]
    out = regroup(eps, [2, 0], first=5)
    assert [(e.seed, e.group, e.sample) for e in out] == [(12, 5, 0), (12, 5, 1), (10, 6, 0), (10, 6, 1)]
    assert [e.group for e in eps] == [0, 0, 1, 1, 2, 2]  # the caller's episodes are untouched


def test_a_resumed_run_writes_each_iteration_of_saved_rollouts_once(tmp_path: Path) -> None:
    first = _dm(save_jsonl=True, output_dir=str(tmp_path))
    first.rollout(0)
    first.rollout(1)  # cut off after this iteration's rollout, before its checkpoint
    resumed = _dm(save_jsonl=True, output_dir=str(tmp_path))  # a requeued job resumes from iteration 1
    resumed.rollout(1)
    resumed.rollout(2)
    records = [json.loads(line) for line in (tmp_path / "rollouts.rank0.jsonl").read_text().splitlines()]
    per_iteration = {i: sum(r["iteration"] == i for r in records) for i in range(3)}
    assert per_iteration == {0: 16, 1: 16, 2: 16}


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"sampling": {"max_round": 2}}, "algo.sampling.max_round=2"),
        ({"shaping": {"penalty": "high"}}, "algo.shaping.penalty"),
    ],
)
def test_a_mistyped_sampling_or_shaping_setting_is_refused_by_name(kw: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        _dm(**kw)
