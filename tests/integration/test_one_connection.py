"""One TCPStore connection a node, on a real store (issue 38 part 2): the store's process holds
one socket per node, and a node's heartbeat keeps moving while its join or its round store
blocks on that one connection (``c10d/shared_link.py``, ``c10d/round_view.py``)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psutil
import pytest
from torch.distributed import DistStoreError

from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.backend import RendezvousBackend
from elastic_run.rendezvous.dynamic.handler import DynamicRendezvousHandler
from elastic_run.rendezvous.registry import create_backend, rendezvous_handler_registry
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(120)

FAST: dict[str, Any] = {
    "keep_alive_interval": "0.1",
    "keep_alive_max_attempt": "5",
    "join_timeout": "60",
}


@pytest.fixture
def port() -> Iterator[int]:
    from torch.distributed import TCPStore

    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    yield server.port
    del server


@pytest.fixture
def made() -> Iterator[list[Any]]:
    things: list[Any] = []
    yield things
    for thing in reversed(things):
        if isinstance(thing, DynamicRendezvousHandler):
            thing.set_closed()
            thing.shutdown()
            thing.backend.close()
        else:
            thing.close()


def _handler(port: int, run_id: str, n: tuple[int, int]) -> DynamicRendezvousHandler:
    params = RendezvousParameters(
        "c10d", f"127.0.0.1:{port}", run_id, *n, local_addr="127.0.0.1", is_host="false", **FAST
    )
    handler = rendezvous_handler_registry.create_handler(params)
    assert isinstance(handler, DynamicRendezvousHandler)
    return handler


def _reader(port: int, run_id: str) -> RendezvousBackend:
    params = RendezvousParameters("c10d", f"127.0.0.1:{port}", run_id, 1, 1, is_host="false")
    return create_backend(params, allow_hosting=False)


def _server_sockets(port: int) -> int:
    """Connections the store (in this process) accepted and holds now."""
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.raddr and c.status == psutil.CONN_ESTABLISHED
    )


def _beats(reader: RendezvousBackend, node_id: str, count: int) -> None:
    """Wait until ``node_id``'s heartbeat took ``count`` new values."""
    seen: set[int | None] = set()

    def moved() -> bool:
        seen.add(reader.read_heartbeats([node_id])[0])
        return len(seen - {None}) > count

    wait_until(
        moved,
        30,
        message=lambda: (
            f"{node_id}'s heartbeat stood still: {sorted(v for v in seen if v is not None)}"
        ),
    )


def test_a_waiting_node_beats_on_its_one_connection(port: int, made: list[Any]) -> None:
    run_id = f"job-{uuid.uuid4().hex[:8]}"
    reader = _reader(port, run_id)
    made.append(reader)
    before = _server_sockets(port)
    handler = _handler(port, run_id, (2, 2))
    made.append(handler)
    out: list[Any] = []
    joining = threading.Thread(target=lambda: out.append(handler.next_rendezvous()), daemon=True)
    joining.start()  # alone in a round of 2: it blocks in its wait for the seal
    _beats(reader, handler.node_id, 5)
    assert joining.is_alive() and not out
    assert _server_sockets(port) - before == 1  # the join, its waits and its beats: one socket
    other = _handler(port, run_id, (2, 2))
    made.append(other)
    info = other.next_rendezvous()
    joining.join(30)
    assert out and {out[0].world_size, info.world_size} == {2}
    assert _server_sockets(port) - before == 2


def test_the_round_store_waits_without_stopping_the_heartbeat(port: int, made: list[Any]) -> None:
    from torch.distributed.elastic.utils.store import barrier

    run_id = f"job-{uuid.uuid4().hex[:8]}"
    reader = _reader(port, run_id)
    made.append(reader)
    before = _server_sockets(port)
    handler = _handler(port, run_id, (1, 1))
    made.append(handler)
    store = handler.next_rendezvous().store
    barrier(store, 1, key_prefix="torch-exit", barrier_timeout=30)  # torch's own exit barrier
    errors: list[BaseException] = []

    def wait(keys: list[str], timeout_s: float) -> None:
        try:
            store.wait(keys, timedelta(seconds=timeout_s))
        except DistStoreError as exc:  # the type torch's code catches
            errors.append(exc)

    late = threading.Thread(target=wait, args=(["never"], 1.5))
    late.start()
    _beats(reader, handler.node_id, 3)
    late.join(30)
    assert len(errors) == 1 and "wait timeout" in str(errors[0]) and "never" in str(errors[0])
    soon = threading.Thread(target=wait, args=(["soon"], 60.0))
    soon.start()
    _beats(reader, handler.node_id, 3)
    assert soon.is_alive()
    store.set("soon", "1")  # from another thread, on the same connection
    soon.join(30)
    assert not soon.is_alive() and len(errors) == 1
    assert store.get("soon") == b"1"
    assert _server_sockets(port) - before == 1
