"""The rendezvous contract (issue 3's promises) on every backend, with several handlers.

Every test in the contract part runs through the ``job`` fixture on a real TCPStore (``c10d``),
a real etcd (``etcd``), a real embedded etcd member started by an agent's backend
(``embedded-etcd``; both etcd ones failed where etcd is not installed) and the shipped in-memory
backend (``memory``). Handlers of one process run in threads. A node that must die for real is
a subprocess (SIGKILL, SIGSTOP); on the in-memory backend, whose nodes are threads of this
process, it is a handler in a thread that is cut off the store (a freeze: its heartbeats stop,
its death-notice port still greets) and then shut down (a kill: its death-notice sockets
close, as the kernel closes a killed process's). The c10d-only part covers hosting, a store
that goes away and the static backend.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from etcd_fixtures import etcd_server_fixture  # noqa: F401 - a fixture

from elastic_run.rendezvous import InMemoryRendezvousBackend, InMemoryStore
from elastic_run.rendezvous.api import RendezvousInfo, RendezvousParameters
from elastic_run.rendezvous.backend import RendezvousBackend
from elastic_run.rendezvous.c10d.backend import create_c10d_backend
from elastic_run.rendezvous.dynamic.handler import (
    DynamicRendezvousHandler,
    close_job,
    closed_reason_of,
    create_handler,
    read_snapshot,
)
from elastic_run.rendezvous.errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from elastic_run.rendezvous.protocol.records import LostRecord, SealRecord, decode
from elastic_run.rendezvous.registry import create_backend, rendezvous_handler_registry
from tests.helpers import REPO_ROOT, free_port, freeze, wait_until

# Short timings so the suite runs in seconds; a node is judged gone after 0.25 x 4 = 1 s.
CONF: dict[str, str] = {
    "last_call_timeout": "0.5",
    "keep_alive_interval": "0.25",
    "keep_alive_max_attempt": "4",
    "join_timeout": "30",
    "read_timeout": "10",
}
# Heartbeats that would judge a node only after 120 s, far past a test's timeout: what is
# noticed sooner was noticed by its death notice (peerwatch.py).
SLOW_BEATS = {"keep_alive_interval": "2", "keep_alive_max_attempt": "60"}


class Job:
    """One rendezvous job on a store: builds handlers, readers and nodes, and cleans up.

    c10d and etcd handlers are built through the public registry, as agents build them. The
    embedded-etcd ones join the member the fixture started without starting one of their own
    (their address is the member's), and the in-memory ones share the fixture's store.
    """

    def __init__(self, kind: str, endpoint: str, memory: InMemoryStore | None = None) -> None:
        self.kind = kind
        self.endpoint = endpoint
        self.memory = memory
        self.run_id = f"job-{uuid.uuid4().hex[:8]}"
        self._handlers: list[DynamicRendezvousHandler] = []
        self._backends: list[RendezvousBackend] = []
        self._nodes: list[Node] = []

    def params(self, min_nodes: int, max_nodes: int, **conf: str) -> RendezvousParameters:
        merged = {**CONF, **conf}
        if self.kind == "c10d":
            merged.setdefault("is_host", "false")
        return RendezvousParameters(
            self.kind,
            self.endpoint,
            self.run_id,
            min_nodes,
            max_nodes,
            local_addr="127.0.0.1",
            **merged,
        )

    def backend(self, params: RendezvousParameters) -> RendezvousBackend:
        """A new connection to the job's store that never hosts it."""
        if self.kind == "memory":
            assert self.memory is not None
            return InMemoryRendezvousBackend(self.memory, self.run_id)
        return create_backend(params, allow_hosting=False)

    def handler(self, min_nodes: int, max_nodes: int, **conf: str) -> DynamicRendezvousHandler:
        params = self.params(min_nodes, max_nodes, **conf)
        if self.kind in ("c10d", "etcd"):
            handler = rendezvous_handler_registry.create_handler(params)
        else:
            handler = create_handler(None, self.backend(params), params)
        assert isinstance(handler, DynamicRendezvousHandler)
        self._handlers.append(handler)
        return handler

    def handlers(self, n: int, min_nodes: int, max_nodes: int, **conf: str) -> list[Any]:
        return [self.handler(min_nodes, max_nodes, **conf) for _ in range(n)]

    def reader(self) -> RendezvousBackend:
        backend = self.backend(self.params(1, 1))
        self._backends.append(backend)
        return backend

    def node(self, min_nodes: int, max_nodes: int, **conf: str) -> Node:
        """A node that can die for real: a subprocess, or on the in-memory store a thread."""
        node: Node
        if self.kind == "memory":
            node = ThreadNode(self.handler(min_nodes, max_nodes, **conf))
        else:
            node = ProcessNode(self._node_command(min_nodes, max_nodes, **conf))
        self._nodes.append(node)
        return node

    def _node_command(self, min_nodes: int, max_nodes: int, **conf: str) -> list[str]:
        """A subprocess that joins as one node, prints its rank, then waits to be killed."""
        spec = {
            "kind": self.kind,
            "endpoint": self.endpoint,
            "run_id": self.run_id,
            "min": min_nodes,
            "max": max_nodes,
            "conf": {**CONF, **conf, **({"is_host": "false"} if self.kind == "c10d" else {})},
        }
        return [sys.executable, "-c", _NODE_SCRIPT, json.dumps(spec)]

    def close(self) -> None:
        for node in self._nodes:
            node.kill()
        for handler in reversed(self._handlers):
            handler.shutdown()
            handler.backend.close()
        for backend in self._backends:
            backend.close()


class Node:
    """A node of the job that can be killed (SIGKILL) or frozen (SIGSTOP)."""

    def node_id(self) -> str:
        """Its node id, once it has one."""
        raise NotImplementedError

    def joined(self) -> tuple[int, int]:
        """Block until its round completed; its rank and world size."""
        raise NotImplementedError

    def kill(self) -> None:
        """Kill it (idempotent)."""
        raise NotImplementedError

    def freeze(self) -> None:
        """Freeze it: it stops heartbeating, its connections stay open."""
        raise NotImplementedError


class ProcessNode(Node):
    def __init__(self, command: list[str]) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self._id: str | None = None

    def node_id(self) -> str:
        if self._id is None:
            self._id = read_line(self.proc, "node").split()[1]
        return self._id

    def joined(self) -> tuple[int, int]:
        self.node_id()
        _, rank, world = read_line(self.proc, "rank").split()
        return int(rank), int(world)

    def kill(self) -> None:
        kill(self.proc)

    def freeze(self) -> None:
        freeze(self.proc.pid)


class ThreadNode(Node):
    def __init__(self, handler: DynamicRendezvousHandler) -> None:
        self.handler = handler
        self._dead = False
        handler.set_interrupt(lambda: self._dead)  # a dead node's join loop ends, not retries
        self.call = Call(handler.next_rendezvous)

    def node_id(self) -> str:
        return self.handler.node_id

    def joined(self) -> tuple[int, int]:
        info = self.call.get(50)
        return info.rank, info.world_size

    def kill(self) -> None:
        self.freeze()
        self._dead = True
        self.handler.shutdown()  # its death-notice sockets close, as a killed process's do

    def freeze(self) -> None:
        backend = self.handler.backend
        assert isinstance(backend, InMemoryRendezvousBackend)
        backend.cut()


_NODE_SCRIPT = """
import json, sys, threading
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.registry import rendezvous_handler_registry
spec = json.loads(sys.argv[1])
params = RendezvousParameters(spec["kind"], spec["endpoint"], spec["run_id"], spec["min"],
                              spec["max"], local_addr="127.0.0.1", **spec["conf"])
if spec["kind"] == "embedded-etcd":  # join the fixture's member, never start one
    from elastic_run.rendezvous.dynamic.handler import create_handler
    from elastic_run.rendezvous.registry import create_backend
    handler = create_handler(None, create_backend(params, allow_hosting=False), params)
else:
    handler = rendezvous_handler_registry.create_handler(params)
print("node", handler.node_id, flush=True)
info = handler.next_rendezvous()
print("rank", info.rank, info.world_size, flush=True)
threading.Event().wait()
"""


@pytest.fixture(
    scope="module",
    params=[
        "c10d",
        pytest.param("etcd", marks=pytest.mark.etcd),
        pytest.param("embedded-etcd", marks=pytest.mark.etcd),
        "memory",
    ],
)
def store_endpoint(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, Any]]:
    """(backend name, endpoint, in-memory store): a TCPStore hosted here, the module's etcd
    server, an embedded etcd member started here by a hosting backend, or an in-memory store.

    Module-scoped, so the etcd processes start before any test's process-leak guard looks.
    """
    if request.param == "memory":
        yield "memory", "", InMemoryStore(name="contract")
    elif request.param == "embedded-etcd":
        yield from _embedded_member()
    elif request.param == "c10d":
        from torch.distributed import TCPStore

        server = TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
        )
        yield "c10d", f"127.0.0.1:{server.port}", None
        del server
    else:
        etcd = request.getfixturevalue("etcd_server")
        yield "etcd", etcd.endpoint, None


def _embedded_member() -> Iterator[tuple[str, str, Any]]:
    """A one-member embedded cluster on 127.0.0.1, its member run by a hosting backend."""
    from elastic_run.rendezvous.embedded.backend import create_embedded_backend
    from tests.machine import require_etcd

    require_etcd()
    port = free_port()
    while not _is_free(port + 1):  # the member's peer port is the next one
        port = free_port()
    endpoint = f"127.0.0.1:{port}"
    params = RendezvousParameters(
        "embedded-etcd", endpoint, f"host-{uuid.uuid4().hex[:8]}", 1, 1, local_addr="127.0.0.1"
    )
    host = create_embedded_backend(params)
    try:
        assert host.local_member is not None, "the fixture's backend started no member"
        host.check_reachable(30)
        yield "embedded-etcd", endpoint, None
    finally:
        host.close()


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def job(store_endpoint: tuple[str, str, Any]) -> Iterator[Job]:
    """A fresh job (its own run id) on the store."""
    the_job = Job(*store_endpoint)
    try:
        yield the_job
    finally:
        the_job.close()


class Call:
    """Run ``fn`` on a daemon thread; keep its result or its exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.returned_at = 0.0

        def run() -> None:
            try:
                self.result = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                self.error = exc
            finally:
                self.returned_at = time.monotonic()
                self.done.set()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def get(self, timeout_s: float) -> Any:
        assert self.done.wait(timeout_s), f"the call did not return within {timeout_s} s"
        if self.error is not None:
            raise self.error
        return self.result


def seal_of(job: Job, r: int) -> SealRecord:
    raw = job.reader().get(f"r{r}/seal")
    assert raw is not None, f"round {r} has no seal"
    return decode(SealRecord, f"r{r}/seal", raw)


def rendezvous_all(handlers: list[Any], timeout_s: float = 30.0) -> list[RendezvousInfo]:
    calls = [Call(h.next_rendezvous) for h in handlers]
    return [call.get(timeout_s) for call in calls]


def assert_one_group(infos: list[RendezvousInfo]) -> None:
    """Consistency: one round, one world size, ranks exactly 0..N-1."""
    assert len({info.round for info in infos}) == 1
    assert {info.world_size for info in infos} == {len(infos)}
    assert sorted(info.rank for info in infos) == list(range(len(infos)))


def read_line(proc: subprocess.Popen[str], prefix: str, timeout_s: float = 50.0) -> str:
    """The first stdout line of ``proc`` starting with ``prefix`` (raises after ``timeout_s``)."""
    found: list[str] = []

    def scan() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(prefix):
                found.append(line.strip())
                return

    reader = threading.Thread(target=scan, daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not found:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(
            f"the node printed no '{prefix}' line in {timeout_s} s; stderr:\n{err}"
        )
    return found[0]


def kill_once_watched(node: Node, handlers: list[DynamicRendezvousHandler]) -> None:
    """Kill ``node`` once its ring neighbour among ``handlers`` holds a connection.

    A node killed before its neighbour first connected gets no death notice (a refused first
    connect proves nothing), so the tests about notices wait for the watch first.
    """
    node_id = node.node_id()
    wait_until(
        lambda: any(h.successor_watch == f"watching {node_id}" for h in handlers),
        30,
        message=lambda: str([h.successor_watch for h in handlers]),
    )
    node.kill()


def kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


# -- the barrier ------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_barrier_completes_at_max_at_once(job: Job) -> None:
    handlers = job.handlers(3, 2, 3, last_call_timeout="30")
    infos = rendezvous_all(handlers, timeout_s=20)  # well under the 30 s last call
    assert_one_group(infos)
    assert seal_of(job, 0).reason == "max"
    assert [h.num_nodes_waiting() for h in handlers] == [0, 0, 0]


@pytest.mark.timeout(60)
def test_barrier_completes_at_min_after_last_call(job: Job) -> None:
    handlers = job.handlers(2, 2, 4)
    start = time.monotonic()
    infos = rendezvous_all(handlers)
    # A lower bound is the contract itself (never before the last call), not a speed claim.
    assert time.monotonic() - start >= 0.5, "a round below max sealed before the last call"
    assert_one_group(infos)
    assert seal_of(job, 0).reason == "last_call"


@pytest.mark.timeout(60)
def test_barrier_below_min_times_out_with_the_facts(job: Job) -> None:
    handler = job.handler(2, 3, join_timeout="1")
    start = time.monotonic()
    with pytest.raises(RendezvousTimeoutError) as caught:
        handler.next_rendezvous()
    assert time.monotonic() - start >= 1.0  # not before the join timeout
    message = str(caught.value)
    assert job.run_id in message
    assert "1 of 2..3 nodes" in message
    assert job.kind in message and handler.backend.endpoint in message


# -- exclusivity, consistency, the shared store -------------------------------------------


@pytest.mark.timeout(90)
def test_latecomer_waits_is_counted_and_joins_the_next_round(job: Job) -> None:
    members = job.handlers(2, 2, 3)
    first = rendezvous_all(members)
    assert_one_group(first)

    late = job.handler(2, 3)
    late_call = Call(late.next_rendezvous)
    wait_until(
        lambda: all(m.num_nodes_waiting() == 1 for m in members),
        10,
        message=lambda: f"waiting counts: {[m.num_nodes_waiting() for m in members]}",
    )
    assert not late_call.done.is_set(), "a latecomer got into a completed round"
    snap = read_snapshot(job.reader(), job.run_id)
    assert snap is not None and len(snap.members) == 2 and len(snap.waiting) == 1

    second = rendezvous_all(members)
    third = late_call.get(20)
    assert_one_group([*second, third])
    assert third.round > first[0].round


@pytest.mark.timeout(60)
def test_members_agree_on_membership(job: Job) -> None:
    handlers = job.handlers(4, 4, 4)
    infos = rendezvous_all(handlers)
    assert_one_group(infos)
    snap = read_snapshot(job.reader(), job.run_id, 4, 4)
    assert snap is not None and snap.state == "complete"
    by_rank = {m.rank: m.node_id for m in snap.members}
    assert {by_rank[info.rank] for info, h in zip(infos, handlers, strict=True)} == {
        h.node_id for h in handlers
    }
    for info, handler in zip(infos, handlers, strict=True):
        assert by_rank[info.rank] == handler.node_id
        assert handler.assignment is not None and handler.assignment.rank == info.rank


@pytest.mark.timeout(60)
def test_a_waiting_node_reads_its_predecessor_not_every_lower_arrival(job: Job) -> None:
    # O(N) per round: while the round forms, each arrival watches the one below it; reading
    # every lower arrival's record at each step would cost the round O(N^2) bytes.
    early = job.handlers(4, 6, 6)
    calls = [Call(h.next_rendezvous) for h in early]
    reader = job.reader()
    wait_until(lambda: reader.get("r0/arrivals") == b"4", 10, message="4 arrivals")
    watcher = job.handler(6, 6)
    requested: list[list[str]] = []
    steps = threading.Event()
    real_get_many, real_read = watcher.backend.get_many, watcher.backend.read_heartbeats

    def get_many(keys: Any) -> Any:
        requested.append(list(keys))
        return real_get_many(keys)

    def read_heartbeats(node_ids: Any) -> Any:
        if len(requested) and node_ids:
            steps.set()  # a step has read records and now judges them
        return real_read(node_ids)

    watcher.backend.get_many = get_many  # type: ignore[method-assign]
    watcher.backend.read_heartbeats = read_heartbeats  # type: ignore[method-assign]
    call = Call(watcher.next_rendezvous)
    try:
        assert steps.wait(20), "the fifth arrival never stepped"
    finally:
        early[0].set_closed()
    for waiting in [*calls, call]:
        with pytest.raises(RendezvousClosedError):
            waiting.get(20)
    node_keys = {k for keys in requested for k in keys if "/node/" in k}
    assert node_keys == {"r0/node/3"}


@pytest.mark.timeout(90)
def test_each_round_gets_a_private_store(job: Job) -> None:
    handlers = job.handlers(2, 2, 2)
    first = rendezvous_all(handlers)
    first[0].store.set("greeting", b"round one")
    assert first[1].store.get("greeting") == b"round one"  # shared within the round

    second = rendezvous_all(handlers)
    assert second[0].round != first[0].round
    assert not second[0].store.check(["greeting"]), "a round's store leaked into the next"
    second[1].store.set("greeting", b"round two")
    assert second[0].store.get("greeting") == b"round two"
    assert first[1].store.get("greeting") == b"round one"


# -- fault tolerance ----------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_node_killed_before_completion_is_dropped(job: Job) -> None:
    reader = job.reader()
    node = job.node(2, 4)
    node.node_id()
    wait_until(lambda: reader.get("r0/node/0") is not None, 30, message="the node never arrived")
    node.kill()
    handlers = job.handlers(2, 2, 4)
    infos = rendezvous_all(handlers)
    assert_one_group(infos)  # world size 2: the dead arrival was left out


@pytest.mark.timeout(90)
def test_member_killed_after_completion_is_lost_by_its_death_notice(job: Job) -> None:
    # SIGKILL: the member's kernel closes its sockets, its ring neighbour sees the connection
    # end and the port refuse. Heartbeats (120 s here) play no part.
    node = job.node(2, 2, **SLOW_BEATS)
    survivor = job.handler(2, 2, **SLOW_BEATS)
    info = survivor.next_rendezvous()
    dead_id = node.node_id()
    assert node.joined()[1] == 2
    assert info.world_size == 2
    assert survivor.poll().round_over is False
    kill_once_watched(node, [survivor])
    wait_until(lambda: survivor.poll().member_lost, 60, message="the dead member was not noticed")
    assert survivor.poll().round_over
    assert survivor.closed_peers() == {dead_id}
    raw = job.reader().get("r0/lost")
    assert raw is not None
    lost = decode(LostRecord, "r0/lost", raw)
    assert (lost.reason, lost.node_ids, lost.by) == ("member_lost", (dead_id,), survivor.node_id)


@pytest.mark.timeout(120)
def test_survivors_of_a_killed_member_reform_at_once(job: Job) -> None:
    # The death notice names the lost node in the round's lost record, so the next round
    # expects only the survivors and seals as "reform" once they are back: no 30 s last call,
    # no 120 s heartbeat verdict.
    slow = {"last_call_timeout": "30", **SLOW_BEATS}
    node = job.node(2, 3, **slow)
    dead_id = node.node_id()
    survivors = job.handlers(2, 2, 3, **slow)
    infos = rendezvous_all(survivors)  # the third arrival brings round 0 to max
    assert {info.world_size for info in infos} == {3}
    kill_once_watched(node, survivors)
    wait_until(
        lambda: any(h.poll().member_lost for h in survivors),
        60,
        message="no survivor noticed the dead member",
    )
    infos = rendezvous_all(survivors, timeout_s=60)
    assert_one_group(infos)
    assert {info.round for info in infos} == {1}
    assert seal_of(job, 1).reason == "reform"
    raw = job.reader().get("r0/lost")
    assert raw is not None
    assert decode(LostRecord, "r0/lost", raw).node_ids == (dead_id,)


@pytest.mark.timeout(90)
def test_a_frozen_member_is_lost_by_its_heartbeat(job: Job) -> None:
    # SIGSTOP: the process lives on and its connection stays open, so there is no death
    # notice; its heartbeat stops moving, and that is what the survivor goes by.
    node = job.node(2, 2)
    survivor = job.handler(2, 2)
    survivor.next_rendezvous()
    node.joined()
    node.freeze()
    wait_until(lambda: survivor.poll().member_lost, 60, message="the frozen member was not noticed")
    assert survivor.closed_peers() == frozenset()


# -- closing --------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_heartbeats_read_while_nodes_leave_are_counters_or_gone(job: Job) -> None:
    # `close --wait` and the ring read heartbeats while nodes leave: a node that leaves
    # mid-read is "gone" (None) at once, never a state error and never a read that waits.
    # (A TCPStore read of a key deleted between its check and its fetch used to wait for
    # the store's read_timeout, which hung a hosting agent at exit.)
    writer, reader = job.reader(), job.reader()
    stop = threading.Event()
    leaving = ["leaver-0"]
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            for i in range(1, 1_000_000):
                if stop.is_set():
                    return
                node = f"leaver-{i}"
                writer.heartbeat(node)
                leaving[0] = node
                writer.heartbeat(node)
                writer.forget_node(node)  # node ids are never reused: it stays gone
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=churn)
    thread.start()
    seen: set[bool] = set()
    reads, give_up_at = 0, time.monotonic() + 20
    try:
        # 1,500 reads at least, and until both outcomes were seen (an in-memory read is so
        # quick that a thousand of them fit between two switches of the interpreter lock).
        while (reads < 1500 or seen != {True, False}) and time.monotonic() < give_up_at:
            (beat,) = reader.read_heartbeats([leaving[0]])
            assert beat is None or beat >= 1
            seen.add(beat is None)
            reads += 1
    finally:
        stop.set()
        thread.join(30)
    assert not errors
    assert seen == {True, False}, "the reads never overlapped the churn"
    (gone,) = reader.read_heartbeats(["leaver-1"])
    assert gone is None


def test_set_closed_stops_every_node(job: Job) -> None:
    handlers = job.handlers(2, 2, 2)
    rendezvous_all(handlers)
    handlers[0].set_closed()
    newcomer = job.handler(1, 2)
    for handler in [*handlers, newcomer]:
        assert handler.is_closed()
        with pytest.raises(RendezvousClosedError, match=job.run_id):
            handler.next_rendezvous()


@pytest.mark.timeout(60)
def test_a_waiting_node_sees_the_close(job: Job) -> None:
    waiting = job.handler(2, 2)
    call = Call(waiting.next_rendezvous)
    reader = job.reader()
    wait_until(lambda: reader.get("r0/arrivals") is not None, 10, message="no arrival")
    job.handler(1, 1).set_closed()
    with pytest.raises(RendezvousClosedError):
        call.get(30)


@pytest.mark.timeout(60)
def test_shutdown_without_close_leaves_the_job_open(job: Job) -> None:
    handlers = job.handlers(2, 2, 2)
    rendezvous_all(handlers)
    assert handlers[0].shutdown()
    assert handlers[0].shutdown()  # idempotent
    assert not handlers[1].is_closed()
    again = [handlers[1], job.handler(2, 2)]
    assert_one_group(rendezvous_all(again))


# -- robustness -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("round", b"not a number"),
        ("r0/seal", b"cos\nsystem\n(S'echo pwned'\ntR."),  # a pickle, never unpickled
        ("r0/seal", b'{"v": 1, "round": "zero"}'),
        # Well-formed, but its parts disagree: no worker description for its one member.
        (
            "r0/seal",
            b'{"v": 1, "round": 0, "sealed_arrivals": 1, "admitted": [[0, 0]], '
            b'"world_size": 1, "reason": "max"}',
        ),
    ],
)
def test_garbage_under_the_jobs_keys_is_a_state_error(job: Job, key: str, value: bytes) -> None:
    writer = job.reader()
    writer.set("round", b"0")
    writer.set(key, value)
    handler = job.handler(1, 2, join_timeout="5")
    with pytest.raises(RendezvousStateError, match=f"'{key}'"):
        handler.next_rendezvous()


_NOT_CLOSED_RECORDS = [
    b"\x80\x81 garbage",
    b'{"v": 99, "reason": "closed"}',
    b'{"v": 1, "reason": "bogus", "by": "x"}',
    b"",
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", _NOT_CLOSED_RECORDS)
def test_a_value_under_closed_that_is_no_record_closes_nothing_and_a_close_replaces_it(
    job: Job, value: bytes
) -> None:
    """Not a record: the job reads as open (a node joins), and a close replaces it, compare-set
    from the exact bytes read; the first valid close wins after that (issue 28, point 6)."""
    writer = job.reader()
    writer.set("closed", value)
    handler = job.handler(1, 1)
    assert handler.next_rendezvous().world_size == 1
    assert not handler.is_closed() and closed_reason_of(writer) is None
    first = close_job(writer, "failed", "first")
    assert first.wrote and first.reason == "failed"
    assert first.replaced is not None and "'closed'" in first.replaced
    second = close_job(writer, "closed", "second")
    assert (second.wrote, second.reason, second.replaced) == (False, "failed", None)
    assert handler.is_closed() and handler.closed_reason() == "failed"
    with pytest.raises(RendezvousClosedError, match="failed"):
        handler.next_rendezvous()


def test_a_job_exists_while_any_of_its_keys_does(job: Job) -> None:
    reader = job.reader()
    assert not reader.exists()
    job.handler(1, 1).next_rendezvous()
    assert reader.exists()
    if job.kind == "memory":
        assert isinstance(reader, InMemoryRendezvousBackend) and reader.delete("round")
    elif job.kind in ("etcd", "embedded-etcd"):
        reader.client.delete(reader.key_base + "round")  # type: ignore[attr-defined]
    else:
        from torch.distributed import PrefixStore

        assert PrefixStore(f"elastic-run/{job.run_id}/", reader.store).delete_key("round")
    assert reader.get("round") is None and reader.exists()


# -- c10d only: a store that goes away, hosting ----------------------------------------------

_STORE_SCRIPT = """
import threading
from datetime import timedelta
from pathlib import Path
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                 timeout=timedelta(seconds=30))
print("port", store.port, flush=True)
threading.Event().wait()
"""


@pytest.mark.timeout(60)
def test_store_that_goes_away_is_a_connection_error_within_read_timeout() -> None:
    env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-c", _STORE_SCRIPT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    job = Job("c10d", "")
    try:
        port = int(read_line(proc, "port").split()[1])
        job.endpoint = f"127.0.0.1:{port}"
        handler = job.handler(2, 2, read_timeout="3")
        call = Call(handler.next_rendezvous)
        reader = job.reader()
        wait_until(lambda: reader.get("r0/arrivals") is not None, 10, message="no arrival")
        kill(proc)
        # No timed assertion (a loaded CI machine stretches it): the call must end with a
        # connection error naming the store instead of waiting out join_timeout (600 s).
        with pytest.raises(RendezvousConnectionError, match=str(port)):
            call.get(60)
    finally:
        kill(proc)
        job.close()


def _c10d_params(endpoint: str, **conf: str) -> RendezvousParameters:
    return RendezvousParameters("c10d", endpoint, "hosting", 1, 2, read_timeout="5", **conf)


@pytest.mark.timeout(60)
def test_c10d_port_zero_hosts_on_a_free_port() -> None:
    host = create_c10d_backend(_c10d_params("127.0.0.1:0"))
    try:
        assert host.is_hosting
        port = int(host.endpoint.rsplit(":", 1)[1])
        assert port != 0
        client = create_c10d_backend(_c10d_params(f"127.0.0.1:{port}", is_host="false"))
        try:
            assert not client.is_hosting
            client.set("hello", b"there")
            assert host.get("hello") == b"there"
        finally:
            client.close()
    finally:
        host.close()


@pytest.mark.timeout(60)
def test_c10d_taken_port_with_is_host_is_a_clear_error() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as occupant:
        occupant.bind(("127.0.0.1", 0))
        occupant.listen()
        port = occupant.getsockname()[1]
        with pytest.raises(RendezvousConnectionError, match=f"127.0.0.1:{port}.*in use"):
            create_c10d_backend(_c10d_params(f"127.0.0.1:{port}", is_host="true"))


@pytest.mark.timeout(60)
def test_static_backend_two_nodes_complete() -> None:
    port = free_port()

    def params(rank: int) -> RendezvousParameters:
        return RendezvousParameters(
            "static", f"127.0.0.1:{port}", "static-job", 2, 2, rank=str(rank), timeout="20"
        )

    handlers = [rendezvous_handler_registry.create_handler(params(r)) for r in (0, 1)]
    infos = rendezvous_all(handlers, timeout_s=30)
    assert [info.rank for info in infos] == [0, 1]
    assert {info.world_size for info in infos} == {2}
    infos[0].store.set("k", b"v")
    assert infos[1].store.get("k") == b"v"
    handlers[1].set_closed()
    assert handlers[0].is_closed()


@pytest.mark.timeout(90)
def test_c10d_store_type_file_forms_rounds_on_a_shared_file(tmp_path: Path) -> None:
    # torch's store_type=file: the endpoint is a path on a file system every node sees.
    job = Job("c10d", str(tmp_path / "rendezvous-store"))
    try:
        handlers = job.handlers(2, 2, 2, store_type="file")
        first = rendezvous_all(handlers)
        assert_one_group(first)
        first[0].store.set("greeting", b"over a file")
        assert first[1].store.get("greeting") == b"over a file"
        second = rendezvous_all(handlers)
        assert_one_group(second)
        assert second[0].round > first[0].round
        handlers[0].set_closed()
        with pytest.raises(RendezvousClosedError):
            handlers[1].next_rendezvous()
    finally:
        job.close()
