"""DAPO's dynamic sampling as a config object (docs/method.md §6): drop all-equal groups, resample to fill.

``ragen2.data.iteration`` runs the rounds (seeds from ``ragen2.data.seeds``); this module holds the knobs and
the pure steps: which groups carry signal, and how kept groups are re-indexed into one batch.

Departures from DAPO / verl's DAPO recipe:
- verl filters on a named metric (``algorithm.filter_groups.metric``: acc, score, seq_reward) and keeps
  a group when its std is > 0. We filter on the episode returns the update uses (after shaping, e.g.
  the overlong penalty), with a small tolerance: returns are float32, and a group whose returns differ
  by summation-order noise would pass a "> 0" test while carrying no signal.
- verl caps the loop with ``max_num_gen_batches`` (≤ 0 = unlimited) and raises when the cap is hit.
  We always cap (``max_rounds``) and never raise: a short batch trains on the groups found and logs
  the shortfall (``filter/dynamic_shortfall``), so a hard stretch of training cannot end a run.
- Each round rolls out ``rollout.groups`` new instances (verl's ``gen_batch_size`` can exceed the train
  batch); surplus informative groups past the target are discarded, as in verl.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from ragen2.agent.episode import Episode
from ragen2.errors import ConfigError

__all__ = ["DynamicSampling", "regroup"]


@dataclass(frozen=True)
class DynamicSampling:
    """Roll out up to ``max_rounds`` rounds of groups until ``rollout.groups`` informative ones are found."""

    max_rounds: int = 4
    """Rounds of ``rollout.groups`` groups rolled out at most per iteration; a shortfall is logged."""
    atol: float = 1e-6
    """A group whose returns span ≤ atol counts as all-equal (float32's ulp at 1 is about 6e-8)."""

    def __post_init__(self) -> None:
        if isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int) or self.max_rounds < 1:
            raise ConfigError(
                f"algo.sampling.max_rounds={self.max_rounds!r} must be a whole number ≥ 1 (rounds of "
                "rollout.groups groups per iteration). Fix: algo.sampling.max_rounds=4, or "
                "algo.sampling=null to switch dynamic sampling off."
            )
        if not self.atol >= 0:
            raise ConfigError(f"algo.sampling.atol={self.atol} must be ≥ 0. Fix: algo.sampling.atol=1e-6")

    def informative(self, per_group: torch.Tensor) -> torch.Tensor:
        """[G, K] returns -> [G] bool: True where the group's returns are not all equal."""
        x = per_group.to(torch.float64)
        return (x.max(dim=1).values - x.min(dim=1).values) > self.atol


def regroup(episodes: Sequence[Episode], groups: Sequence[int], first: int) -> list[Episode]:
    """Copies of the episodes of ``groups`` (in that order) renumbered densely from ``first``.

    ``dataclasses.replace`` leaves the caller's episodes untouched; the instance seed is kept.
    """
    new_index = {g: first + i for i, g in enumerate(groups)}
    members = sorted((ep for ep in episodes if ep.group in new_index), key=lambda ep: new_index[ep.group])
    return [replace(ep, group=new_index[ep.group]) for ep in members]
