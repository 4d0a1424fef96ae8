"""One epoch read, and one read of a round's keys per epoch, shared by the nodes of one job
that live in one process.

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
- When the epoch moved, each member reads its round's keys (the round, the closed record, the
  arrival count, the end record: ``RoundState.refresh``). Every write to them bumps the epoch
  after it, so a read of them made once epoch E was seen is as new as any other node's read for
  E would be: ``read_round_shared`` hands the last read of round r at epoch E to every node of
  the job that asks for (r, E), and reads again for any other pair. After a seal the thousand
  members of a process asked for the same four keys a thousand times; now once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

__all__ = ["read_round_shared", "read_shared"]

_LOCK = threading.Lock()
_LAST: dict[tuple[str, str, str], tuple[int, float]] = {}
_ROUND_READS: dict[tuple[str, str, str], tuple[int, int, tuple[bytes | None, ...]]] = {}


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


def read_round_shared(
    key: tuple[str, str, str],
    round_epoch: tuple[int, int],
    read: Callable[[], Sequence[bytes | None]],
) -> list[bytes | None]:
    """Round r's keys as read at epoch E (``round_epoch``) by this process, or ``read()``.

    Args:
        key: (backend name, endpoint, job id).
        round_epoch: (r, E): the round whose keys are read, and the epoch its reader saw.
        read: one read of the keys (raises as the backend does; a failure is not shared).
    """
    with _LOCK:
        last = _ROUND_READS.get(key)
    if last is not None and (last[0], last[1]) == round_epoch:
        return list(last[2])
    values = tuple(read())
    with _LOCK:
        _ROUND_READS[key] = (*round_epoch, values)
    return list(values)
