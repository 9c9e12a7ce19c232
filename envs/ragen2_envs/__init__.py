"""ragen2_envs: gymnasium text environments for multi-turn LLM agents.

Importing this package registers every environment an installed package declares, ragen2's own among them
(versioned ids, ``ragen2_envs.registry``); it imports no torch, lightning or transformers (heavy backends load
lazily inside the env that needs them).
"""

from __future__ import annotations

from ragen2_envs.base import EnvStep, TextEnv, text_space
from ragen2_envs.options import Option, options
from ragen2_envs.registry import (
    ENTRY_POINT_GROUP,
    UnknownEnvError,
    declared_ids,
    env_class,
    env_options,
    make,
    own_ids,
    register_all,
)

register_all()

__all__ = [
    "ENTRY_POINT_GROUP",
    "EnvStep",
    "Option",
    "TextEnv",
    "UnknownEnvError",
    "declared_ids",
    "env_class",
    "env_options",
    "make",
    "options",
    "own_ids",
    "register_all",
    "text_space",
]
