"""One epoch read shared by the nodes of one job that live in one process.

Every member's liveness turn reads the job's epoch counter once an interval (``RoundState.refresh``,
the safety-net read: the third of a member's three requests a second, beside its heartbeat and
its ring successor's). An agent holds one node, so nothing is shared there. A process that holds
many nodes of one job (a benchmark, a test, a simulator) made as many epoch reads a second as it
held nodes, all of the same counter: here the first node whose turn finds no read younger than
``max_age_s`` reads it, and the others take that value.

Invariants:
- A value is shared only between nodes of the same job on the same store (keyed by the backend's
  name, its endpoint and the job id), and only a successful read is shared: a read that failed or
  found garbage is each node's own (it raises there, as it did).
- A node takes a value at most ``max_age_s`` old (its handler passes half an interval), so a
  change is seen at most that much later than its own read would have seen it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["read_shared"]

_LOCK = threading.Lock()
_LAST: dict[tuple[str, str, str], tuple[int, float]] = {}


def read_shared(
    key: tuple[str, str, str],
    read: Callable[[], int],
    max_age_s: float,
    now: Callable[[], float],
) -> int:
    """The epoch under ``key``: a read of this process younger than ``max_age_s``, or ``read()``.

    Args:
        key: (backend name, endpoint, job id).
        read: one read of the counter (raises as the backend does).
        max_age_s: the oldest shared value taken (0: always read).
        now: the monotonic clock.
    """
    if max_age_s > 0:
        with _LOCK:
            last = _LAST.get(key)
        if last is not None and now() - last[1] < max_age_s:
            return last[0]
    taken_at = now()
    value = read()
    if max_age_s > 0:
        with _LOCK:
            previous = _LAST.get(key)
            if previous is None or previous[1] <= taken_at:
                _LAST[key] = (value, taken_at)
    return value
