"""EtcdServer and EtcdStore on a real etcd: the torch Store API, gloo over it, restarts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import urllib.request
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from etcd_fixtures import etcd_server_fixture, requires_etcd, wait_until  # noqa: F401

from elastic_run.agent.loop.simple import wait_keys
from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.errors import RendezvousConnectionError, RendezvousTimeoutError
from elastic_run.rendezvous.etcd.client import EtcdClient
from elastic_run.rendezvous.etcd.server import EtcdServer
from elastic_run.rendezvous.etcd.store import EtcdStore, EtcdStoreTimeoutError

pytestmark = [pytest.mark.etcd, requires_etcd]

REPO = Path(__file__).resolve().parents[2]


def _store(server: EtcdServer, timeout_s: float = 10.0) -> EtcdStore:
    return EtcdStore(
        server.get_client(), f"/test/{uuid.uuid4().hex}", timedelta(seconds=timeout_s), True
    )


def test_server_start_stop_cleans_up() -> None:
    server = EtcdServer()
    server.start(timeout_s=30)
    data_dir = server.data_dir
    client = server.get_client(retry_window_s=0.5, timeout_s=2.0)
    client.put("/k", b"v")
    assert server.is_member_running(0)
    server.stop()
    assert not data_dir.exists()
    with pytest.raises(RendezvousConnectionError, match=server.endpoint):
        client.get("/k")
    client.close()


def test_missing_binary_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTIC_RUN_ETCD_BINARY", "/nonexistent/etcd")
    with pytest.raises(ConfigurationError, match="/nonexistent/etcd"):
        EtcdServer()


def test_store_api(etcd_server: EtcdServer) -> None:
    store = _store(etcd_server, timeout_s=0.5)
    try:
        store.set("a", "1")
        store.set("b", b"\x00\x01")
        assert store.get("a") == b"1"
        assert store.get("b") == b"\x00\x01"
        assert store.add("n", 3) == 3
        assert store.add("n", -1) == 2
        assert store.get("n") == b"2"
        # compare_set: "" expects absence; a wrong expectation returns the current value.
        assert store.compare_set("c", "", "x") == b"x"
        assert store.compare_set("c", "", "y") == b"x"
        assert store.compare_set("c", "x", "z") == b"z"
        assert store.compare_set("c", "nope", "w") == b"z"
        assert store.compare_set("absent", "e", "d") == b"e"
        assert store.check(["a", "c"])
        assert not store.check(["a", "missing"])
        assert store.num_keys() == 4
        assert sorted(store.list_keys()) == ["a", "b", "c", "n"]
        assert store.delete_key("a")
        assert not store.delete_key("a")
        store.multi_set(["m1", "m2"], ["1", b"2"])
        assert store.multi_get(["m1", "m2"]) == [b"1", b"2"]
        store.append("log", "ab")
        store.append("log", b"cd")
        assert store.get("log") == b"abcd"
        store.wait(["m1", "m2"])
        with pytest.raises(EtcdStoreTimeoutError, match="missing") as info:
            store.get("missing")
        assert isinstance(info.value, RendezvousTimeoutError)
        with pytest.raises(EtcdStoreTimeoutError):
            store.wait(["missing"], timedelta(seconds=0.2))
        store.set_timeout(timedelta(seconds=7))
        assert store.timeout == timedelta(seconds=7)
    finally:
        store.close()


def test_store_get_unblocks_when_another_client_sets(etcd_server: EtcdServer) -> None:
    reader = _store(etcd_server, timeout_s=30)
    writer = EtcdStore(etcd_server.get_client(), reader.prefix, owns_client=True)
    got: list[bytes] = []
    thread = threading.Thread(target=lambda: got.append(reader.get("late")))
    thread.start()
    try:
        writer.set("late", "here")
        thread.join(30)
        assert got == [b"here"]
    finally:
        reader.close()
        writer.close()


def test_agent_wait_keys_outlasts_the_etcd_store_slices(etcd_server: EtcdServer) -> None:
    # The agent waits in short slices (so signals are handled between them); an etcd store's
    # slice timing out must mean "wait on", not end the wait with an error.
    store = _store(etcd_server)
    try:
        assert wait_keys(store, ["never"], timeout_s=0.3, slice_s=0.05) is False
        store.set("there", "1")
        assert wait_keys(store, ["there"], timeout_s=5.0, slice_s=0.05) is True
    finally:
        store.close()


def test_store_reads_and_writes_more_keys_than_one_etcd_transaction_holds(
    etcd_server: EtcdServer,
) -> None:
    # etcd refuses a transaction of more than 128 operations by default; a 512-node round
    # reads more keys than that at once.
    store = _store(etcd_server)
    keys = [f"k{i}" for i in range(300)]
    try:
        store.multi_set(keys, [f"v{i}" for i in range(300)])
        assert store.multi_get(keys) == [f"v{i}".encode() for i in range(300)]
        assert store.num_keys() == 300
    finally:
        store.close()


def test_store_add_is_atomic_across_clients(etcd_server: EtcdServer) -> None:
    prefix = f"/test/{uuid.uuid4().hex}"
    stores = [EtcdStore(etcd_server.get_client(), prefix, owns_client=True) for _ in range(4)]
    results: list[int] = []
    lock = threading.Lock()

    def bump(store: EtcdStore) -> None:
        for _ in range(10):
            value = store.add("counter", 1)
            with lock:
                results.append(value)

    threads = [threading.Thread(target=bump, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert sorted(results) == list(range(1, 41))
        assert stores[0].get("counter") == b"40"
    finally:
        for s in stores:
            s.close()


_WORKER = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    from elastic_run.rendezvous.etcd.store import EtcdStore

    endpoint, prefix, rank, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store = EtcdStore.connect([endpoint], prefix, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print(f"rank {rank} sum {t.item():g}", flush=True)
    dist.destroy_process_group()
    store.close()
    """
)


def test_gloo_all_reduce_over_etcd_store(etcd_server: EtcdServer, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    prefix = f"/test/{uuid.uuid4().hex}/pg"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    world = 3
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), etcd_server.endpoint, prefix, str(r), str(world)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for r in range(world)
    ]
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=90)
            outputs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, out) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0, out
        assert f"rank {r} sum 6" in out, out


def _watchers(endpoint: str) -> int:
    """The number of watchers etcd reports on its /metrics page."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith("etcd_debugging_mvcc_watcher_total "):
            return int(float(line.split()[1]))
    return 0


def test_watch_resumes_after_server_restart() -> None:
    server = EtcdServer()
    server.start(timeout_s=30)
    try:
        reader = EtcdStore(
            server.get_client(retry_window_s=30.0), "/restart", timedelta(seconds=60), True
        )
        reader.set("ready", "1")
        got: list[bytes] = []
        errors: list[BaseException] = []

        def read() -> None:
            try:
                got.append(reader.get("after"))
            except BaseException as exc:  # surfaced by the assertion below
                errors.append(exc)

        thread = threading.Thread(target=read)
        thread.start()
        wait_until(lambda: _watchers(server.endpoint) >= 1, 30, "the reader's watch")
        # The reader is blocked on a watch when the server goes down and comes back.
        server.restart_member(0)
        writer = server.get_client()
        writer.put("/restart/after", b"back")
        thread.join(60)
        writer.close()
        reader.close()
        assert not errors, errors
        assert got == [b"back"]
    finally:
        server.stop()


def test_etcd_command_runs_until_sigterm(tmp_path: Path) -> None:
    code = "from elastic_run.cli.etcd_cmd import etcd_command; etcd_command()"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--data-dir", str(tmp_path / "etcd")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = ""
        for line in proc.stdout:
            if "--rdzv-endpoint" in line:
                break
        endpoint = line.split("--rdzv-endpoint", 1)[1].strip()
        client = EtcdClient([endpoint])
        client.put("/cli", b"ok")
        assert client.get("/cli") is not None
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert (tmp_path / "etcd" / "member0.log").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
