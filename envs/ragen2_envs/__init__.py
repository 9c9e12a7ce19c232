"""ragen2_envs: gymnasium text environments for multi-turn LLM agents.

Importing this package registers every environment under a versioned id; it imports no torch,
lightning or transformers (heavy backends load lazily inside the env that needs them). Environments of
other packages are found by their ids too (``ragen2_envs.registry``).
"""

from __future__ import annotations

from ragen2_envs.base import TextEnv, text_space
from ragen2_envs.options import Option, options
from ragen2_envs.registry import (
    ENTRY_POINT_GROUP,
    ENV_IDS,
    UnknownEnvError,
    declared_ids,
    env_class,
    env_options,
    make,
    register_all,
)

register_all()

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_IDS",
    "Option",
    "TextEnv",
    "UnknownEnvError",
    "declared_ids",
    "env_class",
    "env_options",
    "make",
    "options",
    "register_all",
    "text_space",
]
