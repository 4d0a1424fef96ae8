"""An HTTP/1.0 server that no client can take down: bounded threads, connections and descriptors.

One request per connection (HTTP/1.0, the connection closes after the reply). Clients are
strangers: a prober, a scraper, or an attacker who connects and sends one byte a second.

Design: one selector thread accepts connections and reads requests without blocking; a fixed
pool of ``workers`` threads turns each complete request into a reply (``respond``, the caller's
code) and sends it. The selector thread never runs the caller's code, so a slow callback never
stops the accepting and the deadlines; the pool never reads from a client, so a slow client
never holds a thread. Threads: always ``1 + workers``, whatever the load. (A thread per
connection, as ``ThreadingHTTPServer`` does, let 300 slow clients take an agent from 11 to 312
threads and past its descriptor limit; a pure selector loop would run the callbacks on the one
thread that must keep accepting.)

Invariants:

- At most ``max_connections`` (64) connections are open at once, counting those being read,
  those waiting for a worker and those being answered. When a new one arrives at the cap, the
  oldest connection still sending its request is closed to make room: under a flood of slow
  clients, a well-behaved client that sends its request at once still gets in. When every open
  connection is already being answered, the new one gets a canned ``503`` and is closed, on the
  selector thread. The cap is 64, not less, so that a burst of probes and scrapers that connect
  at the same moment (before any of them sent its request) is served whole rather than
  evicting itself; a connection being read costs a descriptor and a few bytes, no thread.
- A request must arrive whole (through its blank line, at most ``max_request_bytes``) within
  ``read_deadline_s`` of the connect, else the connection is closed without a reply; a reply
  must be sent within ``write_deadline_s``, else the connection is closed.
- Descriptors are reserved for the process's own work: when fewer than ``reserved_descriptors``
  are free (counted once per accept burst, and again before a refusal: a burst may outlast the
  pressure), new connections get the canned ``503`` and are closed at once.
- ``accept()`` errors never end the server (see :mod:`elastic_run.descriptors`): an error of
  one pending connection is skipped; running out of descriptors or memory pauses accepting
  (briefly, doubling up to a second) and is logged once per episode.
- Nothing is raised into the selector thread's loop that could end it while the server runs:
  an unexpected error is logged once per episode and the loop goes on after a short pause.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from elastic_run.descriptors import (
    RESERVED_DESCRIPTORS,
    AcceptPause,
    accept_some,
    free_descriptors,
)
from elastic_run.errors import AgentError

__all__ = ["BoundedHTTPServer", "Respond"]

logger = logging.getLogger(__name__)

Respond = Callable[[bytes, tuple[str, int]], bytes]
"""Turns a request (its bytes through the blank line, and the client's address) into a reply."""

_BACKLOG = 128
_RECV_BYTES = 4096
_ACCEPTS_PER_BURST = 64


@dataclass
class _Reading:
    """A connection whose request is still arriving."""

    client: tuple[str, int]
    deadline: float
    data: bytearray = field(default_factory=bytearray)


def _canned_reply(status: int, reason: str, message: str) -> bytes:
    """A complete HTTP/1.0 reply with a small JSON body, for answering without a worker.

    Args:
        status: the status code.
        reason: the status line's reason phrase.
        message: the body's ``error`` field.

    Returns:
        The reply's bytes.
    """
    body = (json.dumps({"error": message}) + "\n").encode()
    head = (
        f"HTTP/1.0 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


_BUSY = _canned_reply(503, "Service Unavailable", "the health server is busy; try again")
_NO_DESCRIPTORS = _canned_reply(
    503, "Service Unavailable", "the agent is short of file descriptors; try again"
)


def _family_of(addr: str) -> socket.AddressFamily:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(addr).version == 6 else socket.AF_INET
    except ValueError:
        return socket.AF_INET  # a host name: bound over IPv4, as http.server does


def _is_complete(data: bytearray, searched_from: int) -> bool:
    start = max(0, searched_from - 3)
    return data.find(b"\r\n\r\n", start) >= 0 or data.find(b"\n\n", start) >= 0


def _send_all(conn: socket.socket, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the client did not read the reply in time")
        conn.settimeout(remaining)
        view = view[conn.send(view) :]


def _close(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the peer is gone already
    conn.close()


class BoundedHTTPServer:
    """Serve one request per connection on ``1 + workers`` threads (see the module docstring).

    Args:
        addr: the address to bind.
        port: the port; 0 picks a free one (see :attr:`port` after :meth:`start`).
        respond: builds each reply, on a worker thread; an exception closes the connection.
        name: names the threads and the log lines.
        max_connections: the most connections open at once.
        workers: the pool's size.
        read_deadline_s: the longest a client may take to send its whole request.
        write_deadline_s: the longest a client may take to read its whole reply.
        max_request_bytes: the most bytes a request may have before the reply is made anyway.
        reserved_descriptors: below this many free descriptors, new connections are refused.
    """

    def __init__(
        self,
        addr: str,
        port: int,
        respond: Respond,
        *,
        name: str = "http",
        max_connections: int = 64,
        workers: int = 4,
        read_deadline_s: float = 5.0,
        write_deadline_s: float = 5.0,
        max_request_bytes: int = 8192,
        reserved_descriptors: int = RESERVED_DESCRIPTORS,
    ) -> None:
        self._addr = addr
        self._port = port
        self._respond = respond
        self._name = name
        self._max_connections = max_connections
        self._workers = workers
        self._read_deadline_s = read_deadline_s
        self._write_deadline_s = write_deadline_s
        self._max_request_bytes = max_request_bytes
        self._reserved = reserved_descriptors
        self._listener: socket.socket | None = None
        self._selector: selectors.BaseSelector | None = None
        self._wake_r = self._wake_w = -1
        self._reading: dict[socket.socket, _Reading] = {}  # oldest first
        self._answering = 0  # queued for or held by a worker
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[socket.socket, _Reading] | None] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = False
        self._accept_pause = AcceptPause()
        self._loop_pause = AcceptPause()

    @property
    def port(self) -> int:
        """The bound port once started (the requested one before)."""
        return self._port

    @property
    def addr(self) -> str:
        """The bound address."""
        return self._addr

    def connections(self) -> int:
        """How many connections are open now (being read, waiting, or being answered)."""
        with self._lock:
            return len(self._reading) + self._answering

    def start(self) -> None:
        """Bind, listen (backlog 128) and start the threads.

        Raises:
            OSError: the address cannot be bound.
            AgentError: the server was already started.
        """
        if self._listener is not None or self._threads:
            raise AgentError(f"{self._name} server is already started")
        listener = socket.create_server(
            (self._addr, self._port), family=_family_of(self._addr), backlog=_BACKLOG
        )
        listener.setblocking(False)
        self._listener = listener
        self._port = int(listener.getsockname()[1])
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._set_accepting(True)
        tag = f"{self._name}:{self._port}"
        self._threads = [threading.Thread(target=self._loop, name=tag, daemon=True)]
        self._threads += [
            threading.Thread(target=self._work, name=f"{tag}-worker{i}", daemon=True)
            for i in range(self._workers)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, close the port and the connections still being read.

        Requests already read are still answered by the workers, which then end.

        Args:
            timeout_s: the longest to wait for the threads.

        Raises:
            AgentError: the selector thread did not end within ``timeout_s``.
        """
        if not self._threads or self._stopping.is_set():
            return
        deadline = time.monotonic() + timeout_s
        self._stopping.set()
        os.write(self._wake_w, b"x")
        loop, workers = self._threads[0], self._threads[1:]
        loop.join(timeout_s)
        if loop.is_alive():
            # Its descriptors stay open: closed, their numbers could be reused under it.
            raise AgentError(f"{self._name} server thread did not stop in {timeout_s} s")
        os.close(self._wake_r)
        os.close(self._wake_w)
        for _ in workers:
            self._jobs.put(None)
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        busy = [worker.name for worker in workers if worker.is_alive()]
        if busy:
            logger.warning("%s: still sending a reply at stop: %s", self._name, ", ".join(busy))

    # -- the selector thread ------------------------------------------------------------

    def _loop(self) -> None:
        selector, listener = self._selector, self._listener
        assert selector is not None and listener is not None
        try:
            while not self._stopping.is_set():
                try:
                    self._turn(selector)
                    if self._loop_pause.failures:
                        logger.info("%s: serving again", self._name)
                        self._loop_pause.succeeded()
                except Exception:
                    if self._loop_pause.failed(time.monotonic()):
                        logger.exception("%s: unexpected error; going on", self._name)
                    resume_at = self._loop_pause.resume_at or 0.0
                    self._stopping.wait(max(0.0, resume_at - time.monotonic()))
        finally:
            for conn in list(self._reading):
                self._forget(conn)
                conn.close()
            selector.close()
            listener.close()

    def _turn(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        self._expire(now)
        if not self._accepting and not self._accept_pause.is_paused(now):
            self._set_accepting(True)
        for key, _ in selector.select(self._select_timeout(now)):
            if key.fileobj is self._listener:
                self._accept_burst()
            elif key.fileobj == self._wake_r:
                try:
                    os.read(self._wake_r, 64)
                except BlockingIOError:
                    pass
            else:
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                self._read(conn)

    def _select_timeout(self, now: float) -> float | None:
        oldest = next(iter(self._reading.values()), None)
        wake_at = [] if oldest is None else [oldest.deadline]
        if not self._accepting and self._accept_pause.resume_at is not None:
            wake_at.append(self._accept_pause.resume_at)
        return max(0.0, min(wake_at) - now) if wake_at else None

    def _set_accepting(self, on: bool) -> None:
        assert self._selector is not None and self._listener is not None
        if on:
            self._selector.register(self._listener, selectors.EVENT_READ)
        else:
            self._selector.unregister(self._listener)
        self._accepting = on

    def _expire(self, now: float) -> None:
        for conn, reading in list(self._reading.items()):
            if reading.deadline > now:
                break  # oldest first: the rest are younger
            logger.debug("%s: %s sent no whole request in time", self._name, reading.client)
            self._forget(conn)
            conn.close()

    def _accept_burst(self) -> None:
        assert self._listener is not None
        free = free_descriptors()
        for conn, address in accept_some(self._listener, _ACCEPTS_PER_BURST, self._pause_accepting):
            if self._accept_pause.succeeded():
                logger.warning("%s: accepting connections again", self._name)
            if free is not None and free <= self._reserved:
                free = free_descriptors()  # the burst's count may be stale by now
            if free is not None and free <= self._reserved:
                self._refuse(conn, _NO_DESCRIPTORS)
                continue
            if self._admit(conn, (str(address[0]), int(address[1]))) and free is not None:
                free -= 1

    def _pause_accepting(self, exc: OSError) -> None:
        self._set_accepting(False)
        if self._accept_pause.failed(time.monotonic()):
            logger.warning(
                "%s: cannot accept connections on port %d (%s); pausing and retrying "
                "(logged once until it accepts again)",
                self._name,
                self._port,
                exc.strerror or exc,
            )

    def _admit(self, conn: socket.socket, client: tuple[str, int]) -> bool:
        """Start reading ``conn``'s request; True when it takes one more descriptor."""
        assert self._selector is not None
        grew = True
        with self._lock:
            at_cap = len(self._reading) + self._answering >= self._max_connections
        if at_cap:
            if not self._reading:
                self._refuse(conn, _BUSY)
                return False
            oldest = next(iter(self._reading))
            self._forget(oldest)
            oldest.close()
            grew = False
        try:
            conn.setblocking(False)
            self._selector.register(conn, selectors.EVENT_READ)
        except (OSError, ValueError):
            conn.close()
            return False
        with self._lock:
            self._reading[conn] = _Reading(client, time.monotonic() + self._read_deadline_s)
        return grew

    def _refuse(self, conn: socket.socket, reply: bytes) -> None:
        try:
            conn.setblocking(False)
            conn.send(reply)  # a fresh connection's send buffer takes it whole
            # Read what already came: closing on unread bytes resets the connection, and a
            # reset can discard the reply before the client reads it.
            conn.recv(_RECV_BYTES)
        except OSError:
            pass
        _close(conn)

    def _read(self, conn: socket.socket) -> None:
        reading = self._reading.get(conn)
        if reading is None:
            return
        try:
            chunk = conn.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset: nobody left to answer
            self._forget(conn)
            conn.close()
            return
        if not chunk:
            self._forget(conn)
            if reading.data:
                self._dispatch(conn, reading)  # the client ended its side: answer what came
            else:
                conn.close()
            return
        searched_from = len(reading.data)
        reading.data += chunk
        if len(reading.data) >= self._max_request_bytes or _is_complete(
            reading.data, searched_from
        ):
            self._forget(conn)
            self._dispatch(conn, reading)

    def _forget(self, conn: socket.socket) -> None:
        assert self._selector is not None
        with self._lock:
            self._reading.pop(conn, None)
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass

    def _dispatch(self, conn: socket.socket, reading: _Reading) -> None:
        with self._lock:
            self._answering += 1
        self._jobs.put((conn, reading))

    # -- the workers ----------------------------------------------------------------------

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            conn, reading = job
            try:
                reply = self._respond(bytes(reading.data), reading.client)
                _send_all(conn, reply, time.monotonic() + self._write_deadline_s)
            except (ConnectionError, TimeoutError) as exc:
                logger.debug("%s: client %s: %s", self._name, reading.client, exc)
            except Exception:
                logger.exception("%s: error answering %s", self._name, reading.client)
            finally:
                _close(conn)
                with self._lock:
                    self._answering -= 1
