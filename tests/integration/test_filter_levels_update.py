"""A real GRPO iteration under the trajectory-level filter (``filter=trajectory``) trains on its kept rows
and on nothing else: the update's sequences and tokens are the kept rows', a dropped row's content does not
touch the gradient, and the update equals one on a batch of the kept rollouts alone (advantages from the
kept rows' group statistics)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from helpers import episode, turn

from ragen2.agent.episode import Episode
from ragen2.config import build, compose, validate
from ragen2.data import RolloutDataModule

# two groups of eight; fraction 0.5 keeps per group the top two and bottom two returns:
#   group 0: 1.0 (s1), 0.9 (s3) … 0.1 (s5), 0.0 (s0)           → samples 0, 1, 3, 5
#   group 1: 0.8 (s3), 0.7 (s6), four 0.4s, 0.0 (s5), −0.2 (s2) → samples 2, 3, 5, 6
RETURNS = [[0.0, 1.0, 0.2, 0.9, 0.5, 0.1, 0.6, 0.3], [0.4, 0.4, -0.2, 0.8, 0.4, 0.0, 0.7, 0.4]]
KEPT = [[0, 1, 3, 5], [2, 3, 5, 6]]


def _sampled(group: int, sample: int, variant: int = 0) -> list[int]:
    gen = torch.Generator().manual_seed(1000 * variant + 10 * group + sample)
    n = int(torch.randint(3, 9, (1,), generator=gen))
    return torch.randint(10, 2000, (n,), generator=gen).tolist()


def _episode(group: int, sample: int, batch_group: int | None = None, variant: int = 0) -> Episode:
    prompt = [11, 12 + group, 13 + 2 * group, 14, 15]
    step = turn(prompt, _sampled(group, sample, variant), reward=RETURNS[group][sample])
    return episode(group if batch_group is None else batch_group, [step], sample=sample)


class FixedEpisodes(RolloutDataModule):
    """The real DataModule (filter, metrics) over the episodes set on ``fixed``."""

    fixed: list[Episode]

    def collect(self, seeds: list[int], sample_seed: int) -> list[Episode]:
        return self.fixed


class Recorder(L.Callback):
    def __init__(self) -> None:
        self.grads: dict[str, torch.Tensor] | None = None
        self.metrics: dict[str, float] = {}

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: Any, optimizer: Any) -> None:
        if self.grads is None:
            self.grads = {
                n: p.grad.detach().clone()
                for n, p in pl_module.policy.named_parameters()
                if p.grad is not None
            }

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        self.metrics = dict(pl_module.last_metrics)
        self.params = {n: p.detach().clone() for n, p in pl_module.policy.named_parameters()}


def _update(tmp_path: Path, name: str, episodes: list[Episode], overrides: Sequence[str]) -> Recorder:
    cfg = compose(
        [
            "model=tiny",
            "rollout=scripted",
            "algo=grpo",
            "algo.mini_batch_size=4",
            "algo.optim.lr=1e-3",
            "iterations=1",
            "diagnostics.enabled=false",
            "trainer.limit_val_batches=0",
            "rollout.groups=2",
            *overrides,
        ],
        run_dir=str(tmp_path / name),
    )
    validate(cfg)
    L.seed_everything(0)
    cfg.data._target_ = f"{FixedEpisodes.__module__}.{FixedEpisodes.__qualname__}"
    datamodule = build(cfg.data)
    datamodule.fixed = episodes
    recorder = Recorder()
    trainer = build(cfg.trainer, callbacks=[recorder], logger=False, enable_checkpointing=False)
    trainer.fit(build(cfg.module), datamodule=datamodule)
    return recorder


def test_the_update_trains_on_the_kept_rows_only(tmp_path: Path) -> None:
    trajectory = ["filter=trajectory", "rollout.group_size=8"]
    batch = [_episode(g, k) for g in range(2) for k in range(8)]
    run = _update(tmp_path, "trajectory", batch, trajectory)
    m = run.metrics
    kept = [ep for ep in batch if ep.sample in KEPT[ep.group]]
    assert m["filter/kept"] == 2 and m["filter/kept_rows"] == 8 and m["filter/kept_row_ratio"] == 0.5
    # the update forwards exactly the kept rows (one epoch) in 8 / mini_batch_size 4 = 2 steps
    assert m["perf/update_tokens"] == sum(len(ep.token_ids) for ep in kept)
    assert m["train/optimizer_steps"] == 2
    assert run.grads is not None and any(g.abs().sum() > 0 for g in run.grads.values())

    # the dropped rows' tokens changed (their returns, hence the mask, unchanged): the same gradient
    other = [ep if ep.sample in KEPT[ep.group] else _episode(ep.group, ep.sample, variant=1) for ep in batch]
    assert [ep.token_ids for ep in other] != [ep.token_ids for ep in batch]
    changed = _update(tmp_path, "changed", other, trajectory)
    assert changed.grads is not None and changed.grads.keys() == run.grads.keys()
    for n, g in run.grads.items():
        assert torch.equal(changed.grads[n], g), n

    # a batch of the kept rollouts alone, unfiltered, in the same row order: the same update
    alone = _update(tmp_path, "alone", kept, ["filter=none", "rollout.group_size=4"])
    assert alone.metrics["filter/kept_rows"] == 8 and alone.metrics["train/optimizer_steps"] == 2
    assert alone.grads is not None
    for n, g in run.grads.items():
        assert torch.equal(alone.grads[n], g), n
    for n, p in run.params.items():
        assert torch.equal(alone.params[n], p), n
    assert alone.metrics["train/loss"] == pytest.approx(m["train/loss"], rel=0, abs=0)
