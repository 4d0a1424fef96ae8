"""A node that cannot heartbeat knows it: it stops its workers within the heartbeat budget and
says why, while the other nodes go on without it. c10d and etcd, real agents, a real proxy.

Node b reaches the store through a TCP proxy (``tests/tcp_proxy.py``); the test cuts it (every
connection reset, new ones refused): b's heartbeat writes fail. No timing is asserted: the test
waits for b's workers to be gone and for b's event naming the cause, and for a to train on alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from test_multinode import backend_fixture, make_job_fixture  # noqa: F401 - fixtures

from tests.helpers import is_alive, wait_until
from tests.integration.etcd_fixtures import etcd_server_fixture  # noqa: F401 - a fixture
from tests.tcp_proxy import TcpProxy

# A node is judged gone after 0.25 s x 4 = 1 s without a heartbeat.
CONF = "last_call_timeout=1,keep_alive_interval=0.25,keep_alive_max_attempt=4,read_timeout=5"


@pytest.fixture(name="proxy_for")
def proxy_fixture() -> Iterator[Any]:
    proxies: list[TcpProxy] = []

    def make(port: int) -> TcpProxy:
        proxy = TcpProxy(port)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()


def test_a_node_whose_heartbeats_fail_stops_its_workers_and_says_why(
    make_job: Any, backend: tuple[str, str], proxy_for: Any
) -> None:
    job = make_job(backend)
    store_port = int(job.endpoint.rpartition(":")[2])
    a = job.start("a", nnodes="1:2", conf=CONF, host=True)
    if job.backend == "c10d":
        # The store is a's: b may only connect once it listens.
        wait_until(lambda: job.records("a") or a.proc.poll() is not None, 90, interval_s=0.1)
    proxy = proxy_for(store_port)
    job.endpoint = proxy.endpoint
    job.start("b", nnodes="1:2", conf=CONF)
    job.wait_running(["a", "b"], 2)
    b_workers = {int(r["pid"]) for r in job.records("b")}

    proxy.cut()

    b = job.nodes["b"]
    wait_until(
        lambda: not any(is_alive(pid) for pid in b_workers),
        60,
        interval_s=0.1,
        message=job.report,
    )
    wait_until(
        lambda: any(
            e["kind"] == "membership.changed" and e["fields"].get("reason") == "liveness_lost"
            for e in b.events()
        ),
        30,
        interval_s=0.1,
        message=job.report,
    )
    said = [e["message"] for e in b.events() if e["fields"].get("reason") == "liveness_lost"]
    assert "no successful heartbeat" in said[0], said
    # b cannot rejoin through a store it cannot reach: it exits with "backend unreachable".
    assert job.wait_exit("b") == 4, job.report()
    # a drops b (its heartbeat stopped) and trains on alone.
    job.wait_running(["a"], 1)
    job.go()
    assert job.wait_exit("a") == 0, job.report()
    job.assert_no_survivors()
