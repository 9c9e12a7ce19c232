"""call_with_timeout: a SIGALRM timer in the main thread, a worker thread elsewhere, timers armed before.

pytest-timeout itself runs each test under a SIGALRM timer, so every test here also checks that the
limit hands that timer back intact.

On a loaded machine a timer fires late, never early, and any two statements can lie far apart: each time is
checked against bounds measured around it (or with a lower bound and a generous upper one that only a
broken limit would pass), not against a fixed tolerance.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import pytest

from ragen2.agent.timeout import EnvTimeout, call_with_timeout


class OuterFired(Exception):
    pass


@contextmanager
def outer_timer(delay: float, handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """Arm a timer of our own on top of pytest-timeout's, and give pytest-timeout its own back after."""
    saved_handler = signal.getsignal(signal.SIGALRM)
    saved_delay, saved_interval = signal.getitimer(signal.ITIMER_REAL)
    start = time.monotonic()
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, delay)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, saved_handler)
        if saved_delay > 0:
            left = max(saved_delay - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, saved_interval)


def _raise(signum: int, frame: FrameType | None) -> None:
    raise OuterFired


def test_a_call_in_time_returns_and_its_errors_pass_through() -> None:
    assert call_with_timeout(lambda x, y=0: x + y, 1.0, 2, y=3) == 5
    with pytest.raises(KeyError, match="boom"):
        call_with_timeout({}.__getitem__, 1.0, "boom")
    assert call_with_timeout(lambda: "no limit", None) == "no limit"
    assert call_with_timeout(lambda: "no limit", 0) == "no limit"


@pytest.mark.timeout(20, method="signal")
def test_pytest_timeouts_timer_is_handed_back() -> None:
    handler = signal.getsignal(signal.SIGALRM)
    outer_start = time.monotonic()
    before, _ = signal.getitimer(signal.ITIMER_REAL)
    inner_start = time.monotonic()
    assert before > 0, "pytest-timeout arms a SIGALRM timer for each test"
    with pytest.raises(EnvTimeout):
        call_with_timeout(time.sleep, 0.2, 30)
    assert call_with_timeout(sum, 0.2, [1, 2]) == 3
    inner = time.monotonic() - inner_start
    after, _ = signal.getitimer(signal.ITIMER_REAL)
    outer = time.monotonic() - outer_start
    assert signal.getsignal(signal.SIGALRM) is handler
    # the timer ran on by the time that passed between the two readings: at least `inner` (≥ 0.2 s), at most
    # `outer` (were it re-armed with its old value, or not at all, the first or the second bound would fail)
    assert inner - 0.01 <= before - after <= outer + 0.01


@pytest.mark.timeout(20)
def test_an_earlier_outer_deadline_fires_first() -> None:
    start = time.monotonic()
    with outer_timer(0.2, _raise), pytest.raises(OuterFired):
        call_with_timeout(time.sleep, 5.0, 30)
    assert time.monotonic() - start < 4.0  # well before the limit's 5 s, however late the outer timer fired


@pytest.mark.timeout(20)
def test_an_outer_timer_that_returns_does_not_cancel_the_limit() -> None:
    fired: list[float] = []
    start = time.monotonic()
    with outer_timer(0.2, lambda signum, frame: fired.append(time.monotonic() - start)):
        with pytest.raises(EnvTimeout):
            call_with_timeout(time.sleep, 0.6, 30)
        took = time.monotonic() - start
    (at,) = fired  # once, at 0.2 s or (on a loaded machine) later, and before the limit ended the call
    assert 0.2 - 0.01 <= at < took
    assert 0.6 - 0.01 <= took < 10.0  # the limit held (cancelled, the 30 s sleep would have run on)


@pytest.mark.timeout(20)
def test_a_later_outer_deadline_is_rearmed_with_what_is_left() -> None:
    handler_calls: list[int] = []
    start = time.monotonic()
    with outer_timer(5.0, lambda signum, frame: handler_calls.append(signum)):
        with pytest.raises(EnvTimeout):
            call_with_timeout(time.sleep, 0.3, 30)
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        passed = time.monotonic() - start
        assert signal.getsignal(signal.SIGALRM).__name__ == "<lambda>"
    # re-armed with what was left: 5 s less the time passed (at least the limit's 0.3 s)
    assert 5.0 - passed - 0.01 <= left <= 4.7 + 0.01 and handler_calls == []


@pytest.mark.timeout(20)
def test_off_the_main_thread_a_worker_thread_is_stopped() -> None:
    results: dict[str, Any] = {}

    def spin() -> None:
        while True:
            with contextlib.suppress(Exception):  # careless env code: the stop request is not an Exception
                sum(range(100))

    def caller() -> None:
        results["value"] = call_with_timeout(lambda: 7, 1.0)
        start = time.monotonic()
        try:
            call_with_timeout(spin, 0.3)
        except EnvTimeout:
            results["timed_out_after"] = time.monotonic() - start
        try:
            call_with_timeout(int, 1.0, "x")
        except ValueError as err:
            results["error"] = err

    thread = threading.Thread(target=caller)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert results["value"] == 7 and isinstance(results["error"], ValueError)
    assert 0.3 - 0.01 <= results["timed_out_after"] < 5.0  # stopped: the spinning call never returns
    deadline = time.monotonic() + 5
    while any(t.name == "ragen2-env-call" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "ragen2-env-call" for t in threading.enumerate())
