"""A round's end told at once between real agents, and hostile lines on their ports (issue 40).

Real ``elastic-run`` agents on 127.0.0.1 (c10d, the first one hosts the store), the multi-node
tests' workers (``mn_scripts/worker.py``: record, maybe fail, wait for ``go``), which never fail
by themselves when a peer does: a node learns that the round ended from the failing node's
notice or from its own look at the store (``membership.changed``'s ``learned_by``). Heartbeats
tick every 5 s here, so a look that beats the notice is a rare accident, not the rule.
"""

from __future__ import annotations

import socket
from typing import Any

from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.liveness.peerwatch import greeting
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import NodeRecord, SealRecord, decode
from elastic_run.rendezvous.protocol.round_notice import RoundNotice, encode_notice
from elastic_run.rendezvous.registry import create_backend
from tests.e2e.test_multinode import START_S, Job, make_job_fixture  # noqa: F401 - a fixture
from tests.helpers import run_cli, wait_until

SLOW_LOOK = "keep_alive_interval=5"


def _members(job: Job, r: int) -> list[NodeRecord]:
    """The members of round ``r`` as their arrival records say (what anyone can read)."""
    reader = create_backend(
        RendezvousParameters("c10d", job.endpoint, job.run_id, 1, 1, is_host="false"),
        allow_hosting=False,
    )
    try:
        raw = reader.get(keys.seal(r))
        assert raw is not None
        seal = decode(SealRecord, keys.seal(r), raw)
        return [
            decode(NodeRecord, keys.node(r, i), reader.get(keys.node(r, i)))
            for i in seal.admitted_indices()
        ]
    finally:
        reader.close()


def _send(record: NodeRecord, data: bytes) -> None:
    with socket.create_connection((record.addr, record.alive_port), timeout=10) as sock:
        want = greeting(record.node_id)
        got = b""
        while not got.endswith(b"\n"):
            chunk = sock.recv(len(want) - len(got))
            assert chunk
            got += chunk
        sock.sendall(data)


def _run_until_b_restarted_once(job: Job, env: dict[str, str], extra: tuple[str, ...]) -> None:
    """Three agents (3:3, slow looks) whose node b's worker ends a round once; every agent exits 0."""
    for name in "abc":
        job.start(name, nnodes="3:3", conf=SLOW_LOOK, host=name == "a", extra=extra, env=env)
    wait_until(
        lambda: any(r["TORCHELASTIC_RESTART_COUNT"] == "1" for r in job.records("b")),
        START_S,
        interval_s=0.1,
        message=job.report,
    )
    job.wait_running(["a", "b", "c"], 3)
    job.go()
    for name in "abc":
        assert job.wait_exit(name) == 0, job.report()


def _told_by_b(job: Job, name: str) -> dict[str, Any]:
    """Node ``name``'s one round end, which b's notice told and the store confirmed."""
    changes = [e["fields"] for e in job.nodes[name].events() if e["kind"] == "membership.changed"]
    assert [c["reason"] for c in changes] == ["round_ended"], changes
    assert changes[0]["learned_by"] == "notice", changes
    assert f"-{job.nodes['b'].proc.pid}-" in changes[0]["notice_from"], changes
    assert changes[0]["cause"] == "worker_failure", changes
    return changes[0]


def test_a_worker_failure_is_told_to_the_other_nodes(make_job: Any) -> None:
    job = make_job(("c10d", ""))
    _run_until_b_restarted_once(job, {"MN_FAIL_NODE": "b"}, ("--max-restarts", "3"))
    for name in "ac":
        # Told by b, whose workers failed, and confirmed in the store (the cause is read there).
        _told_by_b(job, name)
        assert "restart" not in job.nodes[name].kinds()
    job.assert_no_survivors()


def test_hostile_lines_on_the_ports_leave_the_job_training(make_job: Any) -> None:
    job = make_job(("c10d", ""))
    for name in "ab":
        job.start(name, nnodes="2:2", host=name == "a")
    job.wait_running(["a", "b"], 2)
    a, b = _members(job, 0)

    def line(**over: Any) -> bytes:
        body: dict[str, Any] = {"job": job.run_id, "round": 0, "by": a.node_id, "index": 0}
        body.update(over)
        return encode_notice(RoundNotice(**body, cause="worker_failure"))

    for target in (a, b):
        _send(target, line(by="stranger-1-ff", index=-1))  # a sender that never arrived
        _send(target, line(by="stranger-2-ff"))  # a member's index, forged: one look
        _send(target, line(round=0, job="another-job"))
        _send(target, b"\x00\xff garbage\nGET / HTTP/1.1\r\n\r\n")
        _send(target, b"y" * 4096)  # a line too long
        _send(target, line(by="forger-1-ff") * 3000)  # a flood
    for node in job.nodes.values():
        wait_until(
            lambda n=node: "ignored a round notice from stranger-1-ff" in n.output(),  # type: ignore[misc]
            START_S,
            message=job.report,
        )
    job.go()
    assert job.wait_exit("a") == 0, job.report()
    assert job.wait_exit("b") == 0, job.report()
    for node in job.nodes.values():
        kinds = node.kinds()
        assert "membership.changed" not in kinds and "restart" not in kinds, kinds
        assert kinds.count("workers.started") == 1, kinds
        assert "Traceback" not in node.output(), node.output()[-3000:]
        assert "dropped a client of the death-notice port" in node.output()
    job.assert_no_survivors()


def _stopped(node: Any) -> list[dict[str, Any]]:
    return [e["fields"] for e in node.events() if e["kind"] == "workers.stopped"]


def test_elastic_run_close_is_told_to_every_agent_at_once(make_job: Any) -> None:
    job = make_job(("c10d", ""))
    for name in "abc":
        job.start(name, nnodes="3:3", conf=SLOW_LOOK, host=name == "a")
    job.wait_running(["a", "b", "c"], 3)
    done = run_cli(
        ["close", "--rdzv-backend", "c10d", "--rdzv-endpoint", job.endpoint,
         "--rdzv-id", job.run_id, "--rdzv-conf", "is_host=false"],
        timeout_s=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for name in "abc":
        assert job.wait_exit(name) == 3, job.report()
    for name in "abc":
        (stopped,) = _stopped(job.nodes[name])
        assert stopped["reason"] == "closed", stopped
        # Told by the close command itself (no member: arrival index -1), confirmed in the
        # store: without the notice each agent found the close at its epoch read (5 s apart).
        assert stopped["learned_by"] == "notice", stopped
        assert stopped["notice_from"].startswith("elastic-run close@"), stopped
        assert "restart" not in job.nodes[name].kinds()
    job.assert_no_survivors()


def test_a_node_at_the_door_tells_the_members_it_waits(make_job: Any) -> None:
    job = make_job(("c10d", ""))
    conf = f"{SLOW_LOOK},last_call_timeout=1"
    for name in "ab":
        job.start(name, nnodes="2:3", conf=conf, host=name == "a")
    job.wait_running(["a", "b"], 2)
    c = job.start("c", nnodes="2:3", conf=conf)
    job.wait_running(["a", "b", "c"], 3)
    job.go()
    for name in "abc":
        assert job.wait_exit(name) == 0, job.report()
    changes = {
        name: [e["fields"] for e in job.nodes[name].events() if e["kind"] == "membership.changed"]
        for name in "ab"
    }
    for name, found in changes.items():
        assert [f["reason"] for f in found] == ["nodes_waiting"], (name, found)
        assert found[0]["learned_by"] == "notice", (name, found)
        # The stop's phases, epoch seconds, in order: told, confirmed, signalled.
        assert found[0]["notice_at"] <= found[0]["learned_at"] <= found[0]["signalled_at"]
    # c told them as it arrived (one of a and b may have heard the other, who left first).
    assert any(f"-{c.proc.pid}-" in f[0]["notice_from"] for f in changes.values()), changes
    job.assert_no_survivors()


def test_a_hang_verdicts_round_end_is_told_to_the_other_nodes(make_job: Any) -> None:
    job = make_job(("c10d", ""))
    extra = ("--max-restarts", "3", "--hang-timeout", "3")
    _run_until_b_restarted_once(job, {"MN_HANG_NODE": "b"}, extra)
    b = job.nodes["b"]
    assert "worker.hung" in b.kinds(), b.kinds()
    (failed,) = [e["fields"] for e in b.events() if e["kind"] == "worker.failed"]
    assert failed["counted"] is True and failed["decided_at"] <= b.events()[-1]["ts"], failed
    for name in "ac":
        # Told by b, whose worker hung, confirmed in the store; its workers were signalled
        # once the store confirmed it, before this node's own events and store requests.
        change = _told_by_b(job, name)
        assert change["notice_at"] <= change["learned_at"] <= change["signalled_at"], change
        assert "worker.hung" not in job.nodes[name].kinds()
    job.assert_no_survivors()
