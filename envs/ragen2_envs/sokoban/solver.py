"""Optimal Sokoban solver: breadth-first search over (player, boxes) states.

Every move costs one action (the env charges −0.1 per action), so BFS over single moves gives the
shortest action sequence. Squares from which a box can never reach any target (found by pulling a
lone box backwards from every target) are pruned: a box there is a dead end on every path, so the
pruning never removes an optimal solution.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from ragen2_envs.sokoban.board import ACTIONS, Pos, SokobanState

_MOVES = tuple(ACTIONS.items())


def live_squares(state: SokobanState) -> frozenset[Pos]:
    """Cells from which a lone box can still be pushed onto some target."""
    live = set(state.targets)
    frontier = deque(state.targets)
    while frontier:
        box = frontier.popleft()
        for d_row, d_col in ACTIONS.values():
            # the box came from `prev` pushed by a player standing at `behind`
            prev = (box[0] - d_row, box[1] - d_col)
            behind = (prev[0] - d_row, prev[1] - d_col)
            if prev in live or state.is_blocked(prev) or state.is_blocked(behind):
                continue
            live.add(prev)
            frontier.append(prev)
    return frozenset(live)


def solve(state: SokobanState, max_depth: int | None = None, max_states: int = 2_000_000) -> list[str] | None:
    """A shortest action sequence (names from :data:`ACTIONS`) that solves ``state``.

    Returns ``[]`` when already solved and ``None`` when no solution of at most ``max_depth``
    actions exists (or the search visits more than ``max_states`` states).
    """
    if state.solved:
        return []
    live = live_squares(state)
    if not state.boxes <= live:
        return None
    start = (state.player, tuple(sorted(state.boxes)))
    # parent[s] = (previous state, action name) so the path is rebuilt without storing it per node
    parent: dict[tuple[Pos, tuple[Pos, ...]], tuple[tuple[Pos, tuple[Pos, ...]], str] | None] = {start: None}
    frontier: deque[tuple[tuple[Pos, tuple[Pos, ...]], int]] = deque([(start, 0)])
    targets = state.targets
    while frontier:
        node, depth = frontier.popleft()
        if max_depth is not None and depth >= max_depth:
            continue
        player, boxes = node
        box_set = set(boxes)
        for name, (d_row, d_col) in _MOVES:
            nxt = (player[0] + d_row, player[1] + d_col)
            if state.is_blocked(nxt):
                continue
            new_boxes = boxes
            if nxt in box_set:
                beyond = (nxt[0] + d_row, nxt[1] + d_col)
                if beyond in box_set or beyond not in live:
                    continue
                new_boxes = tuple(sorted([*(b for b in boxes if b != nxt), beyond]))
            child = (nxt, new_boxes)
            if child in parent:
                continue
            parent[child] = (node, name)
            if new_boxes is not boxes and targets.issuperset(new_boxes):
                return _path(parent, child)
            if len(parent) > max_states:
                return None
            frontier.append((child, depth + 1))
    return None


def _path(
    parent: dict[tuple[Pos, tuple[Pos, ...]], tuple[tuple[Pos, tuple[Pos, ...]], str] | None],
    node: tuple[Pos, tuple[Pos, ...]],
) -> list[str]:
    actions: list[str] = []
    link = parent[node]
    while link is not None:
        node, name = link
        actions.append(name)
        link = parent[node]
    return actions[::-1]


def _cells(cells: Iterable[Pos]) -> str:
    return ", ".join(f"({r}, {c})" for r, c in sorted(cells))


def explain(state: SokobanState, actions: Sequence[str]) -> str:
    """The reasoning to the solver's next ``actions``, read off the board: the player's cell, the boxes' and
    the targets', then the moves."""
    many = len(state.boxes) > 1
    boxes = f"The boxes are at {_cells(state.boxes)}" if many else f"The box is at {_cells(state.boxes)}"
    targets = (
        f"the targets are at {_cells(state.targets)}" if many else f"the target is at {_cells(state.targets)}"
    )
    return (
        f"I am at ({state.player[0]}, {state.player[1]}). {boxes}; {targets}. "
        f"The shortest solution starts with {' then '.join(actions)}."
    )
