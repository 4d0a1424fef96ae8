"""FakeClock: a clock that moves only when a test says, for logic tests of timed code.

A component built with a ``FakeClock`` reads its time and waits its timed waits on it: a wait
returns when its predicate holds (someone notified the condition) or once the test advanced the
clock past the wait's deadline (``advance`` notifies every condition waited on). So a test of a
30 s last call advances 30 s instead of waiting them, and nothing patches ``time``. Waits for
the predicate itself (a store write by another thread) still happen in real time.

A test that advances step by step lets the threads under test settle between steps:
:meth:`FakeClock.waiting` counts the timed waits that have looked at the current time and are
blocked again (``tests.helpers.wait_until(lambda: clock.waiting() >= 2, ...)``).

Invariant: the time only moves forward, and only by :meth:`FakeClock.advance`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from elastic_run.clock import Clock

__all__ = ["FakeClock"]


class FakeClock(Clock):
    """A monotonic clock under a test's control.

    Args:
        start_s: the time it reads at first.
    """

    def __init__(self, start_s: float = 1000.0) -> None:
        self._now = start_s
        self._lock = threading.Lock()
        self._conds: dict[int, tuple[threading.Condition, int]] = {}  # id -> (cond, waits)
        self._blocked: dict[int, float] = {}  # wait -> the time it saw before it blocked
        self._tokens = iter(range(1 << 62))
        self._sleepers = threading.Condition()

    def now(self) -> float:
        """The fake time."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the time forward by ``seconds`` and wake every timed wait, to look again.

        Raises:
            ValueError: ``seconds`` is negative or not finite.
        """
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"a clock moves forward only (advance {seconds!r})")
        with self._lock:
            self._now += seconds
            conds = [cond for cond, _ in self._conds.values()]
        for cond in [*conds, self._sleepers]:
            with cond:
                cond.notify_all()

    def waiting(self) -> int:
        """How many timed waits are blocked after looking at the current time (settled)."""
        with self._lock:
            return sum(1 for seen in self._blocked.values() if seen == self._now)

    def wait(
        self, cond: threading.Condition, predicate: Callable[[], bool], timeout_s: float
    ) -> bool:
        """Wait on ``cond`` until ``predicate`` holds or the fake time passed the deadline."""
        deadline = self._now + max(0.0, timeout_s)
        key = id(cond)
        with self._lock:
            token = next(self._tokens)
            _, count = self._conds.get(key, (cond, 0))
            self._conds[key] = (cond, count + 1)
        try:
            while True:
                if predicate():
                    return True
                with self._lock:
                    if self._now >= deadline:
                        return False
                    self._blocked[token] = self._now
                cond.wait()  # the caller holds cond, so an advance cannot slip in before
                with self._lock:
                    self._blocked.pop(token, None)
        finally:
            with self._lock:
                self._blocked.pop(token, None)
                _, count = self._conds[key]
                if count > 1:
                    self._conds[key] = (cond, count - 1)
                else:
                    del self._conds[key]

    def wait_event(self, event: threading.Event, timeout_s: float) -> bool:
        """Wait until ``event`` is set or the fake time passed the deadline.

        The event is looked at whenever the clock moves: a test that sets it also advances the
        clock (by 0 s will do) to wake the wait at once.
        """
        with self._sleepers:
            return self.wait(self._sleepers, event.is_set, timeout_s)

    def sleep(self, seconds: float) -> None:
        """Return once the fake time moved ``seconds`` on."""
        self.wait_event(threading.Event(), seconds)
