"""torch's health-check server API, as its docs describe it, served over real HTTP.

torch.distributed.elastic.agent.server.health_check_server documents
``HealthCheckServer(alive_callback: Callable[[], int], port: int, timeout: int)`` with
``start()`` and ``stop()``, and ``create_healthcheck_server(alive_callback, port, timeout)``
returning a ``HealthCheckServer``; ``alive_callback`` returns the time of the agent's last
progress (epoch seconds) and ``timeout`` is how long without progress means dead. torch's
open-source server only logs; ours answers ``GET /healthz``.
"""

from __future__ import annotations

import http.client
import inspect
import json
import socket
import time
from collections.abc import Iterator

import pytest

from elastic_run.agent.health import server as health
from elastic_run.agent.health.server import HealthCheckServer, create_healthcheck_server
from elastic_run.errors import ConfigurationError

pytestmark = pytest.mark.timeout(60)


def get(port: int, path: str = "/healthz") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class Progress:
    """An alive_callback: the epoch second of the last progress, settable by the test."""

    def __init__(self) -> None:
        self.at = int(time.time())
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return self.at


@pytest.fixture
def progress() -> Progress:
    return Progress()


@pytest.fixture
def server(progress: Progress) -> Iterator[HealthCheckServer]:
    srv = HealthCheckServer(progress, 0, 60)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_the_signature_is_torchs() -> None:
    # torch is pinned (constraints.txt) and has this module: its absence is a failure.
    from torch.distributed.elastic.agent.server import health_check_server as torch_module

    for name in ("HealthCheckServer", "create_healthcheck_server"):
        assert name in health.__all__
    ours = list(inspect.signature(HealthCheckServer).parameters)[:3]
    theirs = list(inspect.signature(torch_module.HealthCheckServer).parameters)
    assert ours == theirs == ["alive_callback", "port", "timeout"]
    factory = list(inspect.signature(create_healthcheck_server).parameters)
    assert factory == list(inspect.signature(torch_module.create_healthcheck_server).parameters)


def test_alive_callback_gives_back_the_callback_as_torchs(progress: Progress) -> None:
    from torch.distributed.elastic.agent.server import health_check_server as torch_module

    theirs = torch_module.HealthCheckServer(progress, 0, 60)
    ours = HealthCheckServer(progress, 0, 60)
    assert theirs.alive_callback is progress and ours.alive_callback is progress


def test_recent_progress_is_healthy(server: HealthCheckServer) -> None:
    status, body = get(server.port)
    assert status == 200
    assert json.loads(body) == {"status": "ok"}


def test_stale_progress_is_503_with_the_reason(
    server: HealthCheckServer, progress: Progress
) -> None:
    progress.at = int(time.time()) - 3600
    status, body = get(server.port)
    assert status == 503
    payload = json.loads(body)
    assert payload["status"] == "unhealthy"
    assert "no progress for" in payload["reason"] and "timeout 60 s" in payload["reason"]
    progress.at = int(time.time())  # progress again: healthy again
    assert get(server.port)[0] == 200


def test_status_and_metrics_show_the_last_progress(
    server: HealthCheckServer, progress: Progress
) -> None:
    status, body = get(server.port, "/status")
    assert status == 200
    assert json.loads(body) == {"last_progress": float(progress.at), "timeout_s": 60}
    status, body = get(server.port, "/metrics")
    assert status == 200
    assert "elastic_run_seconds_since_progress " in body.decode()


def test_a_failing_callback_is_500_and_the_server_goes_on(progress: Progress) -> None:
    def broken() -> int:
        raise RuntimeError("no clock")

    srv = HealthCheckServer(broken, 0, 60)
    srv.start()
    try:
        assert get(srv.port) == (500, b'{"error": "RuntimeError"}\n')
        assert get(srv.port) == (500, b'{"error": "RuntimeError"}\n')
    finally:
        srv.stop()


def test_stop_frees_the_port(progress: Progress) -> None:
    srv = HealthCheckServer(progress, 0, 60)
    srv.start()
    port = srv.port
    assert get(port)[0] == 200
    srv.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=10)
    again = HealthCheckServer(progress, port, 60)
    again.start()  # the same port binds again
    try:
        assert again.port == port
        assert get(port)[0] == 200
    finally:
        again.stop()
    srv.stop()  # a second stop is harmless


def test_create_healthcheck_server_returns_an_unstarted_server(progress: Progress) -> None:
    srv = create_healthcheck_server(progress, 0, 30)
    assert isinstance(srv, HealthCheckServer)
    assert progress.calls == 0  # creating it asks nothing of the agent
    srv.start()
    try:
        assert srv.port != 0
        assert get(srv.port)[0] == 200
    finally:
        srv.stop()


def test_bad_arguments_are_one_clear_error(progress: Progress) -> None:
    with pytest.raises(ConfigurationError, match="timeout must be positive"):
        HealthCheckServer(progress, 0, 0)
    with pytest.raises(ConfigurationError, match="70000"):
        HealthCheckServer(progress, 70000, 60).start()


def test_a_taken_port_is_a_configuration_error(
    server: HealthCheckServer, progress: Progress
) -> None:
    clash = HealthCheckServer(progress, server.port, 60)
    with pytest.raises(ConfigurationError, match="already in use"):
        clash.start()
