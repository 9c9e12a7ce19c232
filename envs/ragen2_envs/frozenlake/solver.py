"""Optimal FrozenLake play: BFS when moves are deterministic, value iteration when slippery.

Dynamics (shared with the env): the intended move happens with probability ``success_rate``,
otherwise one of the two perpendicular moves, each with probability (1 − success_rate)/2. A move off
the map leaves the player in place; holes and the goal end the episode.

Value iteration computes V*(s), the maximal probability of ever reaching the goal (undiscounted;
the env's step budget is far longer than these maps need). Being greedy in V* alone can dawdle or
loop (a move into the edge keeps V* unchanged), so among the value-preserving actions (Q(s, a) =
V*(s)) we take the one with the fewest expected steps until the episode ends, by a second value
iteration (a stochastic shortest path). A proper policy that only uses value-preserving actions
reaches the goal with probability V*, so the tie-break costs no success probability.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

#: action names in gymnasium's order, so (a ± 1) % 4 are the perpendicular moves of a
ACTIONS: tuple[str, ...] = ("Left", "Down", "Right", "Up")
DELTAS: tuple[tuple[int, int], ...] = ((0, -1), (1, 0), (0, 1), (-1, 0))


def move(desc: tuple[str, ...], pos: tuple[int, int], action: int) -> tuple[int, int]:
    """Where a move in direction ``action`` takes the player (clamped to the map)."""
    rows, cols = len(desc), len(desc[0])
    d_row, d_col = DELTAS[action]
    return (min(max(pos[0] + d_row, 0), rows - 1), min(max(pos[1] + d_col, 0), cols - 1))


def outcome_probabilities(success_rate: float) -> list[tuple[int, float]]:
    """(direction offset from the intended action, probability) pairs."""
    slip = (1.0 - success_rate) / 2.0
    return [(0, success_rate), (-1, slip), (1, slip)]


def slip_direction(intended: int, success_rate: float, u: float) -> int:
    """The direction actually taken for a uniform draw ``u`` in [0, 1) (same split as the matrix)."""
    if u < success_rate:
        return intended
    slip = (1.0 - success_rate) / 2.0
    return (intended - 1) % len(ACTIONS) if u < success_rate + slip else (intended + 1) % len(ACTIONS)


def transition_matrix(desc: tuple[str, ...], success_rate: float) -> np.ndarray:
    """T[s, a, s'] with s = row * ncols + col; holes and the goal are absorbing."""
    rows, cols = len(desc), len(desc[0])
    n = rows * cols
    trans = np.zeros((n, len(ACTIONS), n))
    for s in range(n):
        pos = divmod(s, cols)
        for a in range(len(ACTIONS)):
            if desc[pos[0]][pos[1]] in "HG":
                trans[s, a, s] = 1.0
                continue
            for offset, prob in outcome_probabilities(success_rate):
                r, c = move(desc, pos, (a + offset) % len(ACTIONS))
                trans[s, a, r * cols + c] += prob
    return trans


def goal_cell(desc: tuple[str, ...]) -> tuple[int, int]:
    """(row, col) of the goal tile."""
    row = next(r for r, line in enumerate(desc) if "G" in line)
    return (row, desc[row].index("G"))


def explain(desc: tuple[str, ...], pos: tuple[int, int], actions: Sequence[str]) -> str:
    """The reasoning to the solver's next ``actions``, read off the map: the player's cell, the goal's, the moves.

    >>> explain(("S_", "_G"), (0, 0), ["Down", "Right"])
    'I am at (0, 0). The goal is at (1, 1). The safe way starts with Down then Right.'
    """
    goal = goal_cell(desc)
    return (
        f"I am at ({pos[0]}, {pos[1]}). The goal is at ({goal[0]}, {goal[1]}). "
        f"The safe way starts with {' then '.join(actions)}."
    )


def shortest_path(desc: tuple[str, ...], start: tuple[int, int]) -> list[str] | None:
    """Fewest deterministic moves from ``start`` to the goal avoiding holes ([] on the goal)."""
    goal = goal_cell(desc)
    parent: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    frontier = deque([start])
    while frontier:
        pos = frontier.popleft()
        if pos == goal:
            path: list[str] = []
            link = parent[pos]
            while link is not None:
                pos, a = link
                path.append(ACTIONS[a])
                link = parent[pos]
            return path[::-1]
        if desc[pos[0]][pos[1]] == "H":
            continue
        for a in range(len(ACTIONS)):
            nxt = move(desc, pos, a)
            if nxt not in parent:
                parent[nxt] = (pos, a)
                frontier.append(nxt)
    return None


def reach_probabilities(
    desc: tuple[str, ...], success_rate: float, tol: float = 1e-12, max_iterations: int = 1_000_000
) -> np.ndarray:
    """V*(s): the maximal probability of reaching the goal from each cell, shape (rows, cols)."""
    if not 0.0 <= success_rate <= 1.0:
        raise ValueError(f"success_rate={success_rate} must be in [0, 1]")
    rows, cols = len(desc), len(desc[0])
    trans = transition_matrix(desc, success_rate)
    goal = np.array([tile == "G" for row in desc for tile in row])
    values = goal.astype(float)
    # iterating from below converges to the least fixed point, which is the reach probability
    for _ in range(max_iterations):
        new = np.where(goal, 1.0, (trans @ values).max(axis=1))
        if np.max(np.abs(new - values)) < tol:
            return new.reshape(rows, cols)
        values = new
    raise RuntimeError(
        f"value iteration did not converge in {max_iterations} sweeps (success_rate={success_rate})"
    )


def optimal_policy(
    desc: tuple[str, ...], success_rate: float, tol: float = 1e-9
) -> tuple[np.ndarray, np.ndarray]:
    """(policy, values), both of shape (rows, cols): action index per cell and V*(cell).

    Holes, the goal and cells from which the goal cannot be reached (V* = 0) get action 0.
    """
    rows, cols = len(desc), len(desc[0])
    values = reach_probabilities(desc, success_rate).ravel()
    trans = transition_matrix(desc, success_rate)
    preserving = trans @ values >= values[:, None] - tol
    terminal = np.array([tile in "HG" for row in desc for tile in row])
    # lost cells (V* = 0) count as absorbing: no action there changes the outcome
    absorbing = terminal | (values <= 0.0)
    steps = np.zeros(rows * cols)
    for _ in range(1_000_000):
        cost = np.where(preserving, 1.0 + trans @ steps, np.inf)
        new = np.where(absorbing, 0.0, cost.min(axis=1))
        if np.max(np.abs(new - steps)) < tol:
            policy = np.where(absorbing, 0, cost.argmin(axis=1))
            return policy.reshape(rows, cols), values.reshape(rows, cols)
        steps = new
    raise RuntimeError(f"expected-steps iteration did not converge (success_rate={success_rate})")
