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
- ``has_peers`` says whether other nodes of a node's group share the pool: a node alone in its
  group (an agent's) is poked to read its new successor's record at once; nodes that share one
  read theirs in their next batch, all in one request (poked one by one, each would take a
  batch of its own).
- Nodes of one group (one job's nodes on one store, ``Turns.group``) due within half an
  interval of each other run in one batch (``Turns.batch``): a process holding a thousand
  nodes of a job writes their heartbeats in one request, not a thousand. A batch's nodes are
  queued again one interval after the batch began, so they stay together from then on.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Hashable, Sequence

__all__ = ["MAX_WORKERS", "Turns", "liveness_pool"]

log = logging.getLogger(__name__)

MAX_WORKERS = 8


class Turns:
    """One node's place in the pool: its turn and its interval.

    Args:
        turn: the node's turn (runs on a worker thread); it may return the seconds until its
            next turn (None: ``interval_s``), so a turn poked early keeps the node's cadence.
        interval_s: the time between the end of one turn and the start of the next.
        group: nodes whose turns may run together (None: never with another): when one of a
            group is due, the others of its group due within half an interval run with it, in
            one call of ``batch``.
        batch: runs the shared part of the turns of several nodes of one group (the ``Turns``
            given, each with its ``owner``) and returns, in their order, each node's own rest
            of the turn, which returns its delay as ``turn`` does.
        owner: what ``batch`` needs of the node (its liveness thread).
    """

    def __init__(
        self,
        turn: Callable[[], float | None],
        interval_s: float,
        *,
        group: Hashable | None = None,
        batch: Callable[[Sequence[Turns]], Sequence[Callable[[], float | None]]] | None = None,
        owner: object = None,
    ) -> None:
        self.turn = turn
        self.interval_s = interval_s
        self.group = group if batch is not None else None
        self.batch = batch
        self.owner = owner
        self.gen = 0
        self.running_on: threading.Thread | None = None
        self.idle = threading.Event()  # set while no turn of it runs (what a stop waits for)
        self.idle.set()
        self.queued_rest = False  # in a batch, waiting for its own part to begin
        self.poked = False  # queued by a poke: runs alone, at once
        self.stopped = False
        self.repoke = False


class _Pool:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, int, Turns]] = []
        self._seq = itertools.count()
        self._workers = 0
        self._active = 0
        self._in_group: dict[Hashable, int] = {}  # the started, unstopped nodes of each group

    def start(self, node: Turns) -> None:
        """Queue ``node``'s first turn within its first interval; add a worker if there is room."""
        with self._cond:
            self._active += 1
            if node.group is not None:
                self._in_group[node.group] = self._in_group.get(node.group, 0) + 1
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
                node.poked = True
                self._push(node, time.monotonic())

    def has_peers(self, node: Turns) -> bool:
        """Whether other started nodes of ``node``'s group share this pool. Read without the
        lock: a thousand nodes that one seal woke would queue on it."""
        return node.group is not None and self._in_group.get(node.group, 0) > 1

    def stop(self, node: Turns, timeout_s: float) -> bool:
        """Take ``node`` off the pool; True once no turn of it runs (within ``timeout_s``)."""
        with self._cond:
            if not node.stopped:
                node.stopped = True
                self._active -= 1
                if node.group is not None:
                    left = self._in_group.get(node.group, 1) - 1
                    if left > 0:
                        self._in_group[node.group] = left
                    else:
                        self._in_group.pop(node.group, None)
            if node.running_on is threading.current_thread():
                return True  # stopped from its own turn: it ends right after
            if node.queued_rest:  # a batch's shared part is over and its own part not begun
                node.queued_rest = False
                node.running_on = None
                node.idle.set()
        # Its own event, not the pool's condition: a thousand nodes stopping at once are not all
        # woken at each release of one of them.
        return node.idle.wait(timeout_s)

    def _push(self, node: Turns, due: float) -> None:
        node.gen += 1
        heapq.heappush(self._heap, (due, next(self._seq), node.gen, node))
        self._cond.notify()

    def _next(self) -> list[Turns]:
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
                # A poked turn runs alone: it is a look a notice asked for, and the others'
                # turns are not due (were they taken, their reads could come before their own
                # notices' looks).
                alone = node.poked
                taken = (
                    [node] if alone else [node, *self._group_due(node, now + node.interval_s / 2)]
                )
                for one in taken:
                    one.poked = False
                    one.running_on = threading.current_thread()
                    one.idle.clear()
                    one.repoke = False
                if self._heap:
                    self._cond.notify()  # another due turn may wait for a worker
                return taken

    def _group_due(self, node: Turns, horizon: float) -> list[Turns]:
        """Take the queued nodes of ``node``'s group due by ``horizon`` (their entries go stale)."""
        if node.group is None:
            return []
        taken: list[Turns] = []
        for due, _, gen, other in self._heap:
            if (
                due <= horizon
                and other.group == node.group
                and gen == other.gen
                and not other.stopped
                and not other.poked
                and other is not node
            ):
                other.gen += 1  # its queued entry is dropped when it comes up
                taken.append(other)
        return taken

    def _work(self) -> None:
        while True:
            taken = self._next()
            if len(taken) == 1 or taken[0].batch is None:
                self._release(taken[0], _run(taken[0].turn))
                continue
            began = time.monotonic()
            rests: Sequence[Callable[[], float | None]] | None = None
            try:
                rests = taken[0].batch(taken)
            except Exception:
                log.exception("a rendezvous liveness batch failed; going on")
            if rests is None or len(rests) != len(taken):
                rests = [lambda: None] * len(taken)
            # Each node is released as soon as its own part ended; one stopped while it waits
            # for its part is released by the stop itself (``queued_rest``), so a stop waits
            # for the shared part at most, not for the parts of the nodes before it.
            with self._cond:
                for node in taken:
                    node.queued_rest = True
            for node, rest in zip(taken, rests, strict=True):
                with self._cond:
                    if not node.queued_rest:
                        continue  # stopped meanwhile, and released by its stop
                    node.queued_rest = False
                    stopped = node.stopped  # during the shared part
                # The next turn counts from the batch's start, not from this part's end: the
                # parts before it must not slow this node's heartbeat down (much: _release).
                self._release(node, None if stopped else _run(rest), since=began)

    def _release(self, node: Turns, delay: float | None, since: float | None = None) -> None:
        """``node``'s turn ended: queue its next one (unless stopped); wake a stop waiting.

        The delay counts from ``since`` (None: now).
        """
        with self._cond:
            node.running_on = None
            node.idle.set()
            if not node.stopped:
                later = node.interval_s if delay is None else max(0.0, delay)
                now = time.monotonic()
                if node.repoke:
                    due = now
                elif since is None:
                    due = now + later
                else:  # from a batch's start, but at least half the delay from now: parts
                    # that ran late do not start the next batch at once, again and again
                    due = max(since + later, now + later / 2)
                node.poked = node.repoke
                self._push(node, due)


def _run(turn: Callable[[], float | None]) -> float | None:
    try:
        return turn()
    except Exception:
        log.exception("a rendezvous liveness turn failed; going on")
        return None


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
