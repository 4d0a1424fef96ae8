"""How signals and other threads reach the agent loop: a record of signals and a wake-up pipe.

A signal handler must not act: it may run between any two bytecodes of the main thread, e.g.
between spawning a worker and recording its pid, or between two writes that must go together.
So the handler only appends the signal number to :class:`SignalLog` (``list.append`` is atomic)
and writes one byte to :class:`Waker`'s pipe (``os.write`` on a non-blocking descriptor, safe
in a handler: no lock is taken). The loop, woken, reads the log and acts.

Other threads (a worker's waiter, the rendezvous's liveness thread, the watchdog) wake the loop
the same way.

Invariants: ``Waker.wake`` never blocks and never raises; ``Waker.wait`` returns at the first
wake-up or at its timeout and drains the pipe; a closed waker ignores wake-ups.
"""

from __future__ import annotations

import os
import select
import signal
import threading
from collections.abc import Iterable

__all__ = ["FORWARD_ONLY", "SignalLog", "Waker"]

# Preemption notices (SBATCH --signal=USR1@60): forwarded to the workers, the job goes on.
FORWARD_ONLY = frozenset({signal.SIGUSR1, signal.SIGUSR2})


class Waker:
    """A self-pipe the loop waits on and anyone may write to."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._closed = False
        self._lock = threading.Lock()

    def wake(self) -> None:
        """Wake the loop (safe from a signal handler and from any thread)."""
        if self._closed:
            return
        try:
            os.write(self._w, b"x")
        except (BlockingIOError, OSError):
            pass  # full: a wake-up is pending already; closed: nobody waits any more

    def wait(self, timeout_s: float) -> bool:
        """Block until a wake-up or ``timeout_s``; return whether woken. Drains the pipe."""
        try:
            readable, _, _ = select.select([self._r], [], [], max(0.0, timeout_s))
        except InterruptedError:
            readable = [self._r]  # a signal arrived: its handler has woken us anyway
        if not readable:
            return False
        try:
            while os.read(self._r, 512):
                pass
        except BlockingIOError:
            pass
        return True

    def close(self) -> None:
        """Close the pipe. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._r)
            os.close(self._w)


class SignalLog:
    """The signals the agent received, in order; written by the handler, read by the loop.

    Args:
        forward_only: signals that are passed to the workers and do not stop the job.
    """

    def __init__(self, forward_only: Iterable[int] = FORWARD_ONLY) -> None:
        self._forward_only = frozenset(int(s) for s in forward_only)
        self._seen: list[int] = []
        self._forwarded_upto = 0

    def record(self, signum: int) -> None:
        """Record ``signum`` (the signal handler's only work besides waking the loop)."""
        self._seen.append(signum)

    def pending_stop(self) -> int | None:
        """The first terminating signal received, or None."""
        for signum in list(self._seen):
            if signum not in self._forward_only:
                return signum
        return None

    def stop_count(self) -> int:
        """How many terminating signals arrived (a second one means: no more grace)."""
        return sum(1 for signum in list(self._seen) if signum not in self._forward_only)

    def take_forwarded(self) -> list[int]:
        """The forward-only signals received since the last call, in order."""
        seen = list(self._seen)
        new = [s for s in seen[self._forwarded_upto :] if s in self._forward_only]
        self._forwarded_upto = len(seen)
        return new
