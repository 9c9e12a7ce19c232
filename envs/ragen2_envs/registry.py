"""Which environment an id names: ragen2's own, or one registered by a package outside ragen2.

An id is found, in this order:

1. an id an installed package declares in the entry-point group ``ragen2.envs``
   (``"<id>" = "<module>:<TextEnv subclass>"``), registered with gymnasium when ``ragen2_envs`` is imported
   (or on first use, for a package installed after that); the module is imported only when the env is made
   or its options are read. ragen2 declares its own this way (``own_ids``: pyproject.toml, read from the
   source tree where ragen2 is not installed), so built-in and user environments take one path;
2. an id already in gymnasium's registry (a package imported beforehand called ``gymnasium.register``);
3. gymnasium's ``<module>:<id>`` form: ``<module>`` is imported first, and registers ``<id>`` itself.

Whichever way, the id must name a ``TextEnv`` subclass: the agent reads its instructions, renders its state
and asks its oracle, and ``ragen2`` checks ``env.kwargs`` against the options its constructor declares.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import tomllib
from collections.abc import Mapping
from pathlib import Path

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec, load_env_creator

from ragen2_envs.base import TextEnv
from ragen2_envs.options import Option, options

#: the entry-point group in which a package declares its environments (ragen2 its own, pyproject.toml)
ENTRY_POINT_GROUP = "ragen2.envs"
#: the source tree's pyproject.toml, read where ragen2 runs from its source folders uninstalled
SOURCE_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


class UnknownEnvError(LookupError):
    """An id that names no environment, or one that is not a ``TextEnv``; the message is one line that
    names ``env.id``, its value and the fix."""


def _register(env_id: str, entry_point: str) -> None:
    if env_id not in gym.registry:
        # no TimeLimit wrapper: the agent owns max_turns, each env its own action budget
        gym.register(id=env_id, entry_point=entry_point, disable_env_checker=True)


def declared_ids(dist: str | None = None) -> dict[str, str]:
    """The ids installed packages declare in the ``ragen2.envs`` entry-point group -> their entry points;
    ``dist`` keeps one distribution's."""
    return {
        ep.name: ep.value
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        if dist is None or (ep.dist is not None and ep.dist.name == dist)
    }


def source_ids(pyproject: Path = SOURCE_PYPROJECT) -> dict[str, str]:
    """The ids a source tree's ``pyproject.toml`` declares in the ``ragen2.envs`` group (none where there is
    no such file): ragen2 run from its source folders on ``PYTHONPATH``, not installed (scripts/gpu_check.sh),
    has no installed metadata to read them from."""
    if not pyproject.is_file():
        return {}
    entry_points = tomllib.loads(pyproject.read_text())["project"].get("entry-points", {})
    return dict(entry_points.get(ENTRY_POINT_GROUP, {}))


def own_ids() -> dict[str, str]:
    """ragen2's own environments (the ids its installed distribution declares, else its source tree's) ->
    their entry points."""
    return declared_ids("ragen2") or source_ids()


def register_all() -> None:
    """Register every declared environment with gymnasium (their modules load only when an env is made)."""
    for env_id, entry_point in {**own_ids(), **declared_ids()}.items():
        _register(env_id, entry_point)


def _spec(env_id: str) -> EnvSpec:
    """gymnasium's spec for ``env_id``, registering a declared id and importing a ``<module>:`` prefix."""
    module, _, name = env_id.rpartition(":")
    if name not in gym.registry:
        declared = declared_ids()
        if name in declared:
            _register(name, declared[name])
        elif module:
            try:
                importlib.import_module(module)
            except ImportError as err:
                raise UnknownEnvError(
                    f"env.id={env_id!r}: its module {module!r} does not import ({err}). Fix: install the "
                    f"package that holds {module}, or put its folder on PYTHONPATH"
                ) from None
    spec = gym.registry.get(name)
    if spec is None:
        raise UnknownEnvError(
            f"env.id={env_id!r} is not a ragen2 environment. Fix: env=<name> (a config of the env group), an id "
            f"of {', '.join(sorted(own_ids()))}, or an id your package registers (the {ENTRY_POINT_GROUP} entry points, "
            "gymnasium.register, or <module>:<id> to import the module that registers it)"
        )
    return spec


def _resolve(env_id: str) -> tuple[EnvSpec, type[TextEnv]]:
    """gymnasium's spec for ``env_id`` and the ``TextEnv`` subclass it makes."""
    spec = _spec(env_id)
    creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    if not (isinstance(creator, type) and issubclass(creator, TextEnv)):
        raise UnknownEnvError(
            f"env.id={env_id!r} names {spec.entry_point!r}, which is not a ragen2_envs.TextEnv subclass (the "
            "agent reads its instructions, its rendered state and its oracle). Fix: register a TextEnv "
            "subclass under that id"
        )
    return spec, creator


def env_class(env_id: str) -> type[TextEnv]:
    """The ``TextEnv`` subclass ``env_id`` names (where ids are found: the module's docstring)."""
    return _resolve(env_id)[1]


def env_options(env_id: str) -> Mapping[str, Option]:
    """The options the environment ``env_id``'s constructor declares (``ragen2_envs.options``), by name."""
    return options(env_class(env_id))


def make(env_id: str, **kwargs: object) -> TextEnv:
    """A new instance of the environment ``env_id`` (unwrapped: no gymnasium wrappers)."""
    spec, _ = _resolve(env_id)
    return gym.make(spec.id, disable_env_checker=True, **kwargs).unwrapped  # type: ignore[return-value]
