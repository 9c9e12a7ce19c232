"""Group- and row-level filtering in the batch, the config object and the DataModule: which rows the update
gets, the filter/* row counts over every rank, and the saved rollouts' ``kept`` flags."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import episode, turn

from ragen2.data import GroupFilter, RolloutDataModule, collate_episodes
from ragen2.data.batch import RolloutBatch, by_group, ungroup
from ragen2.data.iteration import collect_iteration
from ragen2.distributed import Ranks
from ragen2.errors import ConfigError
from ragen2.rollout.scripted import DEFAULT_RESPONSES, ScriptedSampler

ENV = {"id": "ragen2/FrozenLake-v0", "max_turns": 3, "max_actions_per_turn": 3}


def _batch(order: list[tuple[int, int, float]], num_groups: int) -> RolloutBatch:
    """Single-turn episodes (group, sample, return) in the given row order."""
    episodes = [episode(g, [turn([1, 2], [3 + k], reward=r)], sample=k) for g, k, r in order]
    return collate_episodes(episodes, num_groups=num_groups, pad_id=0)


# two groups of four, rows interleaved: row i holds (group, sample, return)
ROWS = [
    (1, 0, 0.5),
    (0, 0, 0.0),
    (1, 1, 2.0),
    (0, 1, 1.0),
    (1, 2, -1.0),
    (0, 2, 0.3),
    (1, 3, 0.7),
    (0, 3, 0.6),
]


def test_ungroup_inverts_by_group() -> None:
    batch = _batch(ROWS, 2)
    grouped = by_group(batch.returns, batch.group_index, 2)
    torch.testing.assert_close(grouped, torch.tensor([[0.0, 1.0, 0.3, 0.6], [0.5, 2.0, -1.0, 0.7]]))
    assert torch.equal(ungroup(grouped, batch.group_index), batch.returns)


def test_trajectory_fraction_keeps_each_groups_extremes_in_row_order() -> None:
    # group 0 (rows 1 3 5 7: returns 0, 1, .3, .6): top 1 at row 3, bottom 0 at row 1
    # group 1 (rows 0 2 4 6: returns .5, 2, −1, .7): top 2 at row 2, bottom −1 at row 4
    batch = _batch(ROWS, 2)
    flt = GroupFilter(strategy="none", trajectory_fraction=0.5)
    keep, _, stats = flt(batch)
    assert keep.all() and stats["kept"] == 2
    batch = dataclasses.replace(batch, keep=keep, keep_rows=flt.rows(batch))
    assert batch.keep_rows.tolist() == [False, True, True, True, True, False, False, False]
    assert batch.kept_rows.tolist() == [1, 2, 3, 4]
    # a dropped group drops its kept rows too; select carries the row mask along
    batch = dataclasses.replace(batch, keep=torch.tensor([True, False]))
    assert batch.kept_rows.tolist() == [1, 3]
    sub = batch.select(torch.tensor([0, 1, 3]))
    assert sub.keep_rows.tolist() == [False, True, True] and sub.kept_rows.tolist() == [1, 2]


def test_group_level_filters_keep_every_row_of_their_groups() -> None:
    batch = _batch(ROWS, 2)
    for flt in (GroupFilter(), GroupFilter(strategy="none"), GroupFilter(strategy="quantile", value=1)):
        assert flt.rows(batch).all()
    assert collate_episodes(batch.episodes, 2, 0).keep_rows.tolist() == [True] * 8


def test_quantile_through_the_config_object() -> None:
    # reward_std per group (Bessel): group 0 of (0, 1, .3, .6) ≈ 0.42, group 1 of (.5, 2, −1, .7) ≈ 1.23
    batch = _batch(ROWS, 2)
    first, _, _ = GroupFilter(strategy="quantile", value=1, bands=2)(batch)
    second, _, _ = GroupFilter(strategy="quantile", value=2, bands=2)(batch)
    assert first.tolist() == [False, True] and second.tolist() == [True, False]


def test_bad_values_are_refused_at_construction() -> None:
    for bad in (0.0, 1.5, -0.5):
        with pytest.raises(ConfigError, match=rf"filter\.trajectory_fraction={bad}: .*Fix"):
            GroupFilter(strategy="none", trajectory_fraction=bad)
    with pytest.raises(ConfigError, match=r"filter\.value=5: quantile"):
        GroupFilter(strategy="quantile", value=5)
    with pytest.raises(ConfigError, match=r"filter\.bands=0: .*Fix: filter\.bands=4"):
        GroupFilter(strategy="quantile", value=1, bands=0)


# ---------------------------------------------------------------- the DataModule, real rollouts


def _dm(flt: GroupFilter, **kw: Any) -> RolloutDataModule:
    return RolloutDataModule(
        env=ENV,
        rollout={
            "sampler": functools.partial(ScriptedSampler, responses=list(DEFAULT_RESPONSES)),
            "groups": 4,
            "group_size": 4,
            "max_new_tokens": 32,
            "save_jsonl": kw.pop("save_jsonl", False),
        },
        tokenizer="tiny",
        filter=flt,
        **kw,
    )


def _expected_rows(batch: RolloutBatch, per_end: int) -> list[int]:
    """Independently: per group, rows by return descending (ties in row order); the first and last
    ``per_end``."""
    rows: list[int] = []
    for g in range(batch.num_groups):
        mine = [i for i in range(len(batch.episodes)) if int(batch.group_index[i]) == g]
        ranked = sorted(mine, key=lambda i: -float(batch.returns[i]))
        rows += ranked[:per_end] + ranked[-per_end:]
    return sorted(rows)


def test_the_datamodules_batch_trains_on_exactly_the_extreme_rows(tmp_path: Path) -> None:
    dm = _dm(GroupFilter(strategy="none", trajectory_fraction=0.5), save_jsonl=True, output_dir=str(tmp_path))
    batch = dm.rollout(0)
    assert len(set(batch.returns.tolist())) > 2, "scripted returns should vary"
    # K = 4, fraction 0.5: the top and the bottom rollout of each of the 4 groups
    assert batch.kept_rows.tolist() == _expected_rows(batch, 1)
    m = batch.record.as_metrics()
    assert m["filter/kept"] == 4 and m["filter/kept_ratio"] == 1.0
    assert m["filter/kept_rows"] == 8 and m["filter/kept_row_ratio"] == 0.5
    # the saved rollouts mark exactly the trained rows as kept
    records = [json.loads(line) for line in (tmp_path / "rollouts.rank0.jsonl").read_text().splitlines()]
    trained = {(batch.episodes[r].seed, batch.episodes[r].sample) for r in batch.kept_rows.tolist()}
    assert {(r["seed"], r["sample"]) for r in records if r["kept"]} == trained
    assert len(records) == 16


def test_group_level_row_counts_are_the_kept_groups(tmp_path: Path) -> None:
    batch = _dm(GroupFilter()).rollout(0)
    m = batch.record.as_metrics()
    assert 0 < m["filter/kept"] < 4
    assert m["filter/kept_rows"] == 4 * m["filter/kept"] == batch.kept_rows.numel()
    assert m["filter/kept_row_ratio"] == m["filter/kept_ratio"]
    assert batch.keep_rows.all()


def test_monitor_trains_on_every_group_and_logs_the_selection() -> None:
    filtered = _dm(GroupFilter()).rollout(0)
    watched = _dm(GroupFilter(monitor=True)).rollout(0)  # the same scripted rollouts
    assert torch.equal(watched.group_scores, filtered.group_scores)
    assert 0 < filtered.record.filter["kept"] < 4  # the filter drops groups here ...
    for key in ("kept", "kept_ratio", "score_mean", "kept_score_mean"):
        assert (
            watched.record.filter[key] == filtered.record.filter[key]
        )  # ... and monitor reports the same choice
    assert watched.keep.all() and watched.kept_rows.numel() == 16  # while every group trains
    assert watched.record.filter["kept_rows"] == 16 and watched.record.filter["kept_row_ratio"] == 1.0


class _Mirror(Ranks):
    """Two ranks holding identical rollouts: every gathered value is this rank's, twice."""

    def gather(self, obj: Any) -> list[Any]:
        return [obj] * self.world

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.world


def test_row_counts_are_over_every_rank() -> None:
    dm = _dm(GroupFilter(strategy="none", trajectory_fraction=0.5))
    dm.setup()
    batch = collect_iteration(0, dm.plan(), dm.collect, _Mirror(0, 2))
    # this rank: 2 of the 4 groups, 8 rows, 2 kept per group
    assert batch.num_groups == 2 and batch.kept_rows.tolist() == _expected_rows(batch, 1)
    m = batch.record.as_metrics()
    assert m["filter/kept"] == 4 and m["filter/kept_rows"] == 8 and m["filter/kept_row_ratio"] == 0.5
