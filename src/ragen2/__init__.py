"""ragen2: RL of multi-turn LLM agents. ``CONF_DIR`` and ``user_conf_dirs`` are here, beneath every module, so
that any of them may read the config trees' files without importing ``ragen2.config``."""

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
#: ragen2's config tree: conf/ at the source tree's root (an editable install, or src/ on PYTHONPATH), which a
#: wheel ships inside the package as ragen2/conf (pyproject.toml's package-dir)
CONF_DIR = _PACKAGE / "conf" if (_PACKAGE / "conf").is_dir() else _PACKAGE.parents[1] / "conf"


def user_conf_dirs() -> list[Path]:
    """The folders of the user's own configs, ``RAGEN2_CONF=<folder>[:<folder>…]``, as given (``ragen2.config.
    user_conf`` refuses one that is not there)."""
    return [Path(f).expanduser().absolute() for f in os.environ.get("RAGEN2_CONF", "").split(os.pathsep) if f]
