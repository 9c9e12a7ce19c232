"""The error every refusal of a setting raises, and how a program ends on one.

A leaf: it imports nothing of ragen2, so any module may refuse a value without pulling in the config tree.
"""

from __future__ import annotations

import os
import sys
import typing

from hydra.errors import CompactHydraException


class ConfigError(ValueError, CompactHydraException):
    """A config value that cannot work, named with its key, its value and the fix.

    Hydra prints a compact exception as its message alone (no traceback unless ``HYDRA_FULL_ERROR=1``)."""


def exit_one_line(prog: str, err: ConfigError) -> typing.NoReturn:
    """End the process with ``<prog>: <err>`` on stderr and status 1 (``HYDRA_FULL_ERROR=1``: raise ``err``)."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise err
    sys.exit(f"{prog}: {err}")
