"""Exhaustive Countdown solver: an expression using every number exactly once that equals the target.

Search: repeatedly replace two values by one combination of them (``a+b``, ``a-b``, ``b-a``, ``a*b``,
``a/b``, ``b/a``) until one value is left; exact arithmetic with ``Fraction``, so fractional
intermediates are allowed (``3/4*8`` counts), as in the answer checker. Multisets of values already
shown to fail are remembered. Cost grows fast with the count: an unsolvable instance takes about
0.06 s with 4 numbers, 1.5 s with 5 and 40 s with 6 (one core), so it suits 3–5 numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

_ALL_OPS = "+-*/"


def solve(numbers: Sequence[int], target: int, ops: str = _ALL_OPS) -> str | None:
    """An expression over ``numbers`` (each once) equal to ``target``, using only ``ops``; else None."""
    if not numbers:
        raise ValueError("solve(numbers=[]): give at least one number")
    unknown = set(ops) - set(_ALL_OPS)
    if unknown or not ops:
        raise ValueError(f"solve(ops={ops!r}): use a non-empty subset of {_ALL_OPS!r}")
    items = [(Fraction(int(n)), str(int(n))) for n in numbers]
    found = _search(items, Fraction(int(target)), ops, set())
    if found is None:
        return None
    # drop the outermost parentheses the combination step adds
    return found[1:-1] if len(numbers) > 1 else found


def _search(
    items: list[tuple[Fraction, str]], target: Fraction, ops: str, dead: set[tuple[Fraction, ...]]
) -> str | None:
    if len(items) == 1:
        return items[0][1] if items[0][0] == target else None
    key = tuple(sorted(value for value, _ in items))
    if key in dead:
        return None
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            rest = items[:i] + items[i + 1 : j] + items[j + 1 :]
            for value, text in _combinations(items[i], items[j], ops):
                found = _search([*rest, (value, text)], target, ops, dead)
                if found is not None:
                    return found
    dead.add(key)
    return None


def _combinations(a: tuple[Fraction, str], b: tuple[Fraction, str], ops: str) -> list[tuple[Fraction, str]]:
    (x, sx), (y, sy) = a, b
    out: list[tuple[Fraction, str]] = []
    if "+" in ops:
        out.append((x + y, f"({sx} + {sy})"))
    if "-" in ops:
        out += [(x - y, f"({sx} - {sy})"), (y - x, f"({sy} - {sx})")]
    if "*" in ops:
        out.append((x * y, f"({sx} * {sy})"))
    if "/" in ops:
        if y != 0:
            out.append((x / y, f"({sx} / {sy})"))
        if x != 0:
            out.append((y / x, f"({sy} / {sx})"))
    return out


def explain(numbers: Sequence[int], target: int, expression: str) -> str:
    """The reasoning to a solution, read off the puzzle: the target, the numbers, the expression that hits it."""
    return f"I need {target} from {', '.join(str(n) for n in numbers)}. {expression} = {target}."
