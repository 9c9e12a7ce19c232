"""Which (X, Z) rows an MI pass scores: every rank's turns as id tuples, and the rows each curve draws.

Modes and the curves they give (docs/diagnostics.md):

* ``first_turn`` → ``first_turn``: turn 1 of uniformly drawn episodes.
* ``trajectory`` → ``trajectory``: a trajectory drawn uniformly (without replacement), then one of its
  turns with a valid Z, uniformly.
* ``per_turn`` → ``turn_2``, ``turn_3``, …: turn t of uniformly drawn episodes that reached it, one
  curve per turn position, each with the mode's budget (turn 1 is ``first_turn``).

Besides the modes, which read the iteration's batch, ``heldout``: turn 1 of first-turn episodes of fixed
held-out instances sampled for the pass (``diagnostics.heldout``), every valid row (``turn_candidates``).

Pure functions of the trajectories and a seeded ``random.Random``, except ``gather_trajectories``, the
one collective (through ``Ranks``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ragen2.distributed import Ranks

MODES = ("first_turn", "trajectory", "per_turn")
HELDOUT = "heldout"  # the curve of the held-out instances' first turns

Ids = tuple[int, ...]
Row = tuple[Ids, Ids]  # (X = the turn's prompt ids, Z = its reasoning ids)
Trajectory = tuple[tuple[Ids, Ids | None], ...]  # per turn: (X, Z or None when </think> never came)


def trajectories(episodes: Sequence[Any]) -> list[Trajectory]:
    """Each episode's turns as (X, Z) id tuples: all the MI pass reads of a batch (and all it gathers)."""
    return [
        tuple((tuple(t.prompt_ids), tuple(t.reasoning_ids) if t.reasoning_ids else None) for t in ep.turns)
        for ep in episodes
    ]


def gather_trajectories(local: list[Trajectory], ranks: Ranks) -> list[Trajectory]:
    """Every rank's trajectories, in rank order, on every rank (a collective: every rank calls it)."""
    return [traj for share in ranks.gather(local) for traj in share]


def _valid(traj: Trajectory, t: int) -> Row | None:
    """Turn ``t`` (0-based) as a row, or None when the episode did not reach it or its Z is invalid."""
    if t >= len(traj):
        return None
    x, z = traj[t]
    return None if z is None else (x, z)


def turn_candidates(trajs: Sequence[Trajectory], t: int) -> list[Row]:
    """Turn ``t`` (1-based) of every trajectory that reached it with a valid Z, in order (with t = 1, the
    ``heldout`` curve's rows)."""
    return [row for traj in trajs if (row := _valid(traj, t - 1)) is not None]


def turn_rows(trajs: Sequence[Trajectory], t: int, budget: int, rng: random.Random) -> tuple[list[Row], int]:
    """Turn ``t`` (1-based) of up to ``budget`` uniformly drawn episodes that reached it with a valid Z,
    and how many could be drawn from."""
    candidates = turn_candidates(trajs, t)
    return (rng.sample(candidates, budget) if len(candidates) > budget else candidates), len(candidates)


def trajectory_rows(trajs: Sequence[Trajectory], budget: int, rng: random.Random) -> tuple[list[Row], int]:
    """Up to ``budget`` trajectories drawn uniformly without replacement, then one of each one's turns
    with a valid Z, uniformly; a trajectory with no valid Z is not drawn. Also returns the count of
    trajectories that could be drawn."""
    valid = [[row for t in range(len(traj)) if (row := _valid(traj, t)) is not None] for traj in trajs]
    candidates = [rows for rows in valid if rows]
    drawn = rng.sample(candidates, budget) if len(candidates) > budget else candidates
    return [rng.choice(rows) for rows in drawn], len(candidates)


def curves(modes: Sequence[str], trajs: Sequence[Trajectory]) -> list[str]:
    """The curves the modes give on these trajectories: ``turn_<t>`` for every t ≥ 2 some episode reached."""
    out: list[str] = []
    longest = max((len(traj) for traj in trajs), default=0)
    for mode in modes:
        out += [f"turn_{t}" for t in range(2, longest + 1)] if mode == "per_turn" else [mode]
    return out


def mode_of(curve: str) -> str:
    """The mode that gives ``curve``."""
    return "per_turn" if curve.startswith("turn_") else curve


def curve_rows(
    curve: str, trajs: Sequence[Trajectory], budget: int, seed: int, iteration: int
) -> tuple[list[Row], int]:
    """The rows ``curve`` draws at ``iteration`` (and how many it could draw from), seeded by (seed,
    iteration, curve): the same trajectories give the same rows on every rank and on a resumed run."""
    if curve == "first_turn":
        # the seed the first-turn pass has always used, so its numbers stay those of earlier runs
        return turn_rows(trajs, 1, budget, random.Random(seed * 131 + iteration))
    rng = random.Random(f"{seed}/{iteration}/{curve}")  # str seeds hash stably (sha512)
    if curve == "trajectory":
        return trajectory_rows(trajs, budget, rng)
    return turn_rows(trajs, int(curve.removeprefix("turn_")), budget, rng)
