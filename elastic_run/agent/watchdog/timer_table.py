"""The watchdog's timer table: which timers are armed, and which are due at ``now``.

Pure: no clock, thread, process or pipe; the watchdog server (:mod:`elastic_run.agent.watchdog.server`)
passes ``now`` in and does the I/O. A table is immutable: every change returns a new table, so
a reader on another thread may hold one without a lock.

Invariants:
- At most one timer per ``(pid, scope_id)``: arming it again moves its deadline and signal.
- A release (a request with a negative expiration time) removes the timer, and releasing a
  timer that is not armed changes nothing.
- A timer is due when its expiration time is at or before ``now``; :meth:`TimerTable.split_due`
  returns the due timers earliest first (ties by pid, then scope) and a table without them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from elastic_run.worker.timer_wire import FileTimerRequest

__all__ = ["ArmedTimer", "TimerTable"]


@dataclass(frozen=True)
class ArmedTimer:
    """A timer the watchdog holds.

    Attributes:
        pid: the process that armed it.
        scope_id: the name of its scope.
        expiration_time: when it expires, epoch seconds.
        signal: the signal sent at expiry (0 or below: none).
    """

    pid: int
    scope_id: str
    expiration_time: float
    signal: int

    def as_request(self) -> FileTimerRequest:
        """Return the arming request this timer came from.

        Returns:
            The request, as torch's server hands to its ``log_event``.
        """
        return FileTimerRequest(self.pid, self.scope_id, self.expiration_time, self.signal)


def _order(timer: ArmedTimer) -> tuple[float, int, str]:
    return (timer.expiration_time, timer.pid, timer.scope_id)


class TimerTable:
    """The armed timers, keyed by ``(pid, scope_id)``.

    Args:
        timers: the timers to hold; a later one replaces an earlier one of the same key.
    """

    __slots__ = ("_by_key", "_earliest")
    _by_key: dict[tuple[int, str], ArmedTimer]
    _earliest: float | None

    def __init__(self, timers: Iterable[ArmedTimer] = ()) -> None:
        self._by_key = {(t.pid, t.scope_id): t for t in timers}
        # The server asks at every turn, and a table never changes: compute it once.
        self._earliest = min((t.expiration_time for t in self._by_key.values()), default=None)

    def __len__(self) -> int:
        return len(self._by_key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TimerTable) and self.armed() == other.armed()

    def __hash__(self) -> int:
        return hash(frozenset(self._by_key.items()))

    def __repr__(self) -> str:
        return f"TimerTable({list(self.armed())!r})"

    def apply(self, request: FileTimerRequest) -> TimerTable:
        """Arm or release a timer as ``request`` says.

        Args:
            request: a request from a client.

        Returns:
            The table after the request.
        """
        if request.is_release:
            return self.release(request.worker_pid, request.scope_id)
        return self.arm(
            ArmedTimer(
                request.worker_pid, request.scope_id, request.expiration_time, request.signal
            )
        )

    def arm(self, timer: ArmedTimer) -> TimerTable:
        """Hold ``timer``, replacing the one of the same pid and scope.

        Args:
            timer: the timer.

        Returns:
            The table with the timer.
        """
        by_key = dict(self._by_key)
        by_key[(timer.pid, timer.scope_id)] = timer
        return TimerTable(by_key.values())

    def release(self, pid: int, scope_id: str) -> TimerTable:
        """Drop the timer ``(pid, scope_id)`` if it is armed.

        Args:
            pid: the process.
            scope_id: the scope.

        Returns:
            The table without that timer (this table if it was not armed).
        """
        if (pid, scope_id) not in self._by_key:
            return self
        by_key = dict(self._by_key)
        del by_key[(pid, scope_id)]
        return TimerTable(by_key.values())

    def without_pids(self, pids: Iterable[int]) -> TimerTable:
        """Drop every timer of the given processes.

        Args:
            pids: the processes (exited, or stopped by the agent).

        Returns:
            The table without their timers (this table if they held none).
        """
        gone = frozenset(pids)
        if not gone & self.pids():
            return self
        return TimerTable(t for t in self._by_key.values() if t.pid not in gone)

    def split_due(self, now: float) -> tuple[tuple[ArmedTimer, ...], TimerTable]:
        """Take out the timers that are due at ``now``.

        Args:
            now: the time, epoch seconds.

        Returns:
            The due timers, earliest first, and the table of the others.
        """
        if self._earliest is None or self._earliest > now:
            return (), self
        due = sorted((t for t in self._by_key.values() if t.expiration_time <= now), key=_order)
        return tuple(due), TimerTable(t for t in self._by_key.values() if t.expiration_time > now)

    def next_expiration(self) -> float | None:
        """Return the earliest expiration time, or None when no timer is armed."""
        return self._earliest

    def armed(self) -> tuple[ArmedTimer, ...]:
        """Return the timers, earliest expiry first (ties by pid, then scope)."""
        return tuple(sorted(self._by_key.values(), key=_order))

    def pids(self) -> frozenset[int]:
        """Return the processes that hold a timer."""
        return frozenset(t.pid for t in self._by_key.values())
