"""What an environment's constructor takes, declared once in its signature and checked by one function.

Each keyword argument of an env's ``__init__`` is its option: the annotation gives the type, the default
the value a config leaves it at, and an ``Annotated`` bound the values it takes::

    size: Annotated[int, Range(2)] = 4
    p: Annotated[float, Range(0.0, 1.0, low_open=True)] = 0.9
    observation: Annotated[str, OneOf(OBSERVATIONS)] = "grid"

``options(cls)`` reads that declaration; ``TextEnv`` checks every construction against the bounds
(``check_bounds``), and ``ragen2`` checks ``env.kwargs`` against the names and types at start-up, before
any env is made. What only several options decide together (``min_numbers <= max_numbers``) stays in
the constructor.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import typing
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class Bound(Protocol):
    """The values an option takes, beyond its type."""

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` ("must be ≥ 2"), or None when it is in bounds."""
        ...


@dataclass(frozen=True)
class Range:
    """A number between ``low`` and ``high`` (either may be None: no bound), each end closed unless open."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, int | float) or isinstance(value, bool):
            return "must be a number"
        below = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        above = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        if not (below or above):
            return None
        if self.high is None:
            return f"must be {'>' if self.low_open else '≥'} {self.low}"
        if self.low is None:
            return f"must be {'<' if self.high_open else '≤'} {self.high}"
        return f"must be in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


@dataclass(frozen=True)
class OneOf:
    """One of a few values."""

    choices: tuple[Any, ...]

    def problem(self, value: Any) -> str | None:
        return None if value in self.choices else f"is not one of {', '.join(map(str, self.choices))}"


@dataclass(frozen=True, eq=False)
class Named:
    """A name in another package's registry (``names``), else the closest one and ``hint`` (where to look)."""

    names: Collection[str]
    what: str  # "a GEM environment"
    hint: str

    def problem(self, value: Any) -> str | None:
        if value in self.names:
            return None
        close = difflib.get_close_matches(str(value), list(self.names), n=1)
        meant = f"did you mean {close[0]}? " if close else ""
        return f"is not {self.what} ({meant}{self.hint})"


@dataclass(frozen=True)
class Option:
    """One keyword argument of an env's constructor."""

    hint: Any  # its type, without the bounds
    default: Any  # None where it has none
    bounds: tuple[Bound, ...] = ()

    def problem(self, value: Any) -> str | None:
        """What the bounds say against ``value`` (None passes: an optional option left out)."""
        if value is None:
            return None
        return next((p for p in (b.problem(value) for b in self.bounds) if p), None)


@functools.cache
def options(cls: type) -> Mapping[str, Option]:
    """The options ``cls.__init__`` declares, by name (``self`` and ``**kwargs`` aside)."""
    hints = typing.get_type_hints(cls.__init__, include_extras=True)
    found = {}
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        hint = hints.get(name, Any)
        bounds: tuple[Bound, ...] = ()
        if typing.get_origin(hint) is typing.Annotated:
            hint, *extras = typing.get_args(hint)
            bounds = tuple(e for e in extras if hasattr(e, "problem"))
        default = None if parameter.default is inspect.Parameter.empty else parameter.default
        found[name] = Option(hint, default, bounds)
    return found


def check_bounds(cls: type, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Raise a ``ValueError`` naming the first argument of ``cls(*args, **kwargs)`` out of its bounds."""
    given = {**dict(zip(options(cls), args, strict=False)), **kwargs}
    for name, value in given.items():
        option = options(cls).get(name)
        problem = option.problem(value) if option is not None else None
        if problem:
            raise ValueError(f"{name}={value!r} {problem}")
