"""A call held by a leader that is gone is released and retried (``etcd/leader_watch.py``).

On a real 3-member etcd: the leader is frozen (SIGSTOP: its connections stay open and it never
answers, as a dead host looks until the others' election timeout), a write goes through a
follower, which forwards it to the frozen leader and would hold it until etcd's request
timeout (7 s) or the call's deadline. The watch must see the follower's term move past the
one the client last saw, release the call, and the retry must land on the new leader.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

import pyetcd
import pytest
from etcd_fixtures import (  # noqa: F401 - fixtures
    etcd_cluster3_fixture,
    requires_etcd,
    wait_until,
)

from elastic_run.rendezvous.etcd.client import EtcdClient
from elastic_run.rendezvous.etcd.server import EtcdServer
from tests.helpers import freeze

pytestmark = [pytest.mark.etcd, requires_etcd]

WATCH_LOG = "elastic_run.rendezvous.etcd.leader_watch"


def _leader_index(cluster: EtcdServer) -> int:
    """Which member leads (each member's own status names itself and the leader)."""
    for i in range(len(cluster.endpoints)):
        resp = _status(cluster, i)
        if resp.leader == resp.header.member_id:
            pid = cluster.member_pid(i)
            assert pid is not None
            _IDS[(i, pid)] = int(resp.header.member_id)
            return i
    raise AssertionError("no member leads")


_IDS: dict[tuple[int, int], int] = {}


def _status(cluster: EtcdServer, i: int) -> Any:
    host, port = cluster.endpoints[i].rsplit(":", 1)
    raw = pyetcd.client(host=host, port=int(port), timeout=5)
    try:
        return raw.maintenancestub.Status(pyetcd.etcdrpc.StatusRequest(), 5)
    finally:
        raw.close()


def _member_id(cluster: EtcdServer, i: int, pid: int) -> int:
    """Member ``i``'s id, read before it was frozen (``_leader_index`` read it)."""
    return _IDS[(i, pid)]


def _named_leader(cluster: EtcdServer, i: int) -> int:
    """The leader member ``i`` names."""
    return int(_status(cluster, i).leader)


def test_a_write_held_by_a_frozen_leader_is_retried_on_the_new_one(
    etcd_cluster3: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=WATCH_LOG)
    released: list[str] = []
    # The write must reach the follower before the others elect a new leader (etcd's election
    # timeout, 1 s): on a loaded host the election may win, and the write is then never held
    # (nothing to release). That attempt proves nothing either way: try again, a few times.
    for attempt in range(3):
        caplog.clear()
        _write_through_a_follower_of_a_frozen_leader(etcd_cluster3, f"during{attempt}")
        released = [r.getMessage() for r in caplog.records if r.name == WATCH_LOG]
        if released:
            break
    assert any("put 'during" in m and "leader" in m for m in released), released


def _write_through_a_follower_of_a_frozen_leader(cluster: EtcdServer, key: str) -> None:
    # On a loaded host the leadership may move between the look and the freeze: freeze the
    # member the follower names as its leader while frozen, or look again.
    for _ in range(5):
        leader = _leader_index(cluster)
        follower = (leader + 1) % 3
        pid = cluster.member_pid(leader)
        assert pid is not None
        freeze(pid)
        if _named_leader(cluster, follower) == _member_id(cluster, leader, pid):
            break
        os.kill(pid, signal.SIGCONT)
    else:
        raise AssertionError("the leadership kept moving")
    # One endpoint: the call cannot fail over; only the release gets it out early.
    client = EtcdClient([cluster.endpoints[follower]], timeout_s=60.0)
    try:
        client.put(key, b"2")
        kv = client.get(key)
        assert kv is not None and kv.value == b"2"
    finally:
        os.kill(pid, signal.SIGCONT)
        client.close()


def test_a_connection_goes_back_to_its_home_member(etcd_cluster3: EtcdServer) -> None:
    # The embedded backend lists this host's member first (home). At start it may fail over
    # (home is down here); once home answers with a leader, the next call goes back to it.
    endpoints = etcd_cluster3.endpoints
    etcd_cluster3.kill_member(0)
    client = EtcdClient(endpoints, timeout_s=5.0, prefer_first=True)
    try:
        client.put("k", b"1")
        assert client.endpoint != endpoints[0]
        etcd_cluster3.restart_member(0)
        wait_until(
            lambda: client.get("k") is not None and client.endpoint == endpoints[0],
            60,
            "the client back on its home member",
        )
    finally:
        client.close()
