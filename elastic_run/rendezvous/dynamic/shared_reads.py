"""One read of a job-wide key shared by the nodes of one job that live in one process.

Two keys are read this way, both the same for every node of a job:

- the epoch counter, by every member's liveness turn once an interval (``RoundState.refresh``,
  the safety-net read: the third of a member's three requests a second, beside its heartbeat and
  its ring successor's);
- the closed record, by every node waiting for a seal or at a round's door after each wait slice
  (``Rounds.check_closed``; the first check of a join is each node's own).

An agent holds one node, so nothing is shared there. A process that holds many nodes of one job
(a benchmark, a test, a simulator) made as many reads a second as it held nodes, all of the
same key: at 16,384 nodes the closed checks after the wait slices were most of the requests
queued on the store (issue 38). Here the first node whose turn finds no read younger than
``max_age_s`` reads it, and the others take that value.

Invariants:
- A value is shared only between nodes of the same job on the same store and for the same key
  (keyed by the backend's name, its endpoint, the job id and the key's name), and only a
  successful read is shared: a read that failed raises in the node that made it and leaves
  nothing for the others.
- A node takes a value at most ``max_age_s`` old (its handler passes half an interval), so a
  change is seen at most that much later than its own read would have seen it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["read_shared"]

T = TypeVar("T")

_LOCK = threading.Lock()
_LAST: dict[tuple[str, ...], tuple[Any, float]] = {}


def read_shared(
    key: tuple[str, ...],
    read: Callable[[], T],
    max_age_s: float,
    now: Callable[[], float],
) -> T:
    """The value under ``key``: a read of this process younger than ``max_age_s``, or ``read()``.

    Args:
        key: (backend name, endpoint, job id, key name).
        read: one read of the key (raises as the backend does).
        max_age_s: the oldest shared value taken (0: always read).
        now: the monotonic clock.
    """
    if max_age_s > 0:
        with _LOCK:
            last = _LAST.get(key)
        if last is not None and now() - last[1] < max_age_s:
            value: T = last[0]
            return value
    taken_at = now()
    value = read()
    if max_age_s > 0:
        with _LOCK:
            previous = _LAST.get(key)
            if previous is None or previous[1] <= taken_at:
                _LAST[key] = (value, taken_at)
    return value
