"""EtcdRendezvousBackend on a real etcd: every method, races, leases, failover, TLS and auth."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etcd_fixtures import (  # noqa: F401 - fixtures
    etcd_cluster3_fixture,
    etcd_server_fixture,
    requires_etcd,
    wait_until,
)

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.errors import (
    RendezvousConnectionError,
    RendezvousError,
)
from elastic_run.rendezvous.etcd.backend import EtcdRendezvousBackend, create_etcd_backend
from elastic_run.rendezvous.etcd.server import EtcdServer, EtcdServerTLS
from elastic_run.rendezvous.etcd.store import EtcdStore
from tests.helpers import freeze
from tests.machine import require_program

pytestmark = [pytest.mark.etcd, requires_etcd]


def _params(endpoint: str, run_id: str | None = None, **conf: str) -> RendezvousParameters:
    return RendezvousParameters(
        "etcd", endpoint, run_id or f"job-{uuid.uuid4().hex[:8]}", 1, 4, **conf
    )


@pytest.fixture
def backend(etcd_server: EtcdServer) -> Iterator[EtcdRendezvousBackend]:
    b = create_etcd_backend(_params(etcd_server.endpoint))
    try:
        yield b
    finally:
        b.delete_all()
        b.close()


def _peer(b: EtcdRendezvousBackend, endpoint: str, **conf: str) -> EtcdRendezvousBackend:
    """Another node's backend on the same job."""
    run_id = b.key_base.rstrip("/").rsplit("/", 1)[1]
    return create_etcd_backend(_params(endpoint, run_id, **conf))


def test_factory_reads_endpoints_and_config() -> None:
    b = create_etcd_backend(
        _params("10.0.0.1,10.0.0.2:2380", "job1", key_prefix="/custom", read_timeout="5")
    )
    assert b.name == "etcd"
    assert b.endpoint == "10.0.0.1:2379,10.0.0.2:2380"
    assert b.key_base == "/custom/job1/"
    assert b.client.timeout_s == 5.0
    b.close()
    with pytest.raises(ConfigurationError, match="protocol"):
        create_etcd_backend(_params("h:1", protocol="ftp"))
    with pytest.raises(ConfigurationError, match="port"):
        create_etcd_backend(_params("h:notaport"))


def test_key_value_methods(backend: EtcdRendezvousBackend, etcd_server: EtcdServer) -> None:
    assert not backend.exists()
    assert backend.get("round") is None
    backend.set("round", b"0")
    assert backend.exists()
    backend.set_many({"a": b"1", "b": b'{"v": 1}'})
    assert backend.get_many(["a", "missing", "b"]) == [b"1", None, b'{"v": 1}']
    assert backend.get_many([]) == []
    assert backend.add("n", 5) == 5
    assert backend.add("n", -2) == 3
    assert backend.compare_set("c", None, b"x") == (b"x", True)
    assert backend.compare_set("c", None, b"y") == (b"x", False)
    assert backend.compare_set("c", b"x", b"z") == (b"z", True)
    assert backend.compare_set("c", b"x", b"w") == (b"z", False)
    # A key that holds the desired value already was written by this caller (as on c10d):
    # what a compare-set sent again after its first answer was lost finds.
    assert backend.compare_set("c", b"x", b"z") == (b"z", True)
    assert backend.compare_set("c", None, b"z") == (b"z", True)
    store = backend.round_store("r0/shared/")
    assert isinstance(store, EtcdStore)
    store.set("k", "v")
    assert backend.get("r0/shared/k") == b"v"
    assert store.get("k") == b"v"
    # An unreachable store is a connection error naming the endpoint.
    gone = create_etcd_backend(_params("127.0.0.1:1", read_timeout="1"))
    with pytest.raises(RendezvousConnectionError, match="127.0.0.1:1"):
        gone.get("round")
    gone.close()


def test_compare_set_race_has_one_winner(
    backend: EtcdRendezvousBackend, etcd_server: EtcdServer
) -> None:
    peers = [_peer(backend, etcd_server.endpoint) for _ in range(6)]
    results: list[tuple[bytes, bool]] = []
    lock = threading.Lock()
    start = threading.Barrier(len(peers))

    def race(i: int, b: EtcdRendezvousBackend) -> None:
        start.wait()
        result = b.compare_set("seal", None, f"node{i}".encode())
        with lock:
            results.append(result)

    threads = [threading.Thread(target=race, args=(i, b)) for i, b in enumerate(peers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winners = [value for value, written in results if written]
    assert len(results) == len(peers)
    assert len(winners) == 1
    assert {value for value, _ in results} == {winners[0]}
    assert backend.get("seal") == winners[0]
    for b in peers:
        b.close()


def test_add_of_one_is_one_transaction_whatever_the_contention(
    backend: EtcdRendezvousBackend, etcd_server: EtcdServer
) -> None:
    # N nodes arriving at once must cost N transactions (O(N) per round), not a
    # compare-and-swap loop's O(N^2) retries.
    peers = [_peer(backend, etcd_server.endpoint) for _ in range(4)]
    calls: list[str] = []
    for peer in peers:
        real = peer.client.call

        def counted(what: str, fn: Any, real: Any = real) -> Any:
            calls.append(what)
            return real(what, fn)

        peer.client.call = counted  # type: ignore[method-assign]
    go = threading.Barrier(len(peers))
    seen: list[int] = []

    def bump(b: EtcdRendezvousBackend) -> None:
        go.wait()
        for _ in range(25):
            seen.append(b.add("arrivals", 1))

    threads = [threading.Thread(target=bump, args=(b,)) for b in peers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(seen) == list(range(1, 101))
    assert len([c for c in calls if c.startswith("add to")]) == 100
    assert len(calls) == 100
    for b in peers:
        b.close()


def test_counters_mix_deltas_and_read_as_integers(backend: EtcdRendezvousBackend) -> None:
    assert backend.add("c", 1) == 1
    assert backend.add("c", 1) == 2
    assert backend.add("c", 5) == 7
    assert backend.add("c", 1) == 8
    assert backend.add("c", -8) == 0
    assert backend.add("c", 1) == 1
    assert backend.get("c") == b"1"
    assert backend.get_many(["c", "missing"]) == [b"1", None]
    backend.set("plain", b"41")  # an integer written by hand counts on from there
    assert backend.add("plain", 1) == 42
    assert backend.get("plain") == b"42"
    backend.set("garbage", b"not a number")
    with pytest.raises(RendezvousError, match="not a counter"):
        backend.add("garbage", 1)


def test_add_is_atomic_under_concurrency(
    backend: EtcdRendezvousBackend, etcd_server: EtcdServer
) -> None:
    peers = [_peer(backend, etcd_server.endpoint) for _ in range(4)]
    seen: list[int] = []
    lock = threading.Lock()

    def bump(b: EtcdRendezvousBackend) -> None:
        for _ in range(10):
            value = b.add("arrivals", 1)
            with lock:
                seen.append(value)

    threads = [threading.Thread(target=bump, args=(b,)) for b in peers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(seen) == list(range(1, 41))
    assert backend.get("arrivals") == b"40"
    for b in peers:
        b.close()


def test_wait_for_unblocks_on_write_and_times_out(
    backend: EtcdRendezvousBackend, etcd_server: EtcdServer
) -> None:
    assert backend.wait_for([], 0.1)
    assert not backend.wait_for(["never"], 0.3)
    backend.set("one", b"1")
    outcome: list[bool] = []
    thread = threading.Thread(target=lambda: outcome.append(backend.wait_for(["one", "two"], 30)))
    thread.start()
    writer = _peer(backend, etcd_server.endpoint)
    writer.set("two", b"2")
    thread.join(30)
    writer.close()
    assert outcome == [True]


def test_heartbeats_count_and_vanish_with_the_lease(
    backend: EtcdRendezvousBackend, etcd_server: EtcdServer
) -> None:
    # A 4 s lease refreshed every 1.3 s: a keeper starved for a while on a loaded machine does
    # not let it expire (the test is about the refreshes, not how tight they can be).
    node = _peer(backend, etcd_server.endpoint, keep_alive_interval="1", keep_alive_max_attempt="4")
    node.heartbeat("a")
    node.heartbeat("a")
    node.heartbeat("b")
    assert backend.read_heartbeats(["a", "b", "c"]) == [2, 1, None]
    node.forget_node("b")
    assert backend.read_heartbeats(["b"]) == [None]
    # The keeper refreshes the 4 s lease: the key is still there well past its TTL.
    kv = backend.client.get(f"{backend.key_base}hb/a")
    assert kv is not None and kv.lease_id != 0
    outlived_at = time.monotonic() + 6.0

    def outlived_ttl() -> bool:
        assert backend.read_heartbeats(["a"]) == [2], "the heartbeat expired while refreshed"
        return time.monotonic() > outlived_at

    wait_until(outlived_ttl, 15, "the lease to outlive its TTL")
    node.heartbeat("a")
    assert backend.read_heartbeats(["a"]) == [3]
    # The node stops refreshing (as if it died): its heartbeat disappears after the TTL.
    node.close()
    wait_until(lambda: backend.read_heartbeats(["a"]) == [None], 15, "the lease to expire")
    # Garbage under a heartbeat key reads as a counter (judged like any other), never raises.
    backend.set("hb/garbage", b"not a number")
    (garbage,) = backend.read_heartbeats(["garbage"])
    assert garbage is not None and garbage > 2**62


def test_keys_are_readable_with_etcdctl(
    backend: EtcdRendezvousBackend, etcd_server: EtcdServer
) -> None:
    backend.compare_set("round", None, b"0")
    backend.add("r0/arrivals", 1)
    backend.set("r0/node/0", json.dumps({"version": 1, "node_id": "n0"}).encode())
    backend.heartbeat("n0")
    out = subprocess.run(
        ["etcdctl", "--endpoints", etcd_server.endpoint, "get", "--prefix", backend.key_base],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env={**os.environ, "ETCDCTL_API": "3"},
    ).stdout.splitlines()
    pairs = dict(zip(out[0::2], out[1::2], strict=True))
    assert set(pairs) == {
        f"{backend.key_base}{k}" for k in ("round", "r0/arrivals", "r0/node/0", "hb/n0")
    }
    for value in pairs.values():
        json.loads(value)  # ints and JSON objects: all readable
    backend.forget_node("n0")


def test_cluster_survives_a_killed_member(etcd_cluster3: EtcdServer) -> None:
    endpoints = ",".join(etcd_cluster3.endpoints)
    b = create_etcd_backend(_params(endpoints, read_timeout="5"))
    other = _peer(b, endpoints, read_timeout="5")
    try:
        b.set("round", b"0")
        assert b.add("arrivals", 1) == 1
        in_use = etcd_cluster3.endpoints.index(b.client.endpoint)
        etcd_cluster3.kill_member(in_use)
        # Every operation goes on through the surviving members.
        assert b.get("round") == b"0"
        assert b.add("arrivals", 1) == 2
        assert b.compare_set("round", b"0", b"1") == (b"1", True)
        assert b.client.endpoint != etcd_cluster3.endpoints[in_use]
        outcome: list[bool] = []
        thread = threading.Thread(target=lambda: outcome.append(b.wait_for(["sealed"], 30)))
        thread.start()
        other.set("sealed", b"1")
        thread.join(30)
        assert outcome == [True]
        b.heartbeat("n0")
        assert other.read_heartbeats(["n0"]) == [1]
        etcd_cluster3.restart_member(in_use)
        assert other.get("round") == b"1"
    finally:
        b.close()
        other.close()


def test_a_cluster_between_leaders_is_reachable(etcd_cluster3: EtcdServer) -> None:
    # An agent that starts while the cluster elects a leader (its leader was just killed)
    # reaches the store: its first read is one any member answers. Two members dead leave
    # the third without a leader for good, the longest election there is; a read that needs
    # a leader fails there (an agent started in an election once exited 4: "leader changed").
    etcd_cluster3.kill_member(0)
    etcd_cluster3.kill_member(1)
    b = create_etcd_backend(_params(",".join(etcd_cluster3.endpoints), read_timeout="10"))
    try:
        b.check_reachable(5.0)
        assert b.client.endpoint == etcd_cluster3.endpoints[2]
    finally:
        b.close()


def _watchers(cluster: EtcdServer, i: int) -> int:
    """How many watches member ``i`` holds (its own /metrics)."""
    with urllib.request.urlopen(f"http://{cluster.endpoints[i]}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("etcd_debugging_mvcc_watcher_total "):
                return int(float(line.split()[1]))
    raise AssertionError("etcd reports no watcher count")


def test_a_wait_fails_over_from_a_frozen_member(etcd_cluster3: EtcdServer) -> None:
    # A member that stops answering without closing its connections (SIGSTOP here; a paused
    # VM, a partition that drops packets) never breaks the watch stream held on it: the key
    # is written through the others, and the wait must see it, not wait out its timeout
    # (300 s here; it sees it within 2 x read_timeout).
    endpoints = etcd_cluster3.endpoints
    b = create_etcd_backend(_params(",".join(endpoints), read_timeout="2"))
    try:
        b.get("round")
        in_use = endpoints.index(b.client.endpoint)
        others = ",".join(e for i, e in enumerate(endpoints) if i != in_use)
        # The writer takes its default deadline: when the frozen member led, the others elect
        # a new leader first, which can take longer than 2 s on a busy machine (stop 34's
        # rerun, once the member was surely frozen before the write).
        other = _peer(b, others)
        outcome: list[bool] = []
        thread = threading.Thread(target=lambda: outcome.append(b.wait_for(["sealed"], 300)))
        thread.start()
        wait_until(lambda: _watchers(etcd_cluster3, in_use) > 0, 30, "the watch on the member")
        pid = etcd_cluster3.member_pid(in_use)
        assert pid is not None
        freeze(pid)
        try:
            other.set("sealed", b"1")
            thread.join(60)
            assert outcome == [True]
            assert b.client.endpoint != endpoints[in_use]
        finally:
            os.kill(pid, signal.SIGCONT)
            thread.join(60)
            other.close()
    finally:
        b.close()


def test_the_callers_of_one_key_share_one_watch(etcd_server: EtcdServer) -> None:
    # Issue 38: each node's client held a watch stream of its own (a pyetcd watch thread and
    # two gRPC threads), and a process's 256 nodes all waited on the same seal key.
    key = f"/test/{uuid.uuid4().hex}/seal"
    clients = [etcd_server.get_client(timeout_s=30.0) for _ in range(3)]
    watchers_before = sum(1 for t in threading.enumerate() if t.name.startswith("pyetcd_watch"))
    try:
        revision = clients[0].status_revision()
        seen: list[list[bytes]] = []

        def wait(client: Any) -> None:
            events = client.watch(key, start_revision=revision + 1, timeout_s=30)
            seen.append([e.value for e in events])

        threads = [threading.Thread(target=wait, args=(c,)) for c in clients[:2]]
        for t in threads:
            t.start()
        # A third caller, whose read came later, joins the same watch.
        later = clients[2].status_revision()
        third = threading.Thread(
            target=lambda: seen.append(
                [e.value for e in clients[2].watch(key, start_revision=later + 1, timeout_s=30)]
            )
        )
        third.start()
        wait_until(
            lambda: (
                sum(1 for t in threading.enumerate() if t.name.startswith("pyetcd_watch"))
                > watchers_before
            ),
            10,
            "a watch to be made",
        )
        clients[0].put(key, b"sealed")
        for t in [*threads, third]:
            t.join(30)
        assert seen == [[b"sealed"]] * 3
        watchers = sum(1 for t in threading.enumerate() if t.name.startswith("pyetcd_watch"))
        assert watchers - watchers_before <= 1  # one watch thread for the three clients
    finally:
        for c in clients:
            c.close()


def test_a_watch_is_made_on_a_live_member_when_the_one_in_use_froze(
    etcd_cluster3: EtcdServer,
) -> None:
    # The member never answers the watch's creation: that is a member not reached (fail
    # over), not a refusal (which would end the join).
    endpoints = etcd_cluster3.endpoints
    b = create_etcd_backend(_params(",".join(endpoints), read_timeout="2"))
    try:
        revision = b.client.status_revision()
        in_use = endpoints.index(b.client.endpoint)
        other = _peer(b, ",".join(e for i, e in enumerate(endpoints) if i != in_use))
        pid = etcd_cluster3.member_pid(in_use)
        assert pid is not None
        freeze(pid)
        try:
            other.set("sealed", b"1")
            events = b.client.watch(
                b.key_base + "sealed", start_revision=revision + 1, timeout_s=60
            )
            assert [e.value for e in events] == [b"1"]
        finally:
            os.kill(pid, signal.SIGCONT)
            other.close()
    finally:
        b.close()


# -- TLS and authentication -----------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_ca(cwd: Path, name: str) -> None:
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=cwd)
    _openssl(
        "req", "-x509", "-new", "-key", f"{name}.key", "-days", "2", "-subj", f"/CN={name}",
        "-out", f"{name}.pem", cwd=cwd,
    )  # fmt: skip


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_program("openssl", "openssl")
    d = tmp_path_factory.mktemp("tls")
    _make_ca(d, "ca")
    _make_ca(d, "other-ca")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("genrsa", "-out", "server.key", "2048", cwd=d)
    _openssl(
        "req", "-new", "-key", "server.key", "-subj", "/CN=127.0.0.1", "-out", "server.csr", cwd=d
    )
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "san.cnf", "-out", "server.pem", cwd=d,
    )  # fmt: skip
    return d


@pytest.fixture(scope="module")
def tls_auth_server(tls_dir: Path) -> Iterator[EtcdServer]:
    tls = EtcdServerTLS(str(tls_dir / "server.pem"), str(tls_dir / "server.key"))
    server = EtcdServer(tls=tls)
    etcdctl = require_program("etcdctl", "etcd-client")
    server.start(timeout_s=30)
    try:
        ctl = [
            etcdctl, "--endpoints", f"https://{server.endpoint}",
            "--cacert", str(tls_dir / "ca.pem"),
        ]  # fmt: skip
        env = {**os.environ, "ETCDCTL_API": "3"}
        for args in (
            ["user", "add", "root:rootpw"],
            ["user", "grant-role", "root", "root"],
            ["user", "add", "alice:secret"],
            ["role", "add", "jobs"],
            ["role", "grant-permission", "jobs", "--prefix=true", "readwrite", "/elastic-run/"],
            ["user", "grant-role", "alice", "jobs"],
            ["auth", "enable"],
        ):
            subprocess.run([*ctl, *args], check=True, capture_output=True, env=env, timeout=30)
        yield server
    finally:
        server.stop()


def test_tls_and_password_work(tls_auth_server: EtcdServer, tls_dir: Path) -> None:
    b = create_etcd_backend(
        _params(
            tls_auth_server.endpoint,
            protocol="https",
            cacert=str(tls_dir / "ca.pem"),
            user="alice",
            password="secret",
        )
    )
    try:
        b.set("round", b"0")
        assert b.add("r0/arrivals", 1) == 1
        b.heartbeat("n0")
        assert b.read_heartbeats(["n0"]) == [1]
        assert b.wait_for(["round"], 1)
        b.forget_node("n0")
    finally:
        b.delete_all()
        b.close()


def test_wrong_password_is_one_clear_line(tls_auth_server: EtcdServer, tls_dir: Path) -> None:
    b = create_etcd_backend(
        _params(
            tls_auth_server.endpoint,
            protocol="https",
            ca_cert=str(tls_dir / "ca.pem"),
            user="alice",
            password="wrong",
        )
    )
    with pytest.raises(RendezvousError) as info:
        b.get("round")
    b.close()
    message = str(info.value)
    assert not isinstance(info.value, RendezvousConnectionError)
    assert message == f"etcd {tls_auth_server.endpoint} rejected the credentials for user 'alice'"


def test_untrusted_certificate_is_one_clear_line(
    tls_auth_server: EtcdServer, tls_dir: Path
) -> None:
    b = create_etcd_backend(
        _params(
            tls_auth_server.endpoint,
            protocol="https",
            ca_cert=str(tls_dir / "other-ca.pem"),
            user="alice",
            password="secret",
            read_timeout="3",
        )
    )
    with pytest.raises(RendezvousError) as info:
        b.get("round")
    b.close()
    message = str(info.value)
    assert "\n" not in message
    assert "TLS" in message and tls_auth_server.endpoint in message


def test_invalidated_auth_token_is_renewed(tls_auth_server: EtcdServer, tls_dir: Path) -> None:
    b = create_etcd_backend(
        _params(
            tls_auth_server.endpoint,
            protocol="https",
            ca_cert=str(tls_dir / "ca.pem"),
            user="alice",
            password="secret",
        )
    )
    try:
        b.set("round", b"0")
        before = tls_auth_server.read_logs().count("invalid auth token")
        # Setting the same password again invalidates alice's tokens, as an expiry does.
        subprocess.run(
            [
                "etcdctl", "--endpoints", f"https://{tls_auth_server.endpoint}",
                "--cacert", str(tls_dir / "ca.pem"), "--user", "root:rootpw",
                "user", "passwd", "alice", "--interactive=false",
            ],
            input="secret\n", check=True, capture_output=True, text=True, timeout=30,
            env={**os.environ, "ETCDCTL_API": "3"},
        )  # fmt: skip
        assert b.get("round") == b"0"
        assert tls_auth_server.read_logs().count("invalid auth token") > before
    finally:
        b.delete_all()
        b.close()


def test_password_over_plain_http() -> None:
    server = EtcdServer()
    server.start(timeout_s=30)
    try:
        ctl = ["etcdctl", "--endpoints", server.endpoint]
        env = {**os.environ, "ETCDCTL_API": "3"}
        for args in (["user", "add", "root:rootpw"], ["auth", "enable"]):
            subprocess.run([*ctl, *args], check=True, capture_output=True, env=env, timeout=30)
        b = create_etcd_backend(_params(server.endpoint, user="root", password="rootpw"))
        b.set("round", b"0")
        assert b.wait_for(["round"], 1)
        b.close()
    finally:
        server.stop()
