"""EtcdServer and the etcd backend module as torch's docs describe them, on a real etcd.

From torch's docs: ``EtcdServer(data_dir=None)`` starts a local standalone etcd on a free port
with ``start(timeout=60, num_retries=3, stderr=None)``, which retries a failed start and raises
``TimeoutError`` when the server is not ready in time; ``get_host()``, ``get_port()``,
``get_endpoint()`` (``host:port``), ``get_client()``, ``stop()`` (which also removes a data
directory it made). ``etcd_rendezvous_backend.create_backend(params) -> (backend, store)``.
Ours speaks etcd v3 where torch's speaks v2: ``get_client()`` returns our v3 client.
"""

from __future__ import annotations

import stat
import uuid
from pathlib import Path

import pytest

from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.etcd import backend as etcd_backend
from elastic_run.rendezvous.etcd.backend import EtcdRendezvousBackend
from elastic_run.rendezvous.etcd.server import EtcdServer
from elastic_run.rendezvous.etcd.store import EtcdStore
from elastic_run.rendezvous.registry import get_rendezvous_handler
from tests.helpers import is_alive

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.etcd,
    pytest.mark.usefixtures("etcd_binary"),  # fails every test here when etcd is missing
]


def test_etcd_server_as_torch_documents_it() -> None:
    server = EtcdServer()
    try:
        server.start(timeout=60, num_retries=3, stderr=None)
        host, port = server.get_host(), server.get_port()
        assert server.get_endpoint() == f"{host}:{port}" and port > 0
        client = server.get_client()
        try:
            client.put("/compat/key", b"value")
            kv = client.get("/compat/key")
            assert kv is not None and kv.value == b"value"
        finally:
            client.close()
        data_dir = server.data_dir
        assert data_dir.is_dir()
    finally:
        server.stop()
    assert not data_dir.exists(), "stop() removes the data directory it made"


def test_etcd_server_host_is_the_address_it_listens_on_where_torchs_says_localhost(
    tmp_path: Path,
) -> None:
    """A documented difference (docs/python-api.md): torch's ``get_host()`` is ``localhost``,
    ours the address the member listens on; both answer before ``start()``."""
    from torch.distributed.elastic.rendezvous.etcd_server import EtcdServer as Theirs

    from elastic_run.elastic.rendezvous.etcd_server import EtcdServer as Mirrored

    assert Theirs(data_dir=str(tmp_path / "theirs")).get_host() == "localhost"
    assert Mirrored(data_dir=str(tmp_path / "ours")).get_host() == "127.0.0.1"


def test_a_given_data_dir_is_used_and_kept(tmp_path: Path) -> None:
    server = EtcdServer(data_dir=str(tmp_path / "etcd"))
    server.start(timeout=60)
    try:
        assert any((tmp_path / "etcd").iterdir())
    finally:
        server.stop()
    assert (tmp_path / "etcd").is_dir()


def test_a_server_that_never_gets_ready_is_a_timeout_after_its_retries(tmp_path: Path) -> None:
    fake = tmp_path / "etcd"
    fake.write_text('#!/bin/sh\necho "fake etcd $$" >> "$(dirname "$0")/starts"\nexec sleep 600\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    server = EtcdServer(binary=str(fake))
    with pytest.raises(TimeoutError) as caught:
        server.start(timeout=1, num_retries=2)
    assert "did not become healthy" in str(caught.value)
    starts = (tmp_path / "starts").read_text().splitlines()
    assert len(starts) == 2, "one start per try"
    assert not any(is_alive(int(line.split()[-1])) for line in starts)


def test_etcd_create_backend_returns_a_backend_and_a_store_beside_it() -> None:
    server = EtcdServer()
    server.start(timeout=60)
    try:
        params = RendezvousParameters(
            "etcd", server.get_endpoint(), f"compat-{uuid.uuid4().hex[:8]}", 1, 1
        )
        backend, store = etcd_backend.create_backend(params)
        try:
            assert isinstance(backend, EtcdRendezvousBackend) and isinstance(store, EtcdStore)
            store.set("key", "value")
            assert store.get("key") == b"value"
            assert store.add("n", 2) == 2
        finally:
            backend.close()
        with pytest.raises(ValueError):
            etcd_backend.create_backend(
                RendezvousParameters("etcd", server.get_endpoint(), "x", 1, 1, protocol="ftp")
            )

        # torch users' backend name: etcd-v2 (etcd v3 underneath) builds a working handler
        handler = get_rendezvous_handler(
            RendezvousParameters("etcd-v2", server.get_endpoint(), params.run_id + "b", 1, 1)
        )
        try:
            assert handler.get_backend() == "etcd"
            assert handler.next_rendezvous().world_size == 1
        finally:
            handler.shutdown()
    finally:
        server.stop()


@pytest.mark.parametrize("read_timeout", [None, "1"])
def test_etcd_create_backend_raises_a_connection_error_when_etcd_is_unreachable(
    read_timeout: str | None,
) -> None:
    """torch's ``create_backend`` connects before it returns (its client fetches the members)
    and raises ``RendezvousConnectionError`` for an etcd it cannot reach: a free port with
    nothing listening, here."""
    from elastic_run.elastic.rendezvous import RendezvousConnectionError as Mirrored
    from elastic_run.elastic.rendezvous.etcd_rendezvous_backend import create_backend
    from tests.helpers import free_port

    conf = {} if read_timeout is None else {"read_timeout": read_timeout}
    params = RendezvousParameters("etcd", f"127.0.0.1:{free_port()}", "compat-down", 1, 1, **conf)
    with pytest.raises(Mirrored) as caught:
        create_backend(params)
    assert "cannot be reached" in str(caught.value)


def test_etcd_store_takes_torchs_parameter_names() -> None:
    """torch's keyword calls bind to ours: ``EtcdStore(etcd_client, etcd_store_prefix, timeout)``,
    ``add(key, num)``, ``wait(keys, override_timeout)`` (their positional order too)."""
    from datetime import timedelta

    from torch.distributed import DistStoreError
    from torch.distributed.elastic.rendezvous.etcd_store import EtcdStore as Theirs

    from elastic_run.elastic.rendezvous.etcd_store import EtcdStore as Mirrored

    server = EtcdServer()
    server.start(timeout=60)
    try:
        prefix = f"/compat-{uuid.uuid4().hex[:8]}"
        client = server.get_client()
        by_name = Mirrored(
            etcd_client=client, etcd_store_prefix=prefix, timeout=timedelta(seconds=5)
        )
        by_place = Mirrored(client, prefix, timedelta(seconds=5))
        try:
            assert by_name.add(key="n", num=2) == 2 and by_place.add("n", 3) == 5
            by_name.wait(keys=["n"], override_timeout=timedelta(seconds=1))
            with pytest.raises(DistStoreError):  # torch's stores' timeout error
                by_place.wait(["absent"], timedelta(milliseconds=200))
            # torch's default timeout (its constructor only keeps the client)
            assert Mirrored(client, prefix).timeout == Theirs(client, prefix).timeout
        finally:
            client.close()
    finally:
        server.stop()
