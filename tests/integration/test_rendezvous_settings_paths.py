"""The settings' and the seam's promises on real stores: ``from_backend`` refuses what the CLI
refuses and takes its defaults, the static rendezvous fails as torch's does when its master is
unreachable, and ``member_states`` answers through the backend seam (a real TCPStore, a real
etcd)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from etcd_fixtures import etcd_server_fixture, requires_etcd  # noqa: F401 - fixtures
from torch.distributed import TCPStore

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.c10d.backend import C10dRendezvousBackend
from elastic_run.rendezvous.dynamic.handler import DynamicRendezvousHandler, create_handler
from elastic_run.rendezvous.errors import RendezvousConnectionError
from elastic_run.rendezvous.etcd.server import EtcdServer
from elastic_run.rendezvous.registry import create_backend
from elastic_run.rendezvous.static import StaticRendezvousHandler
from tests.helpers import free_port

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def store() -> Iterator[TCPStore]:
    yield TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _job() -> str:
    return f"settings-{uuid.uuid4().hex[:8]}"


def _from_backend(store: TCPStore, **kwargs: Any) -> DynamicRendezvousHandler:
    job = _job()
    args: dict[str, Any] = {"min_nodes": 1, "max_nodes": 2, **kwargs}
    return DynamicRendezvousHandler.from_backend(
        job, store, C10dRendezvousBackend(store, job), **args
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"keep_alive_max_attempt": 2.5},  # was a 2.5-interval budget
        {"keep_alive_max_attempt": True},  # was one attempt
        {"keep_alive_max_attempt": "5"},
        {"keep_alive_interval": True},
        {"keep_alive_interval": 0},
        {"min_nodes": 3, "max_nodes": 1},  # was accepted: torch raises ValueError
        {"min_nodes": 0, "max_nodes": 1},  # was accepted: torch raises ValueError
    ],
)
def test_from_backend_refuses_what_the_cli_refuses(store: TCPStore, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _from_backend(store, **kwargs)
    assert isinstance(caught.value, ValueError)
    if isinstance(kwargs.get("keep_alive_max_attempt", 1), str):
        assert isinstance(caught.value, TypeError)  # as before, and as torch for a str


def test_from_backend_and_create_handler_take_the_same_defaults(store: TCPStore) -> None:
    job = _job()
    built = DynamicRendezvousHandler.from_backend(
        job, store, C10dRendezvousBackend(store, job), 1, 2
    )
    params = RendezvousParameters("c10d", "", job, 1, 2)
    created = create_handler(store, C10dRendezvousBackend(store, job), params)
    try:
        assert built.settings == created.settings
    finally:
        built.shutdown()
        created.shutdown()


def test_an_unreachable_static_master_is_our_connection_error_and_torchs_runtime_error() -> None:
    port = free_port()  # nothing listens there
    handler = StaticRendezvousHandler("static-job", "127.0.0.1", port, 1, 2, timeout_s=1.0)
    with pytest.raises(RendezvousConnectionError) as caught:
        handler.next_rendezvous()
    assert isinstance(caught.value, RuntimeError)  # torch's raises DistNetworkError here
    assert f"cannot reach the static rendezvous store at 127.0.0.1:{port}" in str(caught.value)
    assert caught.value.exit_code == 4


def test_a_c10d_store_has_no_members_to_show(store: TCPStore) -> None:
    params = RendezvousParameters("c10d", f"127.0.0.1:{store.port}", _job(), 1, 1)
    backend = create_backend(params, allow_hosting=False)
    try:
        assert backend.member_states() is None
    finally:
        backend.close()


@pytest.mark.etcd
@requires_etcd
def test_an_embedded_cluster_shows_each_members_state_through_the_seam(
    etcd_server: EtcdServer,
) -> None:
    ports: set[int] = set()
    while len(ports) < 2:
        ports.add(free_port())
    refused = [f"127.0.0.1:{port}" for port in sorted(ports)]  # listed members that refuse
    params = RendezvousParameters(
        "embedded-etcd", ",".join([etcd_server.endpoint, *refused]), _job(), 1, 1
    )
    backend = create_backend(params, allow_hosting=False)
    try:
        assert backend.member_states() == {
            etcd_server.endpoint: "up",
            refused[0]: "down",
            refused[1]: "down",
        }
    finally:
        backend.close()
