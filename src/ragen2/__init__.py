"""ragen2: RL of multi-turn LLM agents. ``CONF_DIR`` is here, beneath every module, so that any of them
may read the config tree's files without importing ``ragen2.config``."""

from pathlib import Path

#: ragen2's config tree, inside the package (an install without -e has it too)
CONF_DIR = Path(__file__).resolve().parent / "conf"
