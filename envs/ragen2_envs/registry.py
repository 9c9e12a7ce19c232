"""Which environment an id names: ragen2's own, or one registered by a package outside ragen2.

An id is found, in this order:

1. ragen2's own (``ENV_IDS``), registered with gymnasium when ``ragen2_envs`` is imported;
2. an id already in gymnasium's registry (a package imported beforehand called ``gymnasium.register``);
3. an id an installed package declares in the entry-point group ``ragen2.envs``
   (``"<id>" = "<module>:<TextEnv subclass>"``), registered with gymnasium on first use; the module is
   imported only when the env is made or its options are read;
4. gymnasium's ``<module>:<id>`` form: ``<module>`` is imported first, and registers ``<id>`` itself.

Whichever way, the id must name a ``TextEnv`` subclass: the agent reads its instructions, renders its state
and asks its oracle, and ``ragen2`` checks ``env.kwargs`` against the options its constructor declares.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Mapping

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec, load_env_creator

from ragen2_envs.base import TextEnv
from ragen2_envs.options import Option, options

#: ragen2's own environments: id -> entry point; modules load only when an env is made
ENV_IDS: dict[str, str] = {
    "ragen2/Sokoban-v0": "ragen2_envs.sokoban.env:SokobanEnv",
    "ragen2/FrozenLake-v0": "ragen2_envs.frozenlake.env:FrozenLakeEnv",
    "ragen2/Bandit-v0": "ragen2_envs.bandit.env:BanditEnv",
    "ragen2/Countdown-v0": "ragen2_envs.countdown.env:CountdownEnv",
    "ragen2/MetaMathQA-v0": "ragen2_envs.metamathqa.env:MetaMathQAEnv",
    "ragen2/SearchQA-v0": "ragen2_envs.searchqa.env:SearchQAEnv",
    "ragen2/WebShop-v0": "ragen2_envs.webshop.env:WebShopEnv",
    "ragen2/DeepCoder-v0": "ragen2_envs.deepcoder.env:DeepCoderEnv",
    "ragen2/TwoHop-v0": "ragen2_envs.twohop.env:TwoHopEnv",
}
#: the entry-point group in which a package outside ragen2 declares its environments
ENTRY_POINT_GROUP = "ragen2.envs"


class UnknownEnvError(LookupError):
    """An id that names no environment, or one that is not a ``TextEnv``; the message is one line that
    names ``env.id``, its value and the fix."""


def _register(env_id: str, entry_point: str) -> None:
    if env_id not in gym.registry:
        # no TimeLimit wrapper: the agent owns max_turns, each env its own action budget
        gym.register(id=env_id, entry_point=entry_point, disable_env_checker=True)


def register_all() -> None:
    """Register ragen2's own environments with gymnasium."""
    for env_id, entry_point in ENV_IDS.items():
        _register(env_id, entry_point)


def declared_ids() -> dict[str, str]:
    """The ids installed packages declare in the ``ragen2.envs`` entry-point group -> their entry points."""
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


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
            f"of {', '.join(sorted(ENV_IDS))}, or an id your package registers (the {ENTRY_POINT_GROUP} entry "
            "points, gymnasium.register, or <module>:<id> to import the module that registers it)"
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
