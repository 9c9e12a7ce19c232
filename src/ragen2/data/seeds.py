"""Every seed of an iteration's rollouts, as pure functions of (run seed, iteration, round, rank).

A run resumed from ``last.ckpt`` rolls out exactly what an uninterrupted run would, because nothing random in
a rollout comes from anywhere else. ``rollout.groups`` is the iteration's global count: rank r of ``world``
rolls out global groups r·local … r·local + local − 1 (local = groups / world), and global group g has the
same instance seed whatever the world size. Round 0 is the only round without DAPO's dynamic sampling;
later rounds (``algo.sampling.max_rounds`` − 1 per iteration) draw instance and sampler seeds above round
0's and the held-out ones (``ragen2.data.evaluation.VAL_SEED_OFFSET``).
"""

from __future__ import annotations

from ragen2.errors import ConfigError

__all__ = ["RESAMPLE_SEED_OFFSET", "instance_seeds", "local_groups", "sampler_seed"]

RESAMPLE_SEED_OFFSET = 2_000_000_011
_INSTANCE_STRIDE = 1_000_003  # instance seeds of run seeds s and s + 1 are this far apart
_SAMPLER_STRIDE = 7919  # sampler seeds: per run seed
_ITERATION_STRIDE = 104_729  # sampler seeds: per iteration (round 0)


def local_groups(groups: int, world: int) -> int:
    """The groups one rank rolls out per round: its equal share of ``groups``."""
    if groups % world:
        raise ConfigError(
            f"rollout.groups={groups} does not divide among {world} ranks: each rank rolls out an equal "
            f"share of the iteration's groups. Fix: rollout.groups a multiple of {world}, or "
            f"trainer.devices dividing {groups}."
        )
    return groups // world


def _resample_slot(iteration: int, round: int, max_rounds: int) -> int:
    """A distinct index per (iteration, round ≥ 1): max_rounds − 1 slots per iteration."""
    if not 1 <= round < max_rounds:
        raise ValueError(
            f"round {round} does not exist: later rounds need algo.sampling.max_rounds > {round}"
        )
    return iteration * (max_rounds - 1) + round - 1


def instance_seeds(
    seed: int,
    iteration: int,
    groups: int,
    round: int = 0,
    *,
    max_rounds: int = 1,
    rank: int = 0,
    world: int = 1,
) -> list[int]:
    """Rank ``rank``'s instance seeds of one round, one per group it rolls out (``max_rounds``: the
    iteration's rounds, 1 without dynamic sampling)."""
    slot = iteration if round == 0 else _resample_slot(iteration, round, max_rounds)
    base = seed * _INSTANCE_STRIDE + (0 if round == 0 else RESAMPLE_SEED_OFFSET)
    local = local_groups(groups, world)
    first = base + slot * groups + rank * local
    return list(range(first, first + local))


def sampler_seed(
    seed: int, iteration: int, round: int = 0, *, max_rounds: int = 1, rank: int = 0, world: int = 1
) -> int:
    """Rank ``rank``'s sampler seed for one round (the runner derives one per turn from it)."""
    if round == 0:
        return seed * _SAMPLER_STRIDE + iteration * _ITERATION_STRIDE + rank
    slot = _resample_slot(iteration, round, max_rounds) * world + rank
    return RESAMPLE_SEED_OFFSET + seed * _SAMPLER_STRIDE + slot
