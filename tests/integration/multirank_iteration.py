"""One iteration's rollouts (``collect_iteration``) on this process's rank; launched by test_multirank_iteration.py.

    python tests/integration/multirank_iteration.py <out.pt> [override …]   (RANK, WORLD_SIZE and the rendezvous set)

Scripted responses through the real FrozenLake env and the tiny model's tokenizer; each group is rolled out
with a sampler seed of its own instance seed, so a group's episodes are the same whichever rank holds it.
Writes, for iteration 3 plain and with DAPO's dynamic sampling, the rank's batch: its filter choice, kept share,
metrics and instance seeds, to ``<out.pt>.rank<r>``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

from ragen2.agent.episode import Episode
from ragen2.config import build, compose
from ragen2.data import DynamicSampling, collect_iteration
from ragen2.distributed import Ranks


def run(out: str, overrides: list[str]) -> None:
    settings = ["model=tiny", "rollout=scripted", "rollout.groups=4", "rollout.group_size=4", *overrides]
    data = build(compose(settings).data)
    data.setup()

    def collect(seeds: list[int], sample_seed: int) -> list[Episode]:
        return [
            dataclasses.replace(ep, group=g)
            for g, seed in enumerate(seeds)
            for ep in data.runner.collect(data.sampler, [seed], 4, sample_seed=seed)
        ]

    ranks = Ranks.current()
    plain = data.plan()
    saved: dict[str, Any] = {}
    for name, plan in (("plain", plain), ("dynamic", dataclasses.replace(plain, sampling=DynamicSampling()))):
        batch = collect_iteration(3, plan, collect, ranks)  # round 0 of iteration 3 holds all-equal groups
        saved[name] = {
            "keep": batch.keep,
            "scores": batch.group_scores,
            "keep_rows": batch.keep_rows,
            "share": tuple(batch.share or ()),
            "metrics": batch.record.as_metrics(),
            "seeds": [ep.seed for ep in batch.episodes],
        }
    torch.save(saved, f"{out}.rank{ranks.rank}")


if __name__ == "__main__":
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
    run(sys.argv[1], sys.argv[2:])
