"""The threads that run the liveness turns of every node of a process, each turn when it is due.

A node's liveness work is one short turn per ``keep_alive_interval`` (a heartbeat write, a ring
read, an epoch read: ``turns.py``). An agent holds one node, and gets one thread for it, as
before. A process that holds many nodes (a benchmark, a test) does not get a thread per node:
the turns are queued by due time and run by at most ``MAX_WORKERS`` threads (one per node up to
that), so a thousand nodes in a process are not a thousand threads competing for its
interpreter lock, and starting a node starts no thread once the workers exist.

Invariants:
- A node's turns never overlap: a turn is taken off the queue before it runs and queued again
  after it ends (at once when it was poked meanwhile, else one interval later, or when the turn
  said).
- ``stop`` returns once the node's running turn (if any) ended, or after its bound.
- A turn's exception is logged and the worker goes on.
- The first turn of a node is drawn at random within its first interval, so nodes started
  together (by one seal) do not tick together.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Callable

__all__ = ["MAX_WORKERS", "Turns", "liveness_pool"]

log = logging.getLogger(__name__)

MAX_WORKERS = 8


class Turns:
    """One node's place in the pool: its turn and its interval.

    Args:
        turn: the node's turn (runs on a worker thread); it may return the seconds until its
            next turn (None: ``interval_s``), so a turn poked early keeps the node's cadence.
        interval_s: the time between the end of one turn and the start of the next.
    """

    def __init__(self, turn: Callable[[], float | None], interval_s: float) -> None:
        self.turn = turn
        self.interval_s = interval_s
        self.gen = 0
        self.running_on: threading.Thread | None = None
        self.stopped = False
        self.repoke = False


class _Pool:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, int, Turns]] = []
        self._seq = itertools.count()
        self._workers = 0
        self._active = 0

    def start(self, node: Turns) -> None:
        """Queue ``node``'s first turn within its first interval; add a worker if there is room."""
        with self._cond:
            self._active += 1
            while self._workers < min(MAX_WORKERS, self._active):
                self._workers += 1
                name = "elastic-run-liveness"
                threading.Thread(target=self._work, name=name, daemon=True).start()
            self._push(node, time.monotonic() + random.uniform(0.0, node.interval_s))

    def poke(self, node: Turns) -> None:
        """Run ``node``'s turn now (or again right after the one that runs)."""
        with self._cond:
            if node.stopped:
                return
            if node.running_on is not None:
                node.repoke = True
            else:
                self._push(node, time.monotonic())

    def stop(self, node: Turns, timeout_s: float) -> bool:
        """Take ``node`` off the pool; True once no turn of it runs (within ``timeout_s``)."""
        with self._cond:
            if not node.stopped:
                node.stopped = True
                self._active -= 1
            if node.running_on is threading.current_thread():
                return True  # stopped from its own turn: it ends right after
            return self._cond.wait_for(lambda: node.running_on is None, timeout_s)

    def _push(self, node: Turns, due: float) -> None:
        node.gen += 1
        heapq.heappush(self._heap, (due, next(self._seq), node.gen, node))
        self._cond.notify()

    def _next(self) -> Turns:
        with self._cond:
            while True:
                if not self._heap:
                    self._cond.wait()
                    continue
                due, _, gen, node = self._heap[0]
                if gen != node.gen or node.stopped:
                    heapq.heappop(self._heap)
                    continue
                now = time.monotonic()
                if due > now:
                    self._cond.wait(due - now)
                    continue
                heapq.heappop(self._heap)
                node.running_on = threading.current_thread()
                node.repoke = False
                if self._heap:
                    self._cond.notify()  # another due turn may wait for a worker
                return node

    def _work(self) -> None:
        while True:
            node = self._next()
            delay: float | None = None
            try:
                delay = node.turn()
            except Exception:
                log.exception("a rendezvous liveness turn failed; going on")
            with self._cond:
                node.running_on = None
                if not node.stopped:
                    later = node.interval_s if delay is None else max(0.0, delay)
                    wait = 0.0 if node.repoke else later
                    self._push(node, time.monotonic() + wait)
                self._cond.notify_all()


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()


def liveness_pool() -> _Pool:
    """This process's pool (its workers start with its first node)."""
    global _POOL
    pool = _POOL
    if pool is not None:
        return pool  # no lock: a thousand nodes starting at once queued on it, one at a time
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = _Pool()
        return _POOL


def _forget_after_fork() -> None:
    # A forked child has none of the workers: the next node starts a pool of its own.
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
