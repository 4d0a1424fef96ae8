"""One read of a job-wide key shared by the nodes of one job that live in one process.

Two keys are read this way, both the same for every node of a job:

- the epoch counter, by every member's liveness turn once an interval (``RoundState.refresh``,
  the safety-net read: the third of a member's three requests a second, beside its heartbeat and
  its ring successor's);
- the closed record, by every node waiting for a seal or at a round's door when its look after a
  wait slice is due (``Rounds.check_closed``; the first check of a join is each node's own).

An agent holds one node, so nothing is shared there. A process that holds many nodes of one job
(a benchmark, a test, a simulator) made as many reads a second as it held nodes, all of the
same key: at 16,384 nodes the closed checks after the wait slices were most of the requests
queued on the store (issue 38). Here the first node whose turn finds no read younger than
``max_age_s`` reads it, and the others take that value.

Invariants:
- A value is shared only between nodes of the same job on the same store and for the same key
  (keyed by the backend's name, its endpoint, the job id and the key's name), and only a
  successful read is shared: a read that failed raises in the node that made it, and the nodes
  that waited for it read for themselves (each through its own link, which may be sound, and
  its own error handling: a broken link is remade by the backend whose call found it broken).
- One read of a key is under way at a time: a node that finds no fresh value while one is
  under way waits for it, so a slow store gets one read however many nodes look (at 16,384
  nodes a read took seconds, and every node whose look came meanwhile read again).
- A value is taken up to ``max_age_s`` after its read ended (its handler passes half an
  interval), so a change is seen at most that much, plus one read's length, later than a node's
  own read would have seen it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["read_shared"]

T = TypeVar("T")


class _Flight:
    """One read under way: the nodes that found no fresh value meanwhile wait for it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False
        self.value: Any = None


_LOCK = threading.Lock()
_LAST: dict[tuple[str, ...], tuple[Any, float]] = {}
_FLIGHTS: dict[tuple[str, ...], _Flight] = {}


def read_shared(
    key: tuple[str, ...],
    read: Callable[[], T],
    max_age_s: float,
    now: Callable[[], float],
) -> T:
    """The value under ``key``: this process's last read, if it ended under ``max_age_s`` ago;
    else the read under way, if one is; else ``read()``.

    Args:
        key: (backend name, endpoint, job id, key name).
        read: one read of the key (raises as the backend does).
        max_age_s: how long a read's value is taken after it ended (0: always read).
        now: the monotonic clock.
    """
    if max_age_s <= 0:
        return read()
    with _LOCK:
        last = _LAST.get(key)
        if last is not None and now() - last[1] < max_age_s:
            fresh: T = last[0]
            return fresh
        flight = _FLIGHTS.get(key)
        mine = flight is None
        if flight is None:
            flight = _FLIGHTS[key] = _Flight()
    if not mine:
        flight.done.wait()
        if flight.ok:
            shared: T = flight.value
            return shared
        return read()  # that read failed: this node's own raises (or succeeds) for itself
    try:
        value = read()
        with _LOCK:
            _LAST[key] = (value, now())
        flight.ok, flight.value = True, value
        return value
    finally:  # whatever ended the read (an interrupt too), its waiters are let go
        with _LOCK:
            if _FLIGHTS.get(key) is flight:
                del _FLIGHTS[key]
        flight.done.set()
