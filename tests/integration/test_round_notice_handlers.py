"""A round's end told to its members at once, and hostile lines on the same port (issue 40).

Three real handlers (built through the public registry) in threads of this process, on a real
TCPStore, each with its real death-notice port on 127.0.0.1. Heartbeats tick every 30 s, so a
member's periodic look at the store comes at a random moment within 30 s: a member that learns
of the round's end before that learned it from the notice (``RoundPoll.learned_by``). The
hostile lines are sent the way any process could: read a member's port from its arrival record
in the store, connect, send.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.dynamic.handler import DynamicRendezvousHandler
from elastic_run.rendezvous.liveness.peerwatch import answers, greeting
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import NodeRecord, SealRecord, decode
from elastic_run.rendezvous.protocol.round_notice import RoundNotice, encode_notice
from elastic_run.rendezvous.registry import create_backend, rendezvous_handler_registry
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(120)

WAIT_S = 20.0  # well within the 30 s between periodic looks
SLOW = {"keep_alive_interval": "30", "keep_alive_max_attempt": "5", "is_host": "false"}


@dataclass
class Member:
    handler: DynamicRendezvousHandler
    index: int  # its arrival index in the current round
    port: int  # its death-notice port, as its arrival record says


class Job:
    """Three handlers of one job on one TCPStore; the test's own reader of the store."""

    def __init__(self) -> None:
        from torch.distributed import TCPStore

        self.server = TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
        )
        self.endpoint = f"127.0.0.1:{self.server.port}"
        self.run_id = f"notice-{uuid.uuid4().hex[:8]}"
        params = RendezvousParameters(
            "c10d", self.endpoint, self.run_id, 3, 3, local_addr="127.0.0.1", **SLOW
        )
        self.handlers: list[DynamicRendezvousHandler] = []
        for _ in range(3):
            handler = rendezvous_handler_registry.create_handler(params)
            assert isinstance(handler, DynamicRendezvousHandler)
            handler.set_change_callback(lambda: None)  # our agent's path
            self.handlers.append(handler)
        self.reader = create_backend(
            RendezvousParameters("c10d", self.endpoint, self.run_id, 1, 1, is_host="false"),
            allow_hosting=False,
        )

    def join_all(self) -> list[Member]:
        """Every handler joins the next round (at once: 3 is the maximum)."""
        errors: list[BaseException] = []

        def join(handler: DynamicRendezvousHandler) -> None:
            try:
                handler.next_rendezvous()
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                errors.append(exc)

        threads = [threading.Thread(target=join, args=(h,)) for h in self.handlers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors and not any(t.is_alive() for t in threads), errors
        rounds = {h.round for h in self.handlers}
        assert len(rounds) == 1, rounds
        return self.members()

    def members(self) -> list[Member]:
        """Each handler's arrival index and port, read from the store as anyone could."""
        (r,) = {h.round for h in self.handlers}
        assert r is not None
        raw = self.reader.get(keys.seal(r))
        assert raw is not None
        seal = decode(SealRecord, keys.seal(r), raw)
        by_id: dict[str, tuple[int, int]] = {}
        for index in seal.admitted_indices():
            record = decode(NodeRecord, keys.node(r, index), self.reader.get(keys.node(r, index)))
            by_id[record.node_id] = (index, record.alive_port)
        return [Member(h, *by_id[h.node_id]) for h in self.handlers]

    def close(self) -> None:
        for handler in self.handlers:
            handler.shutdown()
        self.reader.close()


@pytest.fixture
def job() -> Iterator[Job]:
    the_job = Job()
    try:
        yield the_job
    finally:
        the_job.close()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="elastic_run.rendezvous")
    return caplog


def send(port: int, node_id: str, data: bytes, *, greeted: bool = True) -> None:
    """Connect to a member's port, read its greeting (``greeted``), send ``data``, close."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        if greeted:
            want = greeting(node_id)
            got = b""
            while not got.endswith(b"\n"):
                chunk = sock.recv(len(want) - len(got))
                assert chunk, "the port closed before its greeting"
                got += chunk
            assert got == want
        sock.sendall(data)


def said(logs: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in record.getMessage() for record in logs.records)


def wait_said(logs: pytest.LogCaptureFixture, text: str, count: int = 1) -> None:
    wait_until(
        lambda: said(logs, text) >= count,
        WAIT_S,
        message=lambda: (
            f"{text!r} logged {said(logs, text)} of {count} times; "
            + " | ".join(r.getMessage()[:120] for r in logs.records[-8:])
        ),
    )


def assert_no_traceback(logs: pytest.LogCaptureFixture) -> None:
    bad = [r for r in logs.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [r.getMessage() for r in bad]


def assert_runs(members: list[Member]) -> None:
    for member in members:
        poll = member.handler.poll()
        assert not poll.round_over and poll.closed is None, (member.handler.node_id, poll)


def notice(of: Job, member: Member, r: int | None = None, **over: Any) -> bytes:
    body: dict[str, Any] = {
        "job": of.run_id,
        "round": member.handler.round if r is None else r,
        "by": member.handler.node_id,
        "index": member.index,
        "cause": "worker_failure",
    }
    body.update(over)
    return encode_notice(RoundNotice(**body))


def test_a_failure_is_told_to_the_others_who_confirm_it_in_the_store(
    job: Job, logs: pytest.LogCaptureFixture
) -> None:
    a, b, c = job.join_all()
    assert a.handler.report_failure() is True  # a ends round 0 first
    for other in (b, c):
        wait_until(lambda o=other: o.handler.poll().round_over, WAIT_S)  # type: ignore[misc]
        poll = other.handler.poll()
        assert poll.learned_by == "notice", poll
        assert poll.notice_from == a.handler.node_id
        assert poll.end_cause == "worker_failure"  # read from the store, not the notice
    assert a.handler.poll().learned_by is None  # a told; it learned nothing
    assert_no_traceback(logs)


def test_a_non_members_notice_changes_nothing(job: Job, logs: pytest.LogCaptureFixture) -> None:
    a, b, c = job.join_all()
    # No arrival index (a sender that never arrived), about anything but a close: dropped
    # without a read.
    send(b.port, b.handler.node_id, notice(job, a, by="stranger-1-ff", index=-1))
    wait_said(logs, "(not a member)")
    # An index beyond the seal (a node at the door would say it waits): one look, no news.
    send(b.port, b.handler.node_id, notice(job, a, by="stranger-3-ff", index=17))
    wait_said(logs, "after a round notice from stranger-3-ff: round 0 goes on")
    # A close said by anyone: one look, and the job is not closed.
    send(b.port, b.handler.node_id, notice(job, a, by="stranger-4-ff", index=-1, cause="closed"))
    wait_said(logs, "after a round notice from stranger-4-ff: round 0 goes on")
    # A forged member's index: one look at the store, which says the round goes on.
    send(b.port, b.handler.node_id, notice(job, a, by="stranger-2-ff"))
    wait_said(logs, "after a round notice from stranger-2-ff: round 0 goes on")
    # Another job's notice, and a later round's.
    send(c.port, c.handler.node_id, notice(job, a, job="another-job"))
    wait_said(logs, "(other job)")
    send(c.port, c.handler.node_id, notice(job, a, r=7))
    wait_said(logs, "(later round)")
    assert_runs([a, b, c])
    assert_no_traceback(logs)


def test_a_replayed_notice_of_an_older_round_changes_nothing(
    job: Job, logs: pytest.LogCaptureFixture
) -> None:
    a, b, c = job.join_all()
    old = notice(job, a)  # round 0's, as a recording of the wire would hold it
    assert a.handler.report_failure() is True
    wait_until(lambda: b.handler.poll().round_over and c.handler.poll().round_over, WAIT_S)
    a, b, c = job.join_all()  # round 1
    assert {m.handler.round for m in (a, b, c)} == {1}
    for member in (b, c):
        send(member.port, member.handler.node_id, old)
    wait_said(logs, "about round 0 (older round)")  # b's, at warning level
    wait_said(logs, "about round 0 (older round)", 2)  # c's
    assert_runs([a, b, c])
    assert_no_traceback(logs)


def test_garbage_on_the_port_drops_its_client_and_nothing_else(
    job: Job, logs: pytest.LogCaptureFixture
) -> None:
    a, b, c = job.join_all()
    junk = [
        b"\x00\xff\xfe\x80 garbage\n",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"elastic-run round-ended {not json}\n",
        b'elastic-run round-ended {"v":1,"job":"x","round":0,"by":"x","index":0,"cause":"","run":"rm"}\n',
        b"x" * 5000,  # a line too long, no newline
    ]
    for data in junk:
        send(b.port, b.handler.node_id, data)
    send(b.port, b.handler.node_id, b"\x00\x01\x02\n", greeted=False)  # before reading anything
    wait_said(logs, "dropped a client of the death-notice port", len(junk) + 1)
    # The port still greets, the round still runs, and a real notice still gets through.
    assert answers(b.handler.node_id, "127.0.0.1", b.port, 10.0)
    assert_runs([a, b, c])
    assert a.handler.report_failure() is True
    wait_until(lambda: b.handler.poll().round_over, WAIT_S)
    assert b.handler.poll().learned_by == "notice"
    assert_no_traceback(logs)


def test_a_flood_of_notices_costs_at_most_one_look_each_and_changes_nothing(
    job: Job, logs: pytest.LogCaptureFixture
) -> None:
    a, b, c = job.join_all()
    per_connection, connections = 2000, 8
    forged = notice(job, a, by="forger-1-ff")  # a member's index: each is worth a look
    # Each connection ends with a marker the port drops without a look (no arrival index),
    # logged as it is read: once every marker is, the flood before it was read.
    threads = [
        threading.Thread(
            target=send,
            args=(
                b.port,
                b.handler.node_id,
                forged * per_connection + notice(job, a, by=f"marker-{k}", index=-1),
            ),
        )
        for k in range(connections)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for k in range(connections):
        wait_said(logs, f"from marker-{k} about round 0 (not a member)")
    looks = said(logs, "after a round notice from forger")
    assert 1 <= looks <= per_connection * connections + 1, looks
    assert_runs([a, b, c])
    assert b.handler.liveness().error is None
    # The job goes on: a real failure is still told, and confirmed, at once.
    assert a.handler.report_failure() is True
    wait_until(lambda: b.handler.poll().round_over and c.handler.poll().round_over, WAIT_S)
    assert {b.handler.poll().learned_by, c.handler.poll().learned_by} == {"notice"}
    assert_no_traceback(logs)
