"""A process's nodes of one job beat together (``liveness/pool.py`` groups, ``heartbeat_many``).

On real threads and a real TCPStore: nodes of one group run their turns in batches and never
with another group's, each node's turns still never overlap, a poked node runs alone and a
stopped node leaves its batches; the c10d batch write changes every node's value and overwrites garbage and the gone
mark; a ring of nodes in one process beating in batches judges nobody gone until one of them
stops, and then only that one, by its predecessor.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest
from torch.distributed import TCPStore

from elastic_run.rendezvous.c10d.backend import C10dRendezvousBackend
from elastic_run.rendezvous.liveness.pool import Turns, liveness_pool
from elastic_run.rendezvous.liveness.turns import LivenessThread, RingPosition
from elastic_run.rendezvous.protocol import decisions as proto
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.settings import RendezvousSettings
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(90)


class Node:
    """A pool node whose turns, alone or in a batch, are recorded."""

    batches: list[list[Node]]  # shared by the nodes of one test
    lock = threading.Lock()

    def __init__(self, group: str | None, batches: list[list[Node]]) -> None:
        self.batches = batches
        self.count = 0
        self.alone = 0  # turns run on their own, not in a batch
        self.inside = False
        self.overlap = False
        self.turns = Turns(self.turn, 0.05, group=group, batch=Node.batch, owner=self)

    def turn(self) -> None:
        self.alone += 1
        self.run([self])

    def run(self, batch: list[Node]) -> None:
        with Node.lock:
            if self.inside:
                self.overlap = True
            self.inside = True
        self.count += 1
        time.sleep(0.001)  # a turn takes a moment: overlap would show
        with Node.lock:
            self.inside = False

    @staticmethod
    def batch(taken: Sequence[Turns]) -> list[Callable[[], float | None]]:
        nodes = [t.owner for t in taken]
        assert all(isinstance(n, Node) for n in nodes)
        batch = [n for n in nodes if isinstance(n, Node)]
        batch[0].batches.append(batch)
        return [functools.partial(Node.rest, node, batch) for node in batch]

    def rest(self, batch: list[Node]) -> float | None:
        self.run(batch)
        return None


def test_nodes_of_one_group_run_in_batches_and_never_with_another_group() -> None:
    pool = liveness_pool()
    batches: list[list[Node]] = []
    a = [Node("job-a", batches) for _ in range(12)]
    b = [Node("job-b", batches) for _ in range(12)]
    alone = [Node(None, batches) for _ in range(3)]
    everyone = a + b + alone
    for node in everyone:
        pool.start(node.turns)
    try:
        wait_until(lambda: all(n.count >= 6 for n in everyone), 60, message="turns did not run")
        assert any(len(batch) > 1 for batch in batches), "no two nodes of a group ran together"
        for batch in batches:
            groups = {n.turns.group for n in batch}
            assert len(groups) == 1 and None not in groups, f"a batch mixed groups: {groups}"
        assert not any(n.overlap for n in everyone)
        # A poked node (a notice asked for a look) runs alone, at once.
        before = a[1].alone
        pool.poke(a[1].turns)
        wait_until(lambda: a[1].alone > before, 30, message="a poke did not run alone")
        # A stopped node is in no batch after its stop returned.
        assert pool.stop(a[0].turns, 10)
        done, seen = a[0].count, len(batches)
        wait_until(lambda: len(batches) >= seen + 10, 60, message="batches stopped")
        assert a[0].count == done
        assert not any(a[0] in batch for batch in batches[seen:])
    finally:
        for node in everyone:
            assert pool.stop(node.turns, 10)


@pytest.fixture
def server() -> Iterator[Any]:
    store = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    yield store


def _client(server: Any) -> Any:
    return TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=10))


def test_a_c10d_batch_beat_changes_every_node_and_overwrites_garbage(server: Any) -> None:
    backend = C10dRendezvousBackend(_client(server), "batch-beat")
    other = C10dRendezvousBackend(_client(server), "batch-beat")
    assert backend.beat_batch_key() == other.beat_batch_key() is not None
    assert C10dRendezvousBackend(_client(server), "another-job").beat_batch_key() != (
        backend.beat_batch_key()
    )
    nodes = [f"n{i}" for i in range(5)]
    backend.heartbeat_many(nodes)
    first = other.read_heartbeats(nodes)
    assert None not in first
    backend.set(keys.heartbeat("n1"), b"garbage")
    other.forget_node("n3")  # the gone mark
    assert other.read_heartbeats(["n3"]) == [None]
    backend.heartbeat_many(nodes)
    second = other.read_heartbeats(nodes)
    assert None not in second
    assert all(x != y for x, y in zip(first, second, strict=True)), (first, second)
    # A node's own beat after a batch's: its value moves on again (its compare_set expected
    # the value the batch wrote).
    other.heartbeat("n2")
    assert other.read_heartbeats(["n2"])[0] not in (second[2], None)


def test_a_ring_beating_in_batches_judges_only_the_node_that_stopped(server: Any) -> None:
    count = 6
    names = [f"ring-{i}" for i in range(count)]
    settings = RendezvousSettings(keep_alive_interval_s=0.1, keep_alive_max_attempt=3)
    verdicts: list[tuple[str, proto.RingVerdict]] = []
    many: list[int] = []

    class Counted(C10dRendezvousBackend):
        def heartbeat_many(self, node_ids: Sequence[str]) -> None:
            many.append(len(node_ids))
            super().heartbeat_many(node_ids)

    def position(successor: str) -> Callable[[], RingPosition]:
        return lambda: RingPosition(round=0, successor=successor, is_member=True)

    def on_verdict(me: str) -> Callable[[int, proto.RingVerdict], None]:
        return lambda _round, verdict: verdicts.append((me, verdict))

    threads = [
        LivenessThread(
            Counted(_client(server), "ring"),
            name,
            settings,
            time.monotonic,
            position(names[(i + 1) % count]),
            lambda beats: beats,
            on_verdict(name),
            lambda: None,
        )
        for i, name in enumerate(names)
    ]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: sum(n > 1 for n in many) >= 10, 60, message="no batch beats")
        assert not verdicts, verdicts  # everyone beats: nobody is judged gone
        assert threads[3].stop(10)
        wait_until(lambda: verdicts, 60, message="the stopped node was never judged")
        judges = {me for me, _ in verdicts}
        assert judges == {names[2]}, verdicts
        verdict = verdicts[0][1]
        assert isinstance(verdict, proto.MemberLost), verdict
        assert verdict.node_ids == (names[3],)
        assert all(t.report().error is None for t in threads)
    finally:
        for thread in threads:
            thread.stop(10)


def test_a_batch_reads_the_successor_records_of_a_round_just_formed_in_one_request(
    server: Any,
) -> None:
    """Nodes whose round just formed know only their successor's record key: the batch that
    their hurried turns fall into reads every record in one request and hands each node its
    own (None for a key that is absent); the nodes then watch the successors by id."""
    count = 6
    names = [f"formed-{i}" for i in range(count)]
    settings = RendezvousSettings(keep_alive_interval_s=0.5, keep_alive_max_attempt=3)
    writer = C10dRendezvousBackend(_client(server), "formed")
    for i, name in enumerate(names):
        writer.set(keys.node(0, i), name.encode())
    # The last node's successor key names no record (index ``count``: never written).
    records = {keys.node(0, i) for i in range(count + 1)}
    reads: list[int] = []
    resolved: dict[str, tuple[int, str, bytes | None]] = {}
    watched: dict[str, str] = {}
    lock = threading.Lock()

    class Counted(C10dRendezvousBackend):
        def get_many(self, wanted: Sequence[str]) -> list[bytes | None]:
            if set(wanted) <= records:  # the records' reads, not the heartbeats'
                with lock:
                    reads.append(len(wanted))
            return super().get_many(wanted)

    def position(me: str, i: int) -> Callable[[], RingPosition]:
        succ = (i + 1) % count

        def where() -> RingPosition:
            with lock:
                known = me in resolved
            if known:
                return RingPosition(round=0, successor=names[succ], is_member=True)
            return RingPosition(0, "", True, pending=keys.node(0, succ if succ else count))

        return where

    def on_successor(me: str) -> Callable[[int, str, bytes | None], None]:
        def take(r: int, key: str, raw: bytes | None) -> None:
            with lock:
                resolved[me] = (r, key, raw)

        return take

    def with_notices(me: str) -> Callable[[proto.Heartbeats], proto.Heartbeats]:
        def note(beats: proto.Heartbeats) -> proto.Heartbeats:
            with lock:
                watched[me] = ",".join(sorted(beats.beats))
            return beats

        return note

    threads = [
        LivenessThread(
            Counted(_client(server), "formed"),
            name,
            settings,
            time.monotonic,
            position(name, i),
            with_notices(name),
            lambda _round, _verdict: None,
            lambda: None,
            on_successor=on_successor(name),
        )
        for i, name in enumerate(names)
    ]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.hurry()  # nodes of a group are not hurried: their batch reads the records
        wait_until(lambda: len(resolved) == count, 30, message=lambda: str(resolved))
        # One read of several records (a batch), and no node read its own.
        assert reads and max(reads) > 1 and reads.count(1) < count, reads
        for i, name in enumerate(names):
            succ = (i + 1) % count
            key = keys.node(0, succ if succ else count)
            expected = None if not succ else names[succ].encode()
            assert resolved[name] == (0, key, expected), resolved[name]
        # From then on each node watches its successor by id.
        wait_until(
            lambda: all(watched.get(n) == names[(i + 1) % count] for i, n in enumerate(names)),
            30,
            message=lambda: str(watched),
        )
    finally:
        for thread in threads:
            thread.stop(10)


def test_a_node_alone_in_its_group_reads_its_successor_at_once_when_hurried(server: Any) -> None:
    """An agent's one node: ``hurry`` brings its next turn forward (its interval here is five
    minutes, its first turn drawn within it), and that turn reads the pending record."""
    writer = C10dRendezvousBackend(_client(server), "alone")
    writer.set(keys.node(3, 1), b"the-successor")
    got: list[tuple[int, str, bytes | None]] = []
    thread = LivenessThread(
        C10dRendezvousBackend(_client(server), "alone"),
        "alone-0",
        RendezvousSettings(keep_alive_interval_s=300.0, keep_alive_max_attempt=3),
        time.monotonic,
        lambda: RingPosition(3, "", True, pending=keys.node(3, 1)) if not got else None,
        lambda beats: beats,
        lambda _round, _verdict: None,
        lambda: None,
        on_successor=lambda r, key, raw: got.append((r, key, raw)),
    )
    thread.start()
    try:
        thread.hurry()
        wait_until(lambda: got, 30, message="the hurried turn did not come")
        assert got[0] == (3, keys.node(3, 1), b"the-successor")
    finally:
        assert thread.stop(10)
