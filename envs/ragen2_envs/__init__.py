"""ragen2_envs: gymnasium text environments for multi-turn LLM agents.

Importing this package registers every environment under a versioned id; it imports no torch,
lightning or transformers (heavy backends load lazily inside the env that needs them).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

import gymnasium as gym

from ragen2_envs.base import TextEnv, text_space
from ragen2_envs.options import Option, options

#: id -> entry point; modules load only when an env is made
ENV_IDS: dict[str, str] = {
    "ragen2/Sokoban-v0": "ragen2_envs.sokoban.env:SokobanEnv",
    "ragen2/FrozenLake-v0": "ragen2_envs.frozenlake.env:FrozenLakeEnv",
    "ragen2/Bandit-v0": "ragen2_envs.bandit.env:BanditEnv",
    "ragen2/Countdown-v0": "ragen2_envs.countdown.env:CountdownEnv",
    "ragen2/MetaMathQA-v0": "ragen2_envs.metamathqa.env:MetaMathQAEnv",
    "ragen2/SearchQA-v0": "ragen2_envs.searchqa.env:SearchQAEnv",
    "ragen2/WebShop-v0": "ragen2_envs.webshop.env:WebShopEnv",
    "ragen2/DeepCoder-v0": "ragen2_envs.deepcoder.env:DeepCoderEnv",
}


def register_all() -> None:
    for env_id, entry_point in ENV_IDS.items():
        if env_id not in gym.registry:
            # no TimeLimit wrapper: the agent owns max_turns, each env its own action budget
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=True)


def env_options(env_id: str) -> Mapping[str, Option]:
    """The options the environment ``env_id``'s constructor declares (``ragen2_envs.options``), by name."""
    module, _, name = ENV_IDS[env_id].partition(":")
    return options(getattr(importlib.import_module(module), name))


def make(env_id: str, **kwargs: object) -> TextEnv:
    """``gym.make`` unwrapped, with a clear error for an unknown id."""
    if env_id not in ENV_IDS:
        known = ", ".join(sorted(ENV_IDS))
        raise KeyError(f"env.id={env_id!r} is not a ragen2 environment; use one of: {known}")
    return gym.make(env_id, **kwargs).unwrapped  # type: ignore[return-value]


register_all()

__all__ = ["ENV_IDS", "Option", "TextEnv", "env_options", "make", "register_all", "text_space"]
