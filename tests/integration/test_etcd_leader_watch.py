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
import threading
from typing import Any

import pyetcd
import pytest
from etcd_fixtures import (  # noqa: F401 - fixtures
    etcd_cluster3_fixture,
    requires_etcd,
    wait_until,
)

from elastic_run.rendezvous.etcd.client import EtcdClient
from elastic_run.rendezvous.etcd.leader_watch import LeaderWatch, Released, raft_term_of
from elastic_run.rendezvous.etcd.server import EtcdServer

pytestmark = [pytest.mark.etcd, requires_etcd]

WATCH_LOG = "elastic_run.rendezvous.etcd.leader_watch"


def _leader_index(cluster: EtcdServer) -> int:
    """Which member leads (each member's own status names itself and the leader)."""
    for i, endpoint in enumerate(cluster.endpoints):
        host, port = endpoint.rsplit(":", 1)
        raw = pyetcd.client(host=host, port=int(port), timeout=5)
        try:
            resp = raw.maintenancestub.Status(pyetcd.etcdrpc.StatusRequest(), 5)
            if resp.leader == resp.header.member_id:
                return i
        finally:
            raw.close()
    raise AssertionError("no member leads")


def test_a_write_held_by_a_frozen_leader_is_retried_on_the_new_one(
    etcd_cluster3: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=WATCH_LOG)
    leader = _leader_index(etcd_cluster3)
    follower = (leader + 1) % 3
    # One endpoint: the call cannot fail over; only the release gets it out early.
    client = EtcdClient([etcd_cluster3.endpoints[follower]], timeout_s=60.0)
    pid = etcd_cluster3.member_pid(leader)
    assert pid is not None
    try:
        client.put("before", b"1")  # the connection learns the term
        os.kill(pid, signal.SIGSTOP)
        try:
            client.put("during", b"2")
            kv = client.get("during")
            assert kv is not None and kv.value == b"2"
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        client.close()
    released = [r.getMessage() for r in caplog.records if r.name == WATCH_LOG]
    assert any("put 'during'" in m and "leader" in m for m in released), released


class _Conn:
    def __init__(self) -> None:
        self.released: list[tuple[Any, str]] = []
        self.done = threading.Event()

    def release(self, raw: Any, why: str) -> None:
        self.released.append((raw, why))
        self.done.set()


def test_a_slow_call_under_a_steady_leader_is_left_alone() -> None:
    # The member answers its status with the same leader and term: the call is slow, not
    # lost, and nothing is released while it waits (the watch looks several times).
    looks: list[Any] = []
    looked = threading.Event()

    def status(raw: Any) -> tuple[int, int]:
        looks.append(raw)
        if len(looks) >= 3:
            looked.set()
        return 7, 5

    watch = LeaderWatch(status=status)
    conn = _Conn()
    token = watch.enter(conn, "raw", "put 'k'", term_before=5)
    try:
        assert looked.wait(30)
    finally:
        watch.leave(token)
    assert conn.released == []


@pytest.mark.parametrize(
    ("answers", "term_before", "why"),
    [
        ([(0, 0)], 5, "has no leader"),
        ([(7, 6)], 5, "raft term 5 -> 6"),
        # The term moved between two looks (the connection had seen no term before).
        ([(7, 5), (7, 5), (9, 6)], 0, "raft term 5 -> 6"),
    ],
)
def test_a_call_the_leader_changed_under_is_released(
    answers: list[tuple[int, int]], term_before: int, why: str
) -> None:
    remaining = list(answers)

    def status(raw: Any) -> tuple[int, int]:
        return remaining.pop(0) if len(remaining) > 1 else remaining[0]

    released: list[Released] = []
    watch = LeaderWatch(status=status, on_release=released.append)
    conn = _Conn()
    token = watch.enter(conn, "raw", "put 'k'", term_before=term_before)
    try:
        assert conn.done.wait(30)
    finally:
        watch.leave(token)
    assert conn.released == [("raw", conn.released[0][1])]
    assert why in conn.released[0][1]
    assert [r.what for r in released] == ["put 'k'"]


def test_the_raft_term_of_a_response() -> None:
    rpc = pyetcd.etcdrpc
    header = rpc.ResponseHeader(raft_term=4)
    assert raft_term_of(rpc.RangeResponse(header=header)) == 4
    assert raft_term_of((True, [rpc.PutResponse(header=header)])) == 0  # nested: not read
    assert raft_term_of([rpc.LeaseKeepAliveResponse(header=header)]) == 4
    assert raft_term_of(None) == 0
    assert raft_term_of(b"value") == 0


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
