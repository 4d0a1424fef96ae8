"""A node beats before each join (``liveness/turns.py``, ``start``), on a real TCPStore and etcd.

After a partition a node's heartbeat key may be gone (its etcd lease expired; here the node's
key is dropped with ``forget_node``, which reads the same to the others). When the node joins
again, the members of the new round read its key at once: were it still absent, they would
judge the node gone in the round it just joined (seen in the three-host partition test after
the store host's heal). ``start`` on a running thread writes the key before the join.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from torch.distributed import TCPStore

from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.backend import RendezvousBackend
from elastic_run.rendezvous.c10d.backend import C10dRendezvousBackend
from elastic_run.rendezvous.etcd.backend import create_etcd_backend
from elastic_run.rendezvous.liveness.turns import LivenessThread
from elastic_run.rendezvous.settings import RendezvousSettings
from tests.integration.etcd_fixtures import etcd_server_fixture  # noqa: F401 - a fixture

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(
    name="backend",
    scope="module",  # the shared etcd starts before the per-test check for leftover processes
    params=["c10d", pytest.param("etcd", marks=pytest.mark.etcd)],
)
def backend_fixture(request: pytest.FixtureRequest) -> Iterator[RendezvousBackend]:
    if request.param == "c10d":
        store = TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
        )
        yield C10dRendezvousBackend(store, "join-beat")
        return
    server: Any = request.getfixturevalue("etcd_server")
    params = RendezvousParameters("etcd", server.endpoint, "join-beat", 1, 1)
    backend = create_etcd_backend(params)
    yield backend
    backend.close()


def test_a_running_node_beats_again_before_it_joins(backend: RendezvousBackend) -> None:
    # Turns an hour apart: only start() can write the key within this test.
    settings = RendezvousSettings(keep_alive_interval_s=3600.0, keep_alive_max_attempt=3)
    thread = LivenessThread(
        backend,
        "node-1",
        settings,
        time.monotonic,
        lambda: None,
        lambda beats: beats,
        lambda _round, _verdict: None,
        lambda: None,
    )
    thread.start()
    try:
        assert backend.read_heartbeats(["node-1"])[0] is not None
        backend.forget_node("node-1")  # its key is gone, as after an expired lease
        assert backend.read_heartbeats(["node-1"]) == [None]
        thread.start()  # the next join
        assert backend.read_heartbeats(["node-1"])[0] is not None
    finally:
        assert thread.stop()
