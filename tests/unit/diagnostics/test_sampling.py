"""Where each MI mode samples its (X, Z) rows: episodes as id tuples, turn t's rows, a trajectory then one of
its turns, the curves a set of modes gives, and the seeded draw of each curve."""

from __future__ import annotations

import random
from collections import Counter

from helpers import trajectory_grid

from ragen2.agent.episode import Episode, Turn
from ragen2.diagnostics.sampling import (
    MODES,
    curve_rows,
    curves,
    gather_trajectories,
    mode_of,
    trajectories,
    trajectory_rows,
    turn_rows,
)
from ragen2.distributed import ONE_PROCESS


def test_episodes_become_x_z_tuples() -> None:
    def turn(x: list[int], z: list[int] | None) -> Turn:
        return Turn(x, [9], None, "", "stop", "", True, [], [], 0.0, 0.0, z)

    ep = Episode("e", 0, 0, 0, "", turns=[turn([1, 2], [3]), turn([1, 2, 3, 4], None), turn([5], [])])
    assert trajectories([ep]) == [(((1, 2), (3,)), ((1, 2, 3, 4), None), ((5,), None))]


def test_first_turn_and_turn_t_rows() -> None:
    trajs = [
        (((1,), (10,)), ((1, 10, 5), (11,))),
        (((2,), None), ((2, 7, 5), (12,)), ((2, 7, 5, 12, 6), (13,))),
        (((3,), (14,)),),
    ]
    rng = random.Random(0)
    assert turn_rows(trajs, 1, 64, rng) == ([((1,), (10,)), ((3,), (14,))], 2)  # invalid Z left out
    assert turn_rows(trajs, 2, 64, rng) == ([((1, 10, 5), (11,)), ((2, 7, 5), (12,))], 2)
    assert turn_rows(trajs, 3, 64, rng) == ([((2, 7, 5, 12, 6), (13,))], 1)
    assert turn_rows(trajs, 4, 64, rng) == ([], 0)
    rows, valid = turn_rows(trajectory_grid(4, 4), 2, 5, rng)  # a budget below the candidates: 5 of 16
    assert valid == 16 and len(rows) == 5 and len(set(rows)) == 5
    assert curves(MODES, trajs) == ["first_turn", "trajectory", "turn_2", "turn_3"]
    assert curves(["per_turn"], [trajs[2]]) == []  # nobody reached turn 2
    assert [mode_of(c) for c in ("first_turn", "trajectory", "turn_12")] == [
        "first_turn",
        "trajectory",
        "per_turn",
    ]


def test_trajectory_rows_pick_a_trajectory_then_a_valid_turn_uniformly() -> None:
    trajs = [
        (((1,), (10,)), ((1, 10, 5), None), ((1, 10, 5, 6), (11,))),  # turns 1 and 3 valid
        (((2,), None), ((2, 7), None)),  # nothing valid: never drawn
        (((3,), (12,)),),
    ]
    rows, valid = trajectory_rows(trajs, 64, random.Random(0))
    assert valid == 2 and len(rows) == 2
    assert rows[0] in (((1,), (10,)), ((1, 10, 5, 6), (11,))) and rows[1] == ((3,), (12,))
    # the turn is uniform among the valid ones: 2000 draws, each share 1/2 ± 4 σ (σ = 0.011)
    picks = Counter(trajectory_rows(trajs[:1], 1, random.Random(s))[0][0][1] for s in range(2000))
    assert picks.keys() == {(10,), (11,)} and abs(picks[(10,)] / 2000 - 0.5) < 0.045
    # the trajectory is uniform without replacement: a budget of 3 of 16 draws 3 distinct trajectories
    many = trajectory_grid(4, 4)
    drawn, valid = trajectory_rows(many, 3, random.Random(1))
    owners = {next(i for i, traj in enumerate(many) if row in traj) for row in drawn}
    assert valid == 16 and len(owners) == 3


def test_each_curve_draws_from_its_own_seed() -> None:
    trajs = trajectory_grid(4, 4)
    # the same (seed, iteration, curve) draws the same rows; another iteration or seed draws others
    assert curve_rows("turn_2", trajs, 5, 0, 3) == curve_rows("turn_2", trajs, 5, 0, 3)
    assert curve_rows("turn_2", trajs, 5, 0, 3) != curve_rows("turn_2", trajs, 5, 0, 4)
    assert curve_rows("trajectory", trajs, 5, 0, 3) != curve_rows("trajectory", trajs, 5, 1, 3)
    # first_turn keeps the seed it has always used (seed · 131 + iteration), so old runs' rows stay
    assert curve_rows("first_turn", trajs, 5, 2, 7) == turn_rows(trajs, 1, 5, random.Random(2 * 131 + 7))


def test_one_process_gathers_its_own_trajectories() -> None:
    whole = trajectory_grid()
    assert gather_trajectories(whole, ONE_PROCESS) == whole
