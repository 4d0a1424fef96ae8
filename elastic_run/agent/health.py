"""The health-check server: HTTP answers on whether the agent is alive, its status and metrics.

Routes (GET only; other methods get 405, malformed requests 400, unknown paths 404):

- ``/healthz``: 200 ``{"status": "ok", ...}`` while ``liveness_fn()`` says ok, else 503
  ``{"status": "unhealthy", "reason": ...}``.
- ``/status``: ``status_fn()`` as JSON.
- ``/metrics``: ``metrics_fn()`` in the Prometheus text format, each name as
  ``elastic_run_<name>``.

Invariants: the server runs on its own threads (one per request, daemon, with a socket timeout),
so a slow or stalled client never delays another one, and the agent's loop never waits on it;
the callbacks it calls must be cheap and thread-safe (read a snapshot). :class:`Liveness` is the
pure part: named progress timestamps judged against a timeout on an injectable clock.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from elastic_run.errors import AgentError, ConfigurationError

__all__ = ["HealthCheckServer", "Liveness", "render_metrics"]

logger = logging.getLogger(__name__)

_METRIC_PREFIX = "elastic_run_"
_INVALID_METRIC_CHARS = re.compile(r"[^a-zA-Z0-9_:]")
_REQUEST_SOCKET_TIMEOUT_S = 5.0
_SERVE_POLL_S = 0.1


class Liveness:
    """Named progress timestamps, judged against a timeout.

    Each source (for example ``"agent_loop"`` or ``"watchdog"``) either reports progress with
    :meth:`progress`, or is pulled with :meth:`watch` from a function that returns the time of
    its last progress on the same clock. The whole is alive while every source progressed within
    ``timeout_s``. Thread-safe.

    Args:
        timeout_s: the longest a source may go without progress.
        clock: the monotonic clock the timestamps are on (inject a fake one in tests).

    Raises:
        ConfigurationError: ``timeout_s`` is not positive.
    """

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not timeout_s > 0:
            raise ConfigurationError(f"liveness timeout must be positive, got {timeout_s}")
        self._timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._watched: dict[str, Callable[[], float]] = {}

    @property
    def timeout_s(self) -> float:
        """The longest a source may go without progress."""
        return self._timeout_s

    def progress(self, name: str, at: float | None = None) -> None:
        """Record that source ``name`` made progress.

        Args:
            name: the source.
            at: when, on the clock; by default now.
        """
        when = self._clock() if at is None else at
        with self._lock:
            self._last[name] = when

    def watch(self, name: str, last_progress: Callable[[], float]) -> None:
        """Pull source ``name``'s last progress time from ``last_progress`` at each check.

        Args:
            name: the source.
            last_progress: returns the time of the source's last progress, on the clock.
        """
        with self._lock:
            self._watched[name] = last_progress

    def last_progress(self) -> dict[str, float]:
        """Return each source's last progress time."""
        with self._lock:
            last = dict(self._last)
            watched = dict(self._watched)
        for name, fn in watched.items():
            last[name] = fn()
        return last

    def check(self) -> tuple[bool, str]:
        """Judge whether every source progressed within the timeout.

        Returns:
            ``(True, "")`` when alive, else ``(False, reason)`` naming each stalled source and
            how long ago it last progressed.
        """
        now = self._clock()
        stalled = [
            f"{name} made no progress for {now - when:.1f} s (timeout {self._timeout_s:g} s)"
            for name, when in sorted(self.last_progress().items())
            if now - when > self._timeout_s
        ]
        if stalled:
            return False, "; ".join(stalled)
        return True, ""

    __call__ = check


def render_metrics(metrics: Mapping[str, float]) -> str:
    """Render metrics in the Prometheus text exposition format (all as gauges).

    Args:
        metrics: metric names (without the ``elastic_run_`` prefix) to values.

    Returns:
        The text, one ``# TYPE`` line and one sample line per metric.
    """
    lines: list[str] = []
    for raw_name, value in sorted(metrics.items()):
        name = _METRIC_PREFIX + _INVALID_METRIC_CHARS.sub("_", raw_name)
        number = float(value)
        if math.isnan(number):
            text = "NaN"
        elif math.isinf(number):
            text = "+Inf" if number > 0 else "-Inf"
        else:
            text = repr(int(number)) if number.is_integer() else repr(number)
        lines.append(f"# TYPE {name} gauge")
        lines.append(f"{name} {text}")
    return "\n".join(lines) + "\n" if lines else ""


def _json_bytes(body: object) -> bytes:
    return (json.dumps(body, default=str) + "\n").encode("utf-8")


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = _REQUEST_SOCKET_TIMEOUT_S
    protocol_version = "HTTP/1.0"
    # Error replies to requests without a version still carry a status line and headers.
    default_request_version = "HTTP/1.0"
    server_version = "elastic-run-health"

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's naming)
        path = self.path.split("?", 1)[0]
        try:
            status, data, content_type = self._route(path)
        except Exception as exc:
            logger.exception("health server: %s failed", path)
            status, data = (
                HTTPStatus.INTERNAL_SERVER_ERROR,
                _json_bytes({"error": type(exc).__name__}),
            )
            content_type = "application/json"
        self._send(status, data, content_type)

    def _route(self, path: str) -> tuple[HTTPStatus, bytes, str]:
        owner = self.server.owner
        if path == "/healthz":
            ok, reason = owner.liveness_fn()
            if ok:
                return HTTPStatus.OK, _json_bytes({"status": "ok"}), "application/json"
            unhealthy = {"status": "unhealthy", "reason": reason}
            return HTTPStatus.SERVICE_UNAVAILABLE, _json_bytes(unhealthy), "application/json"
        if path == "/status":
            return HTTPStatus.OK, _json_bytes(owner.status_fn()), "application/json"
        if path == "/metrics":
            metrics = owner.metrics_fn() if owner.metrics_fn is not None else {}
            text = render_metrics(metrics).encode("utf-8")
            return HTTPStatus.OK, text, "text/plain; version=0.0.4; charset=utf-8"
        return (
            HTTPStatus.NOT_FOUND,
            _json_bytes({"error": f"no such path: {path}"}),
            "application/json",
        )

    def __getattr__(self, name: str) -> Callable[[], None]:
        # BaseHTTPRequestHandler dispatches to do_<METHOD>; every method but GET is refused.
        if name.startswith("do_"):
            return self._method_not_allowed
        raise AttributeError(name)

    def _method_not_allowed(self) -> None:
        self._send(
            HTTPStatus.METHOD_NOT_ALLOWED,
            _json_bytes({"error": f"method {self.command} not allowed"}),
            "application/json",
            extra_headers={"Allow": "GET"},
        )

    def _send(
        self,
        status: HTTPStatus,
        data: bytes,
        content_type: str,
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for key, value in (extra_headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib name)
        logger.debug("health server %s: " + format, self.address_string(), *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # socketserver's default backlog of 5 drops the SYNs of a burst of probes and scrapers;
    # a dropped SYN is retried after 1, 3, 7 s, which reads as a dead agent.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], owner: HealthCheckServer) -> None:
        self.owner = owner
        super().__init__(address, _Handler)

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that hangs up or times out is routine; anything else is a bug worth a trace.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            logger.debug("health server: client %s: %s", client_address, exc)
        else:
            logger.exception("health server: error serving %s", client_address)


class HealthCheckServer:
    """Serve the agent's health, status and metrics over HTTP on its own threads.

    Args:
        addr: the address to bind (``127.0.0.1`` unless it must be reachable from elsewhere).
        port: the port; 0 picks a free one (see :attr:`port` after :meth:`start`).
        status_fn: returns the agent's status as a JSON-serializable dict.
        liveness_fn: returns ``(ok, reason)``; typically a :class:`Liveness`'s ``check``.
        metrics_fn: returns metric values by name; None serves an empty ``/metrics``.
    """

    def __init__(
        self,
        addr: str,
        port: int,
        *,
        status_fn: Callable[[], dict[str, object]],
        liveness_fn: Callable[[], tuple[bool, str]],
        metrics_fn: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self._addr = addr
        self._port = port
        self.status_fn = status_fn
        self.liveness_fn = liveness_fn
        self.metrics_fn = metrics_fn
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port once started (the requested one before)."""
        return self._port

    @property
    def addr(self) -> str:
        """The bound address."""
        return self._addr

    def start(self) -> None:
        """Bind and start serving on a daemon thread.

        Raises:
            ConfigurationError: the address cannot be bound (the port is taken, for example).
            AgentError: the server was already started.
        """
        if self._server is not None:
            raise AgentError("health-check server is already started")
        try:
            server = _Server((self._addr, self._port), self)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigurationError(
                    f"health-check port {self._port} on {self._addr} is already in use; "
                    f"pick another (TORCHELASTIC_HEALTH_CHECK_PORT) or 0 for a free one"
                ) from exc
            raise ConfigurationError(
                f"cannot bind the health-check server to {self._addr}:{self._port}: "
                f"{exc.strerror or exc}"
            ) from exc
        self._server = server
        self._port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": _SERVE_POLL_S},
            name=f"health-check:{self._port}",
            daemon=True,
        )
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and close the socket; requests in flight finish on their own threads.

        Args:
            timeout_s: the longest to wait for the serving thread to end.

        Raises:
            AgentError: the serving thread did not end within ``timeout_s``.
        """
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.shutdown()
        thread.join(timeout_s)
        server.server_close()
        self._server = None
        self._thread = None
        if thread.is_alive():
            raise AgentError(f"health-check server thread did not stop in {timeout_s} s")
