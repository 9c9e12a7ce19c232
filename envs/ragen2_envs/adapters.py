"""What an environment adapted from another package needs: its own text space, bounded text, finite rewards and
one line when the package is not installed.

Another package's tasks print what they like (``→``, ``∫``, emoji, box drawing), as long as they like; the
agent tokenizes any text, so an adapted env accepts every character, but no observation may exceed
``MAX_TEXT``, and no reward may be nan or inf (``step`` never raises, base.py). A package whose API is async
runs on one event loop of the process's own thread (``on_loop``), so its env stays a synchronous gymnasium env
wherever it is called from (a notebook's running loop included).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import math
import os
import threading
from collections.abc import Coroutine
from types import ModuleType
from typing import Any, TypeVar

from gymnasium import spaces

from ragen2_envs.base import CHARSET, MAX_TEXT
from ragen2_envs.registry import UnknownEnvError

T = TypeVar("T")


class AnyText(spaces.Text):
    """Text of any characters up to ``max_length`` (samples still draw from ``CHARSET``)."""

    def __init__(self, max_length: int = MAX_TEXT) -> None:
        super().__init__(min_length=0, max_length=max_length, charset=CHARSET)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AnyText({self.max_length})"


def bounded(text: object, limit: int = MAX_TEXT) -> tuple[str, bool]:
    """``text`` as a string of at most ``limit`` characters, and whether it was cut."""
    text = text if isinstance(text, str) else str(text)
    if len(text) <= limit:
        return text, False
    marker = f"\n[{len(text) - limit} characters cut]"
    return text[: limit - len(marker)] + marker, True


def finite(value: object) -> tuple[float, bool]:
    """``value`` as a finite float (0.0 for nan, inf or a non-number), and whether it was one."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0, False
    return (number, True) if math.isfinite(number) else (0.0, False)


def require(module: str, env_id: str, install: str) -> ModuleType:
    """Import the package an adapted env wraps, or end with one line naming the env and the install (ragen2
    turns an ``UnknownEnvError`` into its one-line start-up error)."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise UnknownEnvError(
            f"env.id={env_id!r} adapts the {module} package, which does not import here ({err}). Fix: {install}"
        ) from None


@functools.cache
def event_loop(pid: int) -> asyncio.AbstractEventLoop:
    """The event loop of process ``pid``'s async adapters, run by a daemon thread (a forked child, whose copy
    of the thread does not run, makes its own)."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="ragen2-adapters", daemon=True).start()
    return loop


def on_loop(call: Coroutine[Any, Any, T], limit_s: float | None) -> T:
    """``call``'s result, awaited on this process's ``event_loop``."""
    future = asyncio.run_coroutine_threadsafe(call, event_loop(os.getpid()))
    try:
        return future.result(limit_s)
    except BaseException:  # a limit, or ragen2's env.step_timeout_s interrupting the wait: stop the call too
        future.cancel()
        raise
