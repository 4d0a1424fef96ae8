"""The agent's health-check server over real HTTP on a free port; liveness on a fake clock.

Also the attack that once took an agent down: 300 slow clients against the server.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from elastic_run.agent.health.server import AgentHealthServer, Liveness, render_metrics
from elastic_run.errors import ConfigurationError
from tests.helpers import wait_until


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
def server(liveness: Liveness) -> Iterator[AgentHealthServer]:
    srv = AgentHealthServer(
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
    server: AgentHealthServer, liveness: Liveness, clock: FakeClock
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


def test_status_is_served_as_json(server: AgentHealthServer) -> None:
    status, _, body = request(server.port, "/status")
    assert status == 200
    assert json.loads(body) == {"state": "HEALTHY", "restarts": 0, "workers": [0, 1]}


def test_metrics_are_prometheus_text(server: AgentHealthServer) -> None:
    status, headers, body = request(server.port, "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert body.decode().splitlines() == [
        "# HELP elastic_run_restarts elastic_run_restarts",
        "# TYPE elastic_run_restarts gauge",
        "elastic_run_restarts 2.0",
        "# HELP elastic_run_round_time_s elastic_run_round_time_s",
        "# TYPE elastic_run_round_time_s gauge",
        "elastic_run_round_time_s 1.5",
        "# HELP elastic_run_workers_running elastic_run_workers_running",
        "# TYPE elastic_run_workers_running gauge",
        "elastic_run_workers_running 4.0",
    ]


def test_a_metrics_text_callback_wins_and_is_served_as_is(liveness: Liveness) -> None:
    srv = AgentHealthServer(
        "127.0.0.1",
        0,
        status_fn=dict,
        liveness_fn=liveness.check,
        metrics_fn=lambda: {"ignored": 1.0},
        metrics_text_fn=lambda: b"# TYPE x counter\nx_total 3.0\n",
    )
    srv.start()
    try:
        status, headers, body = request(srv.port, "/metrics")
    finally:
        srv.stop()
    assert status == 200 and body == b"# TYPE x counter\nx_total 3.0\n"
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"


def test_render_metrics_special_values() -> None:
    assert render_metrics({}) == ""
    text = render_metrics({"a": float("nan"), "b": float("inf"), "c": -float("inf")})
    assert "elastic_run_a NaN" in text
    assert "elastic_run_b +Inf" in text
    assert "elastic_run_c -Inf" in text


def test_unknown_path_is_404(server: AgentHealthServer) -> None:
    status, _, _ = request(server.port, "/nope")
    assert status == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "HEAD", "BREW"])
def test_other_methods_are_refused(server: AgentHealthServer, method: str) -> None:
    status, headers, _ = request(server.port, "/healthz", method=method)
    assert status == 405
    assert headers["Allow"] == "GET"


@pytest.mark.parametrize(
    "raw", [b"GARBAGE\r\n\r\n", b"GET /healthz HTTP/9.x\r\n\r\n", b"GET\r\n\r\n"]
)
def test_malformed_requests_are_400(server: AgentHealthServer, raw: bytes) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(raw)
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.0 400") or reply.startswith(b"HTTP/1.1 400"), reply[:80]


def test_failing_callback_is_500(liveness: Liveness) -> None:
    def broken() -> dict[str, object]:
        raise RuntimeError("status unavailable")

    srv = AgentHealthServer("127.0.0.1", 0, status_fn=broken, liveness_fn=liveness.check)
    srv.start()
    try:
        status, _, body = request(srv.port, "/status")
        assert status == 500
        assert json.loads(body) == {"error": "RuntimeError"}
        assert request(srv.port, "/metrics")[2] == b""
    finally:
        srv.stop()


def test_port_in_use_is_a_configuration_error(
    server: AgentHealthServer, liveness: Liveness
) -> None:
    clash = AgentHealthServer("127.0.0.1", server.port, status_fn=dict, liveness_fn=liveness.check)
    with pytest.raises(ConfigurationError, match=f"port {server.port} .* already in use"):
        clash.start()


def test_slow_client_does_not_block_the_others(server: AgentHealthServer) -> None:
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
    srv = AgentHealthServer("127.0.0.1", 0, status_fn=dict, liveness_fn=liveness.check)
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


def test_a_port_outside_the_range_is_a_configuration_error(liveness: Liveness) -> None:
    srv = AgentHealthServer("127.0.0.1", 70000, status_fn=dict, liveness_fn=liveness.check)
    with pytest.raises(ConfigurationError, match="70000"):
        srv.start()


def _is_cut(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (EOF or reset), without waiting (non-blocking)."""
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def _threads_of_this_process() -> int:
    return len(os.listdir("/proc/self/task"))


def test_300_slow_clients_add_no_thread_and_a_prober_still_gets_in(
    server: AgentHealthServer,
) -> None:
    # The attack that took an agent from 11 to 312 threads and past its descriptor limit:
    # clients that connect and send nothing, or one byte and then (for a long while) nothing.
    threads, tasks = threading.active_count(), _threads_of_this_process()
    slow: list[socket.socket] = []
    try:
        for i in range(300):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            if i % 2:
                sock.sendall(b"G")
            sock.setblocking(False)
            slow.append(sock)
        # The server took every connection, and closed all but the newest it may hold.
        wait_until(
            lambda: sum(map(_is_cut, slow)) >= 300 - 64,
            30,
            message=lambda: f"only {sum(map(_is_cut, slow))} of 300 slow clients were cut",
        )
        assert threading.active_count() <= threads
        assert _threads_of_this_process() <= tasks
        status, _, body = request(server.port, "/healthz")
        assert (status, json.loads(body)["status"]) == (200, "ok")
        assert threading.active_count() <= threads
    finally:
        for sock in slow:
            sock.close()
