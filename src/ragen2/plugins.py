"""The plug points a config value names, as tables a package outside ragen2 adds to (docs/extending.md).

Each table maps the value of one config key to what it names: ``filter.strategy``, ``filter.score``,
``algo.loss_agg``, ``algo.kl_kind`` (and ``algo.kl_reward.kind``), ``algo.loss_scaling``. ragen2's own entries
register with the same decorators as a user's, where they are defined (``ragen2.algos``,
``ragen2.data.group_filter``: every checker of a value imports the module that defines its own)::

    @plugins.strategy("bottom_k")
    def bottom_k(c: Candidates, value: float) -> torch.Tensor: ...

A package declares the modules that register its entries in the entry-point group ``ragen2.plugins``
(``<name> = "<module>"``); the first read of any table imports them all, once, so every check of a config
value sees them. A value no table holds is refused by its checker in one line naming the key, the value and
the choices. A leaf: it imports nothing of ragen2 but the error it raises, and no torch.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

    from ragen2.algos.filters import Candidates
    from ragen2.data.batch import Grouped

__all__ = [
    "ENTRY_POINT_GROUP",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "LOSS_SCALINGS",
    "SCORES",
    "STRATEGIES",
    "Aggregation",
    "Registry",
    "Score",
    "kl_estimator",
    "load",
    "loss_aggregation",
    "loss_scaling",
    "score",
    "strategy",
]

#: the entry-point group in which a package declares the modules that register its entries
ENTRY_POINT_GROUP = "ragen2.plugins"

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class Registry(MutableMapping[str, T]):
    """One plug point's entries by name (the value of config key ``key``); reading it first ``load``s the
    installed packages' entries. Printed, it is its names, as a refusal lists the choices."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> None:
        """Register ``entry`` as ``name``; a name another entry holds is refused (a package would silently
        change what a config means)."""
        held = self._entries.get(name)
        if held is not None and held != entry:
            raise ValueError(
                f"{self.key}={name!r} is registered twice ({held!r}, then {entry!r}). Fix: give the second "
                "entry a name of its own"
            )
        self._entries[name] = entry

    def __getitem__(self, name: str) -> T:
        _load_once()
        return self._entries[name]

    def __setitem__(self, name: str, entry: T) -> None:
        self._entries[name] = entry

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        _load_once()
        return iter(list(self._entries))

    def __len__(self) -> int:
        _load_once()
        return len(self._entries)

    def __str__(self) -> str:
        return ", ".join(self)


@dataclass(frozen=True)
class Score:
    """A filter score: the per-rollout quantity it ``reads`` of a batch ([B]) and how it ``reduce``s each
    group's ([G, K] -> [G], float64); a spread needs ``min_rollouts`` = 2 per group."""

    reads: Callable[[Grouped], torch.Tensor]
    reduce: Callable[[torch.Tensor], torch.Tensor]
    min_rollouts: int = 1


@dataclass(frozen=True)
class Aggregation:
    """A loss aggregation: ``reduce(loss [B, T], mask [B, T] in the loss's dtype, norm) -> scalar``, and
    whether it is a mean over tokens (``token_level``: micro-batches weigh by their tokens) or over
    sequences (by their non-empty rows), so that split micro-batches and ranks sum to the whole batch's."""

    reduce: Callable[[torch.Tensor, torch.Tensor, float | None], torch.Tensor]
    token_level: bool


#: filter.strategy -> (candidates, filter.value) -> keep [G]; refuses a value it cannot use (ValueError)
STRATEGIES: Registry[Callable[[Candidates, float], torch.Tensor]] = Registry("filter.strategy")
#: filter.score -> what it reads and how it reduces a group
SCORES: Registry[Score] = Registry("filter.score")
#: algo.loss_agg -> how token terms become one loss
LOSS_AGGREGATIONS: Registry[Aggregation] = Registry("algo.loss_agg")
#: algo.kl_kind, algo.kl_reward.kind -> (logp, ref_logp) -> elementwise KL(π‖π_ref) estimate
KL_ESTIMATORS: Registry[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = Registry("algo.kl_kind")
#: algo.loss_scaling -> the filter's kept ratio in [0, 1] -> the advantages' multiplier
LOSS_SCALINGS: Registry[Callable[[float], float]] = Registry("algo.loss_scaling")


def _adds(table: Registry[Any], name: str, entry: Callable[[F], Any]) -> Callable[[F], F]:
    """A decorator that registers ``entry(f)`` as ``name`` and returns ``f`` itself."""

    def register(f: F) -> F:
        table.add(name, entry(f))
        return f

    return register


def strategy(name: str) -> Callable[[F], F]:
    """Register ``f(candidates, value) -> keep [G]`` as ``filter.strategy=<name>``."""
    return _adds(STRATEGIES, name, lambda f: f)


def score(name: str, reads: Callable[[Grouped], torch.Tensor], min_rollouts: int = 1) -> Callable[[F], F]:
    """Register ``f(values [G, K]) -> [G]`` over the per-rollout quantity ``reads(batch) -> [B]`` as
    ``filter.score=<name>``."""
    return _adds(SCORES, name, lambda f: Score(reads, f, min_rollouts))


def loss_aggregation(name: str, token_level: bool) -> Callable[[F], F]:
    """Register ``f(loss [B, T], mask [B, T], norm) -> scalar`` as ``algo.loss_agg=<name>``."""
    return _adds(LOSS_AGGREGATIONS, name, lambda f: Aggregation(f, token_level))


def kl_estimator(name: str) -> Callable[[F], F]:
    """Register ``f(logp, ref_logp) -> KL estimate`` (same shape) as ``algo.kl_kind=<name>``."""
    return _adds(KL_ESTIMATORS, name, lambda f: f)


def loss_scaling(name: str) -> Callable[[F], F]:
    """Register ``f(kept_ratio) -> multiplier`` as ``algo.loss_scaling=<name>``."""
    return _adds(LOSS_SCALINGS, name, lambda f: f)


_imported: set[str] = set()  # the entry points' modules imported so far
_scanned = False


def load() -> None:
    """Import the modules installed packages declare in ``ragen2.plugins`` that are not imported yet: each
    registers its entries. A table's first read calls it; a package put on the path later (a notebook, a
    test) is read by calling it again."""
    global _scanned
    _scanned = True  # first: a module that reads a table while it registers does not start again
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.value in _imported:
            continue
        _imported.add(ep.value)
        try:
            ep.load()
        except ImportError as err:
            from ragen2.errors import ConfigError

            raise ConfigError(
                f"the {ENTRY_POINT_GROUP} entry point {ep.name} = {ep.value} does not import ({err}). Fix: "
                "install what its package needs, or uninstall the package that declares it"
            ) from None


def _load_once() -> None:
    if not _scanned:
        load()
