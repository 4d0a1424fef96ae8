"""The health-check server over real HTTP on a free port; liveness judged on a fake clock."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from elastic_run.agent.health import HealthCheckServer, Liveness, render_metrics
from elastic_run.errors import ConfigurationError


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` until it holds; raise AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def liveness(clock: FakeClock) -> Liveness:
    live = Liveness(timeout_s=60, clock=clock)
    live.progress("agent_loop")
    return live


@pytest.fixture
def server(liveness: Liveness) -> Iterator[HealthCheckServer]:
    srv = HealthCheckServer(
        "127.0.0.1",
        0,
        status_fn=lambda: {"state": "HEALTHY", "restarts": 0, "workers": [0, 1]},
        liveness_fn=liveness.check,
        metrics_fn=lambda: {"restarts": 2, "workers_running": 4.0, "round time_s": 1.5},
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def request(
    port: int, path: str, method: str = "GET", timeout_s: float = 10
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_healthz_flips_with_the_fake_clock(
    server: HealthCheckServer, liveness: Liveness, clock: FakeClock
) -> None:
    status, headers, body = request(server.port, "/healthz")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body)["status"] == "ok"

    clock.now += 61  # the agent loop stalls past the timeout
    status, _, body = request(server.port, "/healthz")
    assert status == 503
    payload = json.loads(body)
    assert payload["status"] == "unhealthy"
    assert "agent_loop" in payload["reason"]

    liveness.progress("agent_loop")
    status, _, body = request(server.port, "/healthz")
    assert status == 200


def test_watched_source_stalls(clock: FakeClock) -> None:
    watchdog_progress = clock.now
    live = Liveness(timeout_s=5, clock=clock)
    live.progress("agent_loop")
    live.watch("watchdog", lambda: watchdog_progress)
    assert live.check() == (True, "")
    clock.now += 6
    live.progress("agent_loop")
    ok, reason = live.check()
    assert not ok
    assert reason.startswith("watchdog made no progress for 6.0 s")


def test_liveness_rejects_a_bad_timeout() -> None:
    with pytest.raises(ConfigurationError):
        Liveness(timeout_s=0)


def test_status_is_served_as_json(server: HealthCheckServer) -> None:
    status, _, body = request(server.port, "/status")
    assert status == 200
    assert json.loads(body) == {"state": "HEALTHY", "restarts": 0, "workers": [0, 1]}


def test_metrics_are_prometheus_text(server: HealthCheckServer) -> None:
    status, headers, body = request(server.port, "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert body.decode().splitlines() == [
        "# TYPE elastic_run_restarts gauge",
        "elastic_run_restarts 2",
        "# TYPE elastic_run_round_time_s gauge",
        "elastic_run_round_time_s 1.5",
        "# TYPE elastic_run_workers_running gauge",
        "elastic_run_workers_running 4",
    ]


def test_render_metrics_special_values() -> None:
    assert render_metrics({}) == ""
    text = render_metrics({"a": float("nan"), "b": float("inf"), "c": -float("inf")})
    assert "elastic_run_a NaN" in text
    assert "elastic_run_b +Inf" in text
    assert "elastic_run_c -Inf" in text


def test_unknown_path_is_404(server: HealthCheckServer) -> None:
    status, _, _ = request(server.port, "/nope")
    assert status == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "HEAD", "BREW"])
def test_other_methods_are_refused(server: HealthCheckServer, method: str) -> None:
    status, headers, _ = request(server.port, "/healthz", method=method)
    assert status == 405
    assert headers["Allow"] == "GET"


@pytest.mark.parametrize(
    "raw", [b"GARBAGE\r\n\r\n", b"GET /healthz HTTP/9.x\r\n\r\n", b"GET\r\n\r\n"]
)
def test_malformed_requests_are_400(server: HealthCheckServer, raw: bytes) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(raw)
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.0 400") or reply.startswith(b"HTTP/1.1 400"), reply[:80]


def test_failing_callback_is_500(liveness: Liveness) -> None:
    def broken() -> dict[str, object]:
        raise RuntimeError("status unavailable")

    srv = HealthCheckServer("127.0.0.1", 0, status_fn=broken, liveness_fn=liveness.check)
    srv.start()
    try:
        status, _, body = request(srv.port, "/status")
        assert status == 500
        assert json.loads(body) == {"error": "RuntimeError"}
        assert request(srv.port, "/metrics")[2] == b""
    finally:
        srv.stop()


def test_port_in_use_is_a_configuration_error(
    server: HealthCheckServer, liveness: Liveness
) -> None:
    clash = HealthCheckServer("127.0.0.1", server.port, status_fn=dict, liveness_fn=liveness.check)
    with pytest.raises(ConfigurationError, match=f"port {server.port} .* already in use"):
        clash.start()


def test_slow_client_does_not_block_the_others(server: HealthCheckServer) -> None:
    slow = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: loc")  # half a request, then silence
        barrier = threading.Barrier(50)

        def client(_: int) -> int:
            barrier.wait()
            return request(server.port, "/healthz")[0]

        with ThreadPoolExecutor(max_workers=50) as pool:
            statuses = list(pool.map(client, range(50)))
        assert statuses == [200] * 50
    finally:
        slow.close()


def test_stop_returns_with_a_stalled_client_connected(liveness: Liveness) -> None:
    srv = HealthCheckServer("127.0.0.1", 0, status_fn=dict, liveness_fn=liveness.check)
    srv.start()
    port = srv.port
    stalled = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        stalled.sendall(b"GET /st")
        assert request(port, "/healthz")[0] == 200
        srv.stop()
        with pytest.raises(OSError):
            request(port, "/healthz", timeout_s=2)
    finally:
        stalled.close()
