"""The typed check of settings: each config node against the object that reads it, before it is built.

``settings(cls, node, key)`` builds a dataclass from its config node, refusing a key the class does not
have (with the name meant) and a value whose type does not fit the field's
annotation (a float for an int, text for a number, a number for a bool, nan or ±inf anywhere).
``check_target_types`` does the same for what each ``_target_`` node of a composed config hands its
callable, and ``check_overrides`` for the command-line overrides Hydra would take wrongly (a key that only
points at another) or refuse without the fix (``+`` on a group that exists), before Hydra sees them.
Every refusal is a ``ConfigError`` of one line: ``<key>=<value> … Fix: …``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import math
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from ragen2.errors import ConfigError

T = TypeVar("T")

#: keys that only point at another (data.sampling: ${algo.sampling}): set on the command line, they would cut
#: the link, so the override is refused with the key to set
REDIRECTED: dict[str, tuple[str, str]] = {
    "data.sampling": ("algo.sampling", "DAPO's dynamic sampling is part of the algorithm"),
    "data.shaping": ("algo.shaping", "DAPO's overlong shaping is part of the algorithm"),
}
#: ``+`` on a group every config already has: Hydra's own error does not say to drop the ``+``
RESPELLED: dict[str, str] = {
    "+algo/critic": "algo/critic=<name> without '+' (every algo has a critic default: null, value_head for ppo)",
    "+algo/kl_reward": "algo/kl_reward=<name> without '+' (every algo has a kl_reward default: null)",
}


def redirected(key: str) -> str | None:
    """Where to set ``key`` (or a key under it) that only points at another, with the reason, or None."""
    old = next((old for old in REDIRECTED if key == old or key.startswith(old + ".")), None)
    if old is None:
        return None
    new, why = REDIRECTED[old]
    return f"{key} has moved: set {new + key[len(old) :]} instead ({why})"


def check_overrides(overrides: Iterable[str]) -> None:
    """Refuse command-line overrides that Hydra would misread or refuse without the fix: a key that only
    points at another (setting it would cut the link), and ``+`` on a group every config already has."""
    for override in overrides:
        spelled = override.split("=", 1)[0]
        if spelled in RESPELLED:
            raise ConfigError(f"{override!r}: use {RESPELLED[spelled]}")
        key = spelled.lstrip("~+")
        moved = redirected(key)
        if moved is not None:
            raise ConfigError(f"{override!r}: {moved}")


# ---- types against the dataclasses' annotations -------------------------------------------------------
_TYPE_NAMES: dict[type, str] = {bool: "true or false", int: "an integer", float: "a number", str: "text"}


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` may stand for a ``hint``: exact for bool, int, float (an int too), str, their unions
    and containers; any other type (a class, a Protocol, a callable) is the constructor's to check."""
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return (value is None and type(None) in args) or any(
            _fits(value, a) for a in args if a is not type(None)
        )
    if origin in (tuple, list, Sequence):
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            return False
        items = args if origin is tuple and Ellipsis not in args else args[:1] * len(value)
        return all(_fits(v, a) for v, a in zip(value, items, strict=False))
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return isinstance(value, Mapping)
    return True


def _expected(hint: Any) -> str:
    """``hint`` in words (only called for a hint ``_fits`` checks)."""
    if hint in _TYPE_NAMES:
        return _TYPE_NAMES[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        words = [_expected(a) for a in args if a is not type(None)]
        return " or ".join(words + (["null"] if type(None) in args else []))
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return "a mapping of key: value"
    items = [a for a in args if a is not Ellipsis]
    plural = (
        {bool: "bools", int: "integers", float: "numbers", str: "strings"}.get(items[0]) if items else None
    )
    if plural is None or len(set(items)) > 1:
        return "a list"
    return (
        f"a list of {len(items)} {plural}"
        if origin is tuple and Ellipsis not in args
        else f"a list of {plural}"
    )


def shown(value: Any) -> str:
    """A value as it is written on the command line (``true``, ``null``, ``'text'``, ``2.5``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return f"[{', '.join(shown(v) for v in value)}]"
    return repr(value) if isinstance(value, str) else str(value)


def _kind(value: Any) -> str:
    """What ``value`` is, in words."""
    kinds = ((bool, "a bool"), (int, "an integer"), (float, "a float"), (str, "text"), (Mapping, "a mapping"))
    if value is None:
        return "null"
    for cls, word in kinds:  # bool before int: a bool is an int to isinstance
        if isinstance(value, cls):
            return word
    return "a list" if isinstance(value, Sequence) else f"a {type(value).__name__}"


def _finite(value: Any) -> bool:
    """Whether every number in ``value`` (a number, or a list of them) is finite; a mapping is a node of its
    own, checked where it is."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return all(_finite(v) for v in value)
    return True


def _fix(key: str, value: Any, hint: Any, example: Any) -> str:
    """The fix a type error names: the integers beside a float, else ``example``, else the type in words."""
    if hint is int and isinstance(value, float) and math.isfinite(value):
        low, high = math.floor(value), math.ceil(value)
        return f"{key}={low}" if low == high else f"{key}={low} or {key}={high}"
    if example is not None and _fits(example, hint) and _finite(example):
        return f"{key}={shown(example)}"
    return f"{key}=<{_expected(hint)}>"


def check_type(key: str, value: Any, hint: Any, example: Any = None) -> None:
    """Refuse ``value`` for the config key ``key`` unless it fits ``hint`` and every number in it is finite
    (no setting takes nan or ±inf: comparisons such as ``lr > 0`` let them through); the fix shows
    ``example``."""
    if not _fits(value, hint):
        raise ConfigError(
            f"{key}={shown(value)} is {_kind(value)}, not {_expected(hint)}. Fix: {_fix(key, value, hint, example)}"
        )
    if not _finite(value):
        problem = (
            "is not a finite number" if isinstance(value, float) else "holds a number that is not finite"
        )
        raise ConfigError(
            f"{key}={shown(value)} {problem} (no setting takes nan or inf). Fix: {_fix(key, value, hint, example)}"
        )


def unknown_key(key: str, value: Any, known: Iterable[str], where: str = "a setting") -> ConfigError:
    """The error for ``key=value`` that names nothing ``known`` (the last part of ``key`` against the names
    beside it): the close name as the fix when there is one (a misspelling), else the names there are."""
    parent, _, name = key.rpartition(".")
    prefix = f"{parent}." if parent else ""
    names = list(known)
    close = difflib.get_close_matches(name, names, n=1)
    fix = (
        f"{prefix}{close[0]}={shown(value)}"
        if close
        else f"one of {', '.join(names)}"
        if names
        else f"remove {key} (it takes none)"
    )
    return ConfigError(f"{key}={shown(value)} is not {where}. Fix: {fix}")


@functools.cache
def _field_types(cls: type) -> dict[str, tuple[Any, Any]]:
    """Each field of the dataclass ``cls``: its resolved annotation and its default (None when it has none)."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: (hints[f.name], None if f.default is dataclasses.MISSING else f.default)
        for f in dataclasses.fields(cls)
    }


def settings(cls: type[T], node: object, key: str) -> T:
    """``cls(**node)`` for the config node at ``key`` (a mapping, an already built ``cls``, or None for all
    defaults), refusing keys ``cls`` does not have and values whose type does not fit the field's annotation.

    The error names ``key.<name>`` with its value, the key meant or the keys ``cls`` knows, or the
    type the field takes; a node that is not a mapping is named with its value.
    """
    if isinstance(node, cls):
        return node
    fields = _field_types(cls)
    if node is not None and not isinstance(node, Mapping):
        raise ConfigError(
            f"{key}={shown(node)} is {_kind(node)}, not a mapping of settings. Fix: a mapping with any of "
            f"{', '.join(fields)}"
        )
    values: dict[str, Any] = dict(node or {})
    for name, value in values.items():
        if name in fields:
            check_type(f"{key}.{name}", value, *fields[name])
            continue
        raise unknown_key(f"{key}.{name}", value, fields)
    return cls(**values)


#: keys of a ``_target_`` node that are Hydra's, not the target's
_HYDRA_KEYS = ("_target_", "_partial_", "_convert_", "_recursive_", "_args_")
_INTERPOLATION = re.compile(r"\$\{([\w.]+)\}")


def check_target_types(cfg: DictConfig) -> None:
    """What a config node hands its ``_target_`` callable, before anything is built: a key the callable does
    not take (``+trainer.max_epoch=3``) is refused with the argument meant, and for ragen2's own targets (a
    filter, a sampler, a callback, an estimator) each value against its annotation. A value that only
    reaches its target through an interpolation is named where it is set
    (``module.temperature: ${rollout.temperature}`` -> ``rollout.temperature``)."""
    for path, node in _target_nodes(cfg, ""):
        target = str(node._target_)
        signature = _parameters(target)
        if signature is None:  # not importable here: its constructor checks alone
            continue
        hints, defaults, takes_any = signature
        for name in node:
            if name in _HYDRA_KEYS:
                continue
            child = node._get_node(name)
            assert child is not None  # name is one of the node's own keys
            raw = child._value()
            if name not in defaults and not takes_any:
                raise unknown_key(f"{path}{name}", raw, defaults, f"an argument of {target}")
            if not target.startswith("ragen2.") or name not in hints:
                continue
            source = _INTERPOLATION.fullmatch(raw) if isinstance(raw, str) else None
            value = node[name]
            if isinstance(value, DictConfig):  # an object of its own: its node is checked where it is
                continue
            if not isinstance(value, str | int | float | bool | None):
                value = OmegaConf.to_container(value, resolve=True)
            example = defaults[name] if defaults[name] is not inspect.Parameter.empty else None
            check_type(source.group(1) if source else f"{path}{name}", value, hints[name], example)


def _target_nodes(node: DictConfig, path: str) -> Iterable[tuple[str, DictConfig]]:
    """Every node under ``node`` that names a ``_target_``, with its dotted path (and a trailing dot);
    interpolated nodes (``data.filter: ${filter}``) are visited where they are defined."""
    if isinstance(node.get("_target_"), str):
        yield path, node
    for key in node:
        child = node._get_node(key)
        assert child is not None  # key is one of the node's own keys
        if (path == "" and key == "hydra") or child._is_interpolation():
            continue
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            yield from _target_nodes(child, f"{path}{key}.")


def _passes_on(cls: type) -> bool:
    """Whether ``cls`` has no ``__init__`` of its own, or one that only passes ``(*args, **kwargs)`` on."""
    init = vars(cls).get("__init__")
    if init is None:
        return True
    rest = list(inspect.signature(init).parameters.values())[1:]
    return all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in rest)


@functools.cache
def _parameters(target: str) -> tuple[dict[str, Any], dict[str, Any], bool] | None:
    """The callable ``target`` names: its parameters' annotations (none where they do not resolve here),
    every parameter's default (``inspect.Parameter.empty`` without one), and whether it takes any keyword
    (``**kwargs``); None when it does not import here."""
    from hydra.utils import get_object

    try:
        obj = get_object(target)
        # a subclass that passes (*args, **kwargs) on takes what the class it extends takes
        function = (
            next((c.__init__ for c in obj.__mro__ if not _passes_on(c)), obj)
            if isinstance(obj, type)
            else obj
        )
        signature = inspect.signature(function)
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    try:
        hints = typing.get_type_hints(function)
    except (NameError, TypeError, AttributeError):
        hints = {}
    kinds = {p.kind for p in signature.parameters.values()}
    defaults = {
        name: p.default
        for name, p in signature.parameters.items()
        if name != "self" and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }
    hints = {k: v for k, v in hints.items() if k in defaults}
    return hints, defaults, inspect.Parameter.VAR_KEYWORD in kinds
