"""The liveness pool (``liveness/pool.py``) on real threads: bounded, no overlap, poke, stop."""

from __future__ import annotations

import threading

import pytest

from elastic_run.rendezvous.liveness.pool import MAX_WORKERS, Turns, liveness_pool
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(60)


class Node:
    def __init__(self, interval_s: float) -> None:
        self.count = 0
        self.threads: set[int] = set()
        self.overlap = False
        self._inside = False
        self.ran = threading.Event()
        self.turns = Turns(self.turn, interval_s)

    def turn(self) -> None:
        if self._inside:
            self.overlap = True
        self._inside = True
        self.threads.add(threading.get_ident())
        self.count += 1
        self.ran.set()
        self._inside = False


def test_many_nodes_share_at_most_max_workers_and_never_overlap() -> None:
    pool = liveness_pool()
    nodes = [Node(0.05) for _ in range(3 * MAX_WORKERS)]
    for node in nodes:
        pool.start(node.turns)
    try:
        for node in nodes:
            pool.poke(node.turns)  # a poke while queued or running: never two turns at once
        wait_until(lambda: all(n.count >= 3 for n in nodes), 30, message="turns did not run")
        workers = set().union(*(n.threads for n in nodes))
        assert len(workers) <= MAX_WORKERS
        assert not any(n.overlap for n in nodes)
    finally:
        for node in nodes:
            assert pool.stop(node.turns, 10)


def test_a_poke_runs_a_turn_now_and_a_stopped_node_runs_no_more() -> None:
    pool = liveness_pool()
    slow = Node(3600.0)  # its own turns would come within the hour
    ticker = Node(0.02)
    pool.start(slow.turns)
    pool.start(ticker.turns)
    try:
        slow.ran.clear()
        pool.poke(slow.turns)
        assert slow.ran.wait(30), "a poke did not run the turn"
        assert pool.stop(slow.turns, 10)
        done = slow.count
        pool.poke(slow.turns)
        seen = ticker.count
        wait_until(lambda: ticker.count >= seen + 5, 30, message="the pool stopped")
        assert slow.count == done
    finally:
        pool.stop(ticker.turns, 10)
