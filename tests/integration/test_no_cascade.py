"""No cascade, on a real TCPStore with real processes: a slow node costs only its own admission.

The slow node is a subprocess whose liveness thread (heartbeat and ring watch) is frozen for
real with ptrace (``tests/thread_freeze.py``) while the rest of the process runs on, as in a
process starved of CPU or stuck in a slow call. The hung host is a subprocess stopped with
SIGSTOP under the default heartbeat budget: its sockets stay open, so only its heartbeat can
convict it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.dynamic.handler import DynamicRendezvousHandler
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import SealRecord, decode
from elastic_run.rendezvous.registry import create_backend, rendezvous_handler_registry
from tests.helpers import REPO_ROOT, freeze, wait_until
from tests.thread_freeze import frozen_thread

pytestmark = pytest.mark.timeout(120)

# Fast beats for the formation test: a node is judged gone after 0.25 s x 4 (and 4 reads).
# Last call (3 s) comes well after a frozen node is judged (1 s), so the seal leaves it out.
FAST = {"keep_alive_interval": "0.25", "keep_alive_max_attempt": "4", "last_call_timeout": "3"}

_NODE = """
import json, sys, threading, time
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.registry import rendezvous_handler_registry
spec = json.loads(sys.argv[1])
params = RendezvousParameters("c10d", spec["endpoint"], spec["run_id"], spec["min"], spec["max"],
                              local_addr="127.0.0.1", **spec["conf"])
handler = rendezvous_handler_registry.create_handler(params)
print("node", handler.node_id, flush=True)

def join():
    info = handler.next_rendezvous()
    print("rank", info.rank, info.world_size, info.round, flush=True)

threading.Thread(target=join, daemon=True).start()
while True:
    # A thread just started is listed (in limbo) before it has its native id.
    found = [
        t for t in threading.enumerate()
        if t.name == "elastic-run-liveness" and t.native_id is not None
    ]
    if found:
        print("liveness", found[0].native_id, flush=True)
        break
    time.sleep(0.01)
threading.Event().wait()
"""


class Node:
    """One node in a process of its own; its stdout lines are collected as they come."""

    def __init__(self, endpoint: str, run_id: str, min_nodes: int, max_nodes: int, **conf: str):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        spec = {"endpoint": endpoint, "run_id": run_id, "min": min_nodes, "max": max_nodes}
        spec["conf"] = {"is_host": "false", "join_timeout": "60", **conf}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _NODE, json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def line(self, prefix: str, timeout_s: float = 60.0) -> list[str]:
        wait_until(
            lambda: any(x.startswith(prefix) for x in self.lines),
            timeout_s,
            message=lambda: f"no '{prefix}' line: {self.lines}",
        )
        return next(x for x in self.lines if x.startswith(prefix)).split()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def endpoint() -> Iterator[str]:
    from torch.distributed import TCPStore

    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    yield f"127.0.0.1:{server.port}"
    del server


@pytest.fixture
def cleanup() -> Iterator[list[Any]]:
    things: list[Any] = []
    yield things
    for thing in reversed(things):
        if isinstance(thing, Node):
            thing.kill()
        else:
            thing.shutdown()
            thing.backend.close()


def _handler(endpoint: str, run_id: str, n: tuple[int, int], **conf: str) -> Any:
    params = RendezvousParameters(
        "c10d", endpoint, run_id, *n, local_addr="127.0.0.1", is_host="false", **conf
    )
    handler = rendezvous_handler_registry.create_handler(params)
    assert isinstance(handler, DynamicRendezvousHandler)
    return handler


def _join(handler: DynamicRendezvousHandler) -> dict[str, Any]:
    out: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            out["info"] = handler.next_rendezvous()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc
        done.set()

    threading.Thread(target=run, daemon=True).start()
    out["done"] = done
    return out


def test_a_slow_node_during_formation_costs_only_its_own_admission(
    endpoint: str, cleanup: list[Any]
) -> None:
    # A arrives first (it coordinates), the slow node second, B third; min 2, max 4, so the
    # round completes at last call with whoever is live then.
    run_id = f"job-{uuid.uuid4().hex[:8]}"
    reader = create_backend(
        RendezvousParameters("c10d", endpoint, run_id, 1, 1, is_host="false"),
        allow_hosting=False,
    )
    try:
        a = _handler(endpoint, run_id, (2, 4), **FAST)
        cleanup.append(a)
        join_a = _join(a)
        wait_until(lambda: reader.get(keys.node(0, 0)) is not None, 30, message="A never came")
        slow = Node(endpoint, run_id, 2, 4, **FAST)
        cleanup.append(slow)
        tid = int(slow.line("liveness")[1])
        wait_until(lambda: reader.get(keys.node(0, 1)) is not None, 30, message="no slow node")
        with frozen_thread(slow.proc.pid, tid):  # its heartbeat stops; the rest of it runs
            b = _handler(endpoint, run_id, (2, 4), **FAST)
            cleanup.append(b)
            joins = [join_a, _join(b)]
            for j in joins:
                assert j["done"].wait(60), "the live nodes did not complete a round"
                assert "error" not in j, j.get("error")
            infos = [j["info"] for j in joins]
            assert {i.world_size for i in infos} == {2} and {i.round for i in infos} == {0}
            raw = reader.get(keys.seal(0))
            assert raw is not None
            seal = decode(SealRecord, keys.seal(0), raw)
            assert seal.admitted_indices() == [0, 2] and seal.reason == "last_call", seal
            # Left out, the slow node waits at the door, counted as one node waiting.
            wait_until(
                lambda: a.num_nodes_waiting() == 1 and b.num_nodes_waiting() == 1,
                30,
                message=lambda: f"waiting: {a.num_nodes_waiting()}, {b.num_nodes_waiting()}",
            )
        wait_until(lambda: a.poll().nodes_waiting == 1, 30, message=lambda: str(a.poll()))
        # The members' round goes on: nobody was judged lost, the round did not end.
        for h in (a, b):
            assert not h.poll().round_over and not h.poll().member_lost, h.poll()
        assert reader.get(keys.lost(0)) is None
        assert not any(x.startswith("rank") for x in slow.lines)
    finally:
        reader.close()


@pytest.mark.timeout(90)
def test_a_hung_host_is_dropped_by_the_default_heartbeat_budget(
    endpoint: str, cleanup: list[Any]
) -> None:
    run_id = f"job-{uuid.uuid4().hex[:8]}"
    hung = Node(endpoint, run_id, 2, 2)
    cleanup.append(hung)
    survivor = _handler(endpoint, run_id, (2, 2))
    cleanup.append(survivor)
    assert survivor.settings.stale_after_s == 5.0  # the default budget
    survivor.next_rendezvous()
    hung.line("rank")
    freeze(hung.proc.pid)  # its sockets stay open: no death notice
    stopped_at = time.monotonic()
    wait_until(lambda: survivor.poll().member_lost, 60, message="the hung host was not dropped")
    took = time.monotonic() - stopped_at
    assert survivor.closed_peers() == frozenset()
    end = survivor.round_end()
    assert end is not None and end.lost == (hung.line("node")[1],), end
    print(f"hung host dropped after {took:.1f} s")
