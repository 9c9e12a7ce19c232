"""ragen2: RL of multi-turn LLM agents. ``CONF_DIR`` and ``user_conf_dirs`` are here, beneath every module, so
that any of them may read the config trees' files without importing ``ragen2.config``."""

import os
from pathlib import Path

#: ragen2's config tree, inside the package (an install without -e has it too)
CONF_DIR = Path(__file__).resolve().parent / "conf"


def user_conf_dirs() -> list[Path]:
    """The folders of the user's own configs, ``RAGEN2_CONF=<folder>[:<folder>…]``, as given (``ragen2.config.
    user_conf`` refuses one that is not there)."""
    return [Path(f).expanduser().absolute() for f in os.environ.get("RAGEN2_CONF", "").split(os.pathsep) if f]
