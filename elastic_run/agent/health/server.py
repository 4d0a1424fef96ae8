"""The health-check server: HTTP answers on whether the agent is alive, its status and metrics.

Routes (GET only; other methods get 405, malformed requests 400, unknown paths 404):

- ``/healthz``: 200 ``{"status": "ok", ...}`` while ``liveness_fn()`` says ok, else 503
  ``{"status": "unhealthy", "reason": ...}``.
- ``/status``: ``status_fn()`` as JSON.
- ``/metrics``: the Prometheus text exposition (format 0.0.4), written by prometheus-client:
  ``metrics_text_fn()`` (the agent's :class:`~elastic_run.agent.health.metrics.AgentMetrics`:
  counters, gauges and histograms with HELP lines), else ``metrics_fn()``'s values as gauges,
  each name as ``elastic_run_<name>``.

Two front doors to one server:

- :class:`AgentHealthServer` ``(addr, port, *, status_fn, liveness_fn, metrics_fn)``: the
  agent's, fed by a :class:`Liveness` (the pure part: named progress timestamps judged against a
  timeout on an injectable clock) and the agent's snapshot.
- :class:`HealthCheckServer` ``(alive_callback, port, timeout)`` and
  :func:`create_healthcheck_server`: torch's documented API
  (``torch.distributed.elastic.agent.server.health_check_server``). torch's open-source one only
  logs; this one serves the routes above, alive while ``time.time() - alive_callback() <
  timeout`` (the callback returns the epoch seconds of the last progress, as in torch).

Invariants: requests are served by :class:`~elastic_run.agent.health.bounded_http.BoundedHTTPServer`
(one selector thread, a pool of 4 workers, at most 64 connections, a 5 s deadline to send a
request, descriptors reserved for the agent), so no client, slow or many, can add threads, take
the agent's file descriptors or stop the server; the agent's loop never waits on it. The
callbacks run on the pool's threads and must be cheap and thread-safe (read a snapshot).
"""

from __future__ import annotations

import errno
import io
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.core import Metric

from elastic_run.agent.health.bounded_http import BoundedHTTPServer
from elastic_run.errors import ConfigurationError

__all__ = [
    "AgentHealthServer",
    "HealthCheckServer",
    "Liveness",
    "METRICS_CONTENT_TYPE",
    "create_healthcheck_server",
    "render_metrics",
]

logger = logging.getLogger(__name__)

_METRIC_PREFIX = "elastic_run_"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""What ``/metrics`` answers in: the text format prometheus-client's ``generate_latest`` writes."""
_INVALID_METRIC_CHARS = re.compile(r"[^a-zA-Z0-9_:]")


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


class _GaugesCollector:
    """``metrics`` (a name, maybe with a label set, to a value) as gauge families (a
    prometheus-client collector)."""

    def __init__(self, metrics: Mapping[str, float]) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily
        from prometheus_client.parser import parse_labels

        families: dict[str, tuple[GaugeMetricFamily, list[str]]] = {}
        for raw_name, value in sorted(self._metrics.items()):
            # A name may carry labels, as in 'step_time_seconds{rank="3"}': one family, whose
            # label names are its first sample's.
            base, brace, rest = raw_name.partition("{")
            name = _METRIC_PREFIX + _INVALID_METRIC_CHARS.sub("_", base)
            labels = parse_labels(rest.rstrip("}")) if brace else {}
            if name not in families:
                families[name] = (GaugeMetricFamily(name, name, labels=list(labels)), list(labels))
            family, names = families[name]
            family.add_metric([labels.get(k, "") for k in names], float(value))
        yield from (family for family, _ in families.values())


def render_metrics(metrics: Mapping[str, float]) -> str:
    """Render metrics in the Prometheus text exposition format (all as gauges).

    Args:
        metrics: metric names (without the ``elastic_run_`` prefix) to values; a name may end
            in a label set written by the caller (``step_time_seconds{rank="3"}``).

    Returns:
        The text (prometheus-client's): per metric family its ``# HELP`` and ``# TYPE`` lines,
        then its samples.
    """
    # Imported here: prometheus-client's import copies the whole environment (wsgiref's
    # handlers), which an agent forked from a template must not carry from its template.
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_GaugesCollector(metrics))
    return generate_latest(registry).decode("utf-8")


def _json_bytes(body: object) -> bytes:
    return (json.dumps(body, default=str) + "\n").encode("utf-8")


class _Handler(BaseHTTPRequestHandler):
    """Parse one request that was already read, and build the reply in memory.

    Not socketserver's life cycle: the bounded server reads the request and sends the reply, so
    this handler never touches the socket; ``http.server`` still parses, validates and formats.
    """

    protocol_version = "HTTP/1.0"
    # Error replies to requests without a version still carry a status line and headers.
    default_request_version = "HTTP/1.0"
    server_version = "elastic-run-health"

    def __init__(self, request: bytes, client: tuple[str, int], owner: AgentHealthServer) -> None:
        self.client_address = client
        self.owner = owner
        self.rfile = io.BytesIO(request)
        self.wfile = io.BytesIO()
        self.handle()

    def reply(self) -> bytes:
        """The reply's bytes."""
        assert isinstance(self.wfile, io.BytesIO)
        return self.wfile.getvalue()

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
        owner = self.owner
        if path == "/healthz":
            ok, reason = owner.liveness_fn()
            if ok:
                return HTTPStatus.OK, _json_bytes({"status": "ok"}), "application/json"
            unhealthy = {"status": "unhealthy", "reason": reason}
            return HTTPStatus.SERVICE_UNAVAILABLE, _json_bytes(unhealthy), "application/json"
        if path == "/status":
            return HTTPStatus.OK, _json_bytes(owner.status_fn()), "application/json"
        if path == "/metrics":
            if owner.metrics_text_fn is not None:
                text = owner.metrics_text_fn()
            else:
                metrics = owner.metrics_fn() if owner.metrics_fn is not None else {}
                text = render_metrics(metrics).encode("utf-8")
            return HTTPStatus.OK, text, METRICS_CONTENT_TYPE
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


class AgentHealthServer(BoundedHTTPServer):
    """Serve the agent's health, status and metrics over HTTP on a bounded set of threads.

    Args:
        addr: the address to bind (``127.0.0.1`` unless it must be reachable from elsewhere).
        port: the port; 0 picks a free one (see :attr:`port` after :meth:`start`).
        status_fn: returns the agent's status as a JSON-serializable dict.
        liveness_fn: returns ``(ok, reason)``; typically a :class:`Liveness`'s ``check``.
        metrics_fn: returns metric values by name, served as gauges; None (and no
            ``metrics_text_fn``) serves an empty ``/metrics``.
        metrics_text_fn: returns the whole ``/metrics`` text (wins over ``metrics_fn``): the
            agent's ``AgentMetrics.render``, which reads only the published snapshot.
    """

    def __init__(
        self,
        addr: str,
        port: int,
        *,
        status_fn: Callable[[], dict[str, object]],
        liveness_fn: Callable[[], tuple[bool, str]],
        metrics_fn: Callable[[], Mapping[str, float]] | None = None,
        metrics_text_fn: Callable[[], bytes] | None = None,
    ) -> None:
        super().__init__(addr, port, self._reply, name="health-check")
        self.status_fn = status_fn
        self.liveness_fn = liveness_fn
        self.metrics_fn = metrics_fn
        self.metrics_text_fn = metrics_text_fn

    def start(self) -> None:
        """Bind and start serving on the server's own threads.

        Raises:
            ConfigurationError: the address cannot be bound (the port is taken, for example).
            AgentError: the server was already started.
        """
        try:
            super().start()
        except OverflowError as exc:  # socket's word for a port outside 0-65535
            raise ConfigurationError(
                f"cannot bind the health-check server to {self.addr}:{self.port}: {exc}"
            ) from exc
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigurationError(
                    f"health-check port {self.port} on {self.addr} is already in use; "
                    f"pick another (TORCHELASTIC_HEALTH_CHECK_PORT) or 0 for a free one"
                ) from exc
            raise ConfigurationError(
                f"cannot bind the health-check server to {self.addr}:{self.port}: "
                f"{exc.strerror or exc}"
            ) from exc

    def _reply(self, request: bytes, client: tuple[str, int]) -> bytes:
        return _Handler(request, client, self).reply()


class HealthCheckServer(AgentHealthServer):
    """torch's health-check server API, serving ``/healthz`` (and the other routes) over HTTP.

    ``GET /healthz`` answers 200 while ``clock() - alive_callback() < timeout``, else 503 with
    the reason; ``/status`` shows the last progress; ``/metrics`` the seconds since it.

    Args:
        alive_callback: returns the epoch seconds (``time.time()``) of the agent's last
            progress, as in torch.
        port: the port; 0 picks a free one (see :attr:`port` after :meth:`start`).
        timeout: seconds without progress after which the agent is reported dead.
        addr: (ours) the address to bind; 127.0.0.1 unless it must be reachable from elsewhere.
        clock: (ours) the epoch clock ``alive_callback``'s times are on.

    Raises:
        ConfigurationError: ``timeout`` is not positive.
        TypeError: ``alive_callback`` is not callable.
    """

    def __init__(
        self,
        alive_callback: Callable[[], float],
        port: int,
        timeout: float,
        *,
        addr: str = "127.0.0.1",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not callable(alive_callback):
            raise TypeError("HealthCheckServer(alive_callback, port, timeout): not callable")
        if not timeout > 0:
            raise ConfigurationError(f"health-check timeout must be positive, got {timeout}")
        self._alive_callback = alive_callback
        self._timeout = timeout
        self._clock = clock
        super().__init__(
            addr, port, status_fn=self._status, liveness_fn=self.check, metrics_fn=self._metrics
        )

    @property
    def alive_callback(self) -> Callable[[], float]:
        """The callback given: the epoch time of the agent's last progress (torch's property)."""
        return self._alive_callback

    def check(self) -> tuple[bool, str]:
        """Judge the agent alive: progress within ``timeout`` seconds.

        Returns:
            ``(True, "")`` when alive, else ``(False, reason)``.
        """
        age = self._clock() - float(self._alive_callback())
        if age < self._timeout:
            return True, ""
        return False, f"the agent made no progress for {age:.1f} s (timeout {self._timeout:g} s)"

    def _status(self) -> dict[str, object]:
        return {"last_progress": float(self._alive_callback()), "timeout_s": self._timeout}

    def _metrics(self) -> dict[str, float]:
        return {"seconds_since_progress": self._clock() - float(self._alive_callback())}


def create_healthcheck_server(
    alive_callback: Callable[[], float], port: int, timeout: float
) -> HealthCheckServer:
    """Create torch's health-check server (not started; call its ``start()``).

    Args:
        alive_callback: returns the epoch seconds of the agent's last progress.
        port: the port; 0 picks a free one.
        timeout: seconds without progress after which the agent is reported dead.

    Returns:
        The server.

    Raises:
        ConfigurationError: ``timeout`` is not positive.
    """
    return HealthCheckServer(alive_callback, port, timeout)
