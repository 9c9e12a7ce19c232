"""A wall-clock limit on one call into environment code (``env.step_timeout_s``).

An env is arbitrary Python (possibly a C extension) running in the trainer's own process, so a hung
``reset`` or ``step`` cannot be killed, only interrupted:

- In the main thread (where ``ragen2-train``, ``ragen2-eval`` and notebooks run the episode runner), a
  ``SIGALRM`` timer (``signal.setitimer``) raises inside the call. It ends pure-Python loops, sleeps and
  blocking system calls at once and starts no thread (a thread left spinning would hold the GIL against
  the rest of the run); it adds about 0.1 ms to a call. A timer armed before (pytest-timeout's, an
  enclosing limit's) keeps its deadline and handler: whichever deadline comes first fires, and the outer
  timer is re-armed with what is left of it when the call returns.
- Off the main thread (signals reach the main thread only; on platforms without ``setitimer``; or when
  C code owns the SIGALRM handler) the call runs in a daemon worker thread. At the deadline the caller
  stops waiting and the worker is sent an asynchronous exception, which ends it at its next Python
  instruction; a sleep or a C call runs to its end first, and the thread is abandoned.

Neither stops C code that holds the GIL and never returns to the interpreter. Under DDP the process-group
timeout (``trainer.strategy.timeout``) makes such a rank an error rather than a job that hangs.
"""

from __future__ import annotations

import ctypes
import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

# ITIMER_REAL and time.monotonic both follow the monotonic clock; the margin absorbs rounding only
_SLACK_S = 1e-3


class EnvTimeout(TimeoutError):
    """A call into environment code did not return within its limit."""


class _Expired(BaseException):
    """Raised inside the timed call: a BaseException, so env code's ``except Exception`` cannot swallow it."""


def call_with_timeout(fn: Callable[..., T], seconds: float | None, /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, or ``EnvTimeout`` once it has run ``seconds`` (None or 0: no limit)."""
    if not seconds:
        return fn(*args, **kwargs)
    in_main = threading.current_thread() is threading.main_thread()
    # getsignal is None when C code installed the handler: it could not be put back
    if in_main and hasattr(signal, "setitimer") and signal.getsignal(signal.SIGALRM) is not None:
        return _with_alarm(fn, seconds, args, kwargs)
    return _in_thread(fn, seconds, args, kwargs)


@dataclass(repr=False)  # signal.signal formats its handler's repr on every call
class _Alarm:
    deadline: float  # time.monotonic() at which the call has run out of time
    outer: float  # the earlier timer's deadline (inf without one)
    previous: Any  # the earlier SIGALRM handler
    armed: bool = True
    outer_fired: bool = False

    def on_alarm(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if not self.outer_fired and now >= self.outer - _SLACK_S:
            self.outer_fired = True
            _deliver(self.previous, signum, frame)  # may raise (pytest-timeout fails the test): let it
        if not self.armed:
            return
        if now >= self.deadline - _SLACK_S:
            self.armed = False  # raise once: a late alarm in the caller's clean-up is ignored
            raise _Expired
        _arm(self.deadline - now)


def _deliver(handler: Any, signum: int, frame: FrameType | None) -> None:
    """What the earlier timer's owner asked SIGALRM to do."""
    if callable(handler):
        handler(signum, frame)
    elif handler == signal.SIG_DFL:  # the default action: end the process
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGALRM)


def _arm(delay: float) -> None:
    signal.setitimer(signal.ITIMER_REAL, max(delay, 1e-6))  # 0 would disarm


def _with_alarm(fn: Callable[..., T], seconds: float, args: tuple, kwargs: dict[str, Any]) -> T:
    outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    start = time.monotonic()
    alarm = _Alarm(
        deadline=start + seconds,
        outer=start + outer_delay if outer_delay > 0 else math.inf,
        previous=signal.getsignal(signal.SIGALRM),
    )
    signal.signal(signal.SIGALRM, alarm.on_alarm)
    _arm(min(alarm.deadline, alarm.outer) - start)
    try:
        try:
            return fn(*args, **kwargs)
        finally:
            alarm.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Expired:
        raise EnvTimeout(f"no return within {seconds:g} s") from None
    finally:
        signal.signal(signal.SIGALRM, alarm.previous)
        if not alarm.outer_fired and alarm.outer < math.inf:
            signal.setitimer(signal.ITIMER_REAL, max(alarm.outer - time.monotonic(), 1e-6), outer_interval)
        elif alarm.outer_fired and outer_interval > 0:
            signal.setitimer(signal.ITIMER_REAL, outer_interval, outer_interval)


def _in_thread(fn: Callable[..., T], seconds: float, args: tuple, kwargs: dict[str, Any]) -> T:
    result: list[T] = []
    error: list[BaseException] = []

    def work() -> None:
        try:
            result.append(fn(*args, **kwargs))
        except _Expired:
            pass  # stopped after its caller gave up on it
        except BaseException as err:
            error.append(err)

    worker = threading.Thread(target=work, name="ragen2-env-call", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        assert worker.ident is not None
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(_Expired))
        raise EnvTimeout(f"no return within {seconds:g} s (the call is left to a daemon thread)")
    if error:
        raise error[0]
    return result[0]
