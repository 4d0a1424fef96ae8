"""The one clock of the package: monotonic time, and every pause and timed wait.

Code that must wait for a while waits on a condition through a :class:`Clock` (``wait``: it
returns as soon as the predicate holds, or once the time is up), never in a bare
``time.sleep``; the one plain pause (``Clock.sleep``, :func:`sleep`) is for a poll that has
nothing to wait on (a thread state read from ``/proc``, a retry after an error). ruff's
banned-api rule holds it: ``time.sleep`` is forbidden everywhere in the package but here.

A component that decides on time takes a clock (``clock: Clock = SYSTEM_CLOCK``), so a logic
test passes a :class:`~elastic_run.clock.fake.FakeClock` that moves only when the test says,
instead of patching ``time``. A clock is also a plain callable returning the monotonic time,
so it goes wherever a ``Callable[[], float]`` is asked for.

May import: the standard library only (it runs in agents and inside workers alike).
Owns ``fake.py`` (the fake clock for tests).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["SYSTEM_CLOCK", "Clock", "sleep"]


class Clock:
    """The system's monotonic clock, and the timed waits measured on it."""

    def __call__(self) -> float:
        """The monotonic time in seconds (so a clock is a ``Callable[[], float]``)."""
        return self.now()

    def now(self) -> float:
        """The monotonic time in seconds."""
        return time.monotonic()

    def wait(
        self, cond: threading.Condition, predicate: Callable[[], bool], timeout_s: float
    ) -> bool:
        """Wait on ``cond`` (held by the caller) until ``predicate`` holds or ``timeout_s`` passed.

        Whoever changes what ``predicate`` reads notifies ``cond``; so does a fake clock that
        moves past the deadline.

        Args:
            cond: the condition, acquired by the caller.
            predicate: what is waited for.
            timeout_s: the longest wait in seconds (0 or less: just look).

        Returns:
            Whether ``predicate`` holds.
        """
        return cond.wait_for(predicate, max(0.0, timeout_s))

    def wait_event(self, event: threading.Event, timeout_s: float) -> bool:
        """Wait until ``event`` is set or ``timeout_s`` passed; return whether it is set."""
        return event.wait(max(0.0, timeout_s))

    def sleep(self, seconds: float) -> None:
        """Pause for ``seconds``: only for a poll that has no condition or event to wait on."""
        if seconds > 0:
            time.sleep(seconds)


SYSTEM_CLOCK = Clock()
"""The clock every component uses unless a test passes another."""


def sleep(seconds: float) -> None:
    """Pause for ``seconds`` on the system clock (see :meth:`Clock.sleep`)."""
    SYSTEM_CLOCK.sleep(seconds)
