"""A process of many nodes on one c10d store keeps about one connection a node (``short_links``).

Real TCPStore, real handlers and backends built through the public entry points, their links
through a counting TCP proxy (each connection it accepts is one the store's host would hold):
past ``OWN_LINKS`` nodes a process's nodes share the short-call links and keep a waiting link
each; a round of such nodes forms and every node's heartbeat moves; a shared link that broke
is remade once for all its nodes; a link nobody holds any more is not handed out again.

``OWN_LINKS`` is lowered to 3 here: the same code path with fewer connects (outside a
loopback-only namespace a TCPStore client's connect now and then stalls 5 s in a reverse name
lookup, and the fewer connects a test makes the fewer such stalls it waits out).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from torch.distributed import TCPStore

from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.c10d import short_links
from elastic_run.rendezvous.c10d.backend import C10dRendezvousBackend, create_c10d_backend
from elastic_run.rendezvous.dynamic.handler import DynamicRendezvousHandler
from elastic_run.rendezvous.errors import RendezvousUnreachableError
from elastic_run.rendezvous.registry import get_rendezvous_handler
from tests.helpers import join_into, wait_until
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(120)

_CONF = {"join_timeout": "60", "is_host": "false", "local_addr": "127.0.0.1"}
OWN_LINKS = 3
_SHARING = 5  # nodes past OWN_LINKS: they share


@pytest.fixture(autouse=True)
def _few_own_links(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(short_links, "OWN_LINKS", OWN_LINKS)


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    relay = TcpProxy(store.port)
    yield relay
    relay.close()


def _params(endpoint: str, job: str, n: int, **conf: str) -> RendezvousParameters:
    return RendezvousParameters("c10d", endpoint, job, n, n, **(_CONF | conf))


def _backends(proxy: TcpProxy, job: str, n: int, **conf: str) -> list[C10dRendezvousBackend]:
    return [create_c10d_backend(_params(proxy.endpoint, job, n, **conf)) for _ in range(n)]


def test_nodes_past_the_first_few_of_a_process_share_short_links(proxy: TcpProxy) -> None:
    n = OWN_LINKS + _SHARING
    backends = _backends(proxy, f"share-{uuid.uuid4().hex[:8]}", n)
    try:
        # Each node's waiting link, and a short-call link for each of the first OWN_LINKS only
        # (two a node before: 2 * n).
        assert proxy.stats.connections == n + OWN_LINKS
        for i, backend in enumerate(backends):  # every node's calls work on its link
            backend.heartbeat(f"node-{i}")
        values = backends[0].read_heartbeats([f"node-{i}" for i in range(n)])
        assert all(v is not None and v > 0 for v in values), values
    finally:
        for backend in backends:
            backend.close()
    # Every lease given back: the links are not handed out again, a new node connects afresh.
    before = proxy.stats.connections
    lone = create_c10d_backend(_params(proxy.endpoint, "another", 1))
    try:
        assert proxy.stats.connections == before + 2
    finally:
        lone.close()


def test_a_broken_shared_link_is_remade_once_for_all_its_nodes(proxy: TcpProxy) -> None:
    n = OWN_LINKS + _SHARING
    # A remake connects within the heartbeat deadline: a long one, so a stalled name lookup
    # (the module docstring) does not fail it.
    slow = {"heartbeat_timeout": "30", "keep_alive_max_attempt": "30"}
    backends = _backends(proxy, f"break-{uuid.uuid4().hex[:8]}", n, **slow)
    try:
        proxy.cut()  # every connection reset (the store's host dropped its clients)
        proxy.restore()
        before = proxy.stats.connections
        for i, backend in enumerate(backends):  # one after another: no race over who remakes
            with pytest.raises(RendezvousUnreachableError, match="connected again"):
                backend.heartbeat(f"node-{i}")
            backend.heartbeat(f"node-{i}")  # the node's link works again
        # A remake is a probe connect and the client's connect: once a link, not once a node.
        assert proxy.stats.connections - before == 2 * OWN_LINKS
    finally:
        for backend in backends:
            backend.close()


def test_a_round_of_nodes_sharing_links_forms_and_every_node_beats(proxy: TcpProxy) -> None:
    n = OWN_LINKS + _SHARING
    job = f"round-{uuid.uuid4().hex[:8]}"
    handlers = []
    for _ in range(n):
        handler = get_rendezvous_handler(_params(proxy.endpoint, job, n))
        assert isinstance(handler, DynamicRendezvousHandler)
        handlers.append(handler)
    assert proxy.stats.connections == n + OWN_LINKS
    outcome: dict[int, Any] = {}
    threads = [
        threading.Thread(target=join_into, args=(outcome, i, h), daemon=True)
        for i, h in enumerate(handlers)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        failed = {i: o for i, o in outcome.items() if isinstance(o, BaseException)}
        assert len(outcome) == n and not failed, failed
        assert sorted(o.rank for o in outcome.values()) == list(range(n))
        ids = [h.node_id for h in handlers]
        first = handlers[0].backend.read_heartbeats(ids)
        # Every node's heartbeat moves, the shared links' nodes' as well.
        wait_until(
            lambda: all(
                (now or 0) > (then or 0)
                for now, then in zip(handlers[0].backend.read_heartbeats(ids), first, strict=True)
            ),
            60,
            message="some node's heartbeat did not move",
        )
        assert proxy.stats.connections == n + OWN_LINKS  # nothing connected again
    finally:
        for handler in handlers:
            handler.shutdown()
