"""Death notices between agents in milliseconds: a greeted connection closes and the port refuses.

Heartbeats judge a silent node only after ``keep_alive_interval x keep_alive_max_attempt``.
Most node losses can be seen much sooner: when an agent process dies (SIGKILL, the OOM killer,
a crash) while its host stays up, that host's kernel closes the process's sockets at once. So
each node listens on one TCP port (:class:`AliveListener`, advertised in its arrival record)
and the member before it in the ring holds one connection to it (:class:`PeerWatch`): O(1)
connections per node, whatever N.

Wire protocol: on accept the listener sends one line, ``elastic-run alive <node id>\\n``, and
nothing else ever. A client may send lines of at most ``MAX_LINE`` bytes (a round's end told by a
member, ``protocol/round_notice.py``): each whole line is handed to the listener's ``on_line``,
which only parses it (and may ask for one look at the store); a client whose line is longer, or
whose line ``on_line`` rejects, is dropped. Without ``on_line`` whatever a client sends is read
and dropped. Nothing a client sends is executed.

The verdict "dead" needs both facts, so nothing on the path can fake one:
- a connection that greeted with the watched node id ends (EOF or reset), and
- a fresh connect to the same address and port is refused (the host answered, nobody listens).

Everything else gives no verdict and heartbeats decide as before: a connect that is refused
before any greeting (a firewall rejecting the port), a timeout or an unreachable host (the host
itself is gone), a different greeting (the port was reused), a reconnect that greets again (a
middlebox dropped an idle connection), a connect that is never greeted (the listener is full or
out of descriptors). A node that leaves on purpose closes its listener too, which is right: it
also drops its heartbeat.

Why no client but the node itself can cause a false "dead": the second fact, a refused connect,
happens only when nothing listens on the port, and the listener's port closes only when its
process ends or calls :meth:`AliveListener.close`. A client can end its own connection, flood
the port, or exhaust the node's descriptors (through this port or any other server of the
agent), and none of that closes the port: the listener's thread catches every error of a client
and of ``accept()``, and keeps listening (see below). While the port is open, the kernel
completes handshakes into the backlog or, with the backlog full, drops SYNs, so a watcher sees a
connect that is never greeted or that times out: no verdict. (Only something on the path that
forges a reset or an ICMP "port unreachable" can fake a refusal, as it can fake any TCP traffic;
heartbeats still judge a silent node.)

Invariants:
- No thread of its own: every listener and watch of the process is served by the one select
  loop of ``notice_loop.py`` (thread ``elastic-run-notices``), which never waits on anything but
  its sockets and timers, and whose wake-up pipe lives as long as the process.
- The listener's port stays open until ``close()``. No exception of one client, and no
  ``accept()`` error, closes it: an error of one pending connection (ECONNABORTED...) is
  skipped; running out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) is logged
  once per episode, and accepting pauses (50 ms, doubling up to 1 s: the port is taken out of
  the selector, so the loop does not spin) and resumes. Waiting connections stay in the backlog
  and are greeted once descriptors free; a watcher waits ``CONNECT_TIMEOUT_S`` for a greeting,
  so a short pressure costs it nothing. (Chosen over keeping a spare descriptor to
  accept-and-close under EMFILE: that turns every waiting watcher into "no greeting", and the
  freed descriptor races with the agent's other threads, which need it more.)
- The listener holds at most ``MAX_CONNECTIONS`` clients; past that it closes new ones, so a
  stranger can delay a verdict (heartbeats then decide) but never exhaust the agent's files.
- A watch never blocks the loop: its connect is non-blocking, its greeting and its hold are
  reads of a ready socket, its waits are timers. Each of its own errors (out of descriptors to
  connect) is a "no verdict" and it tries again after ``RETRY_S``; an error in ``on_dead`` is
  logged.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from elastic_run.descriptors import AcceptPause, accept_some
from elastic_run.rendezvous.liveness.notice_loop import notice_loop
from elastic_run.rendezvous.protocol.round_notice import MAX_LINE

__all__ = [
    "CONNECT_TIMEOUT_S",
    "FIRST_RETRY_S",
    "MAX_CONNECTIONS",
    "answers",
    "RETRY_S",
    "AliveListener",
    "PeerWatch",
    "greeting",
]

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
CONNECT_TIMEOUT_S = 2.0
RETRY_S = 1.0
# After a greeted connection ends, retry fast at first: a dying process's kernel may close that
# connection before its listening socket, so the first reconnect can still be accepted (and
# then reset) although nobody will ever greet again.
FIRST_RETRY_S = 0.01
_GREETING_PREFIX = b"elastic-run alive "
_MAX_GREETING = 256
_CLOSE_WAIT_S = 5.0
_ACCEPTS_PER_BURST = 64
_READ = selectors.EVENT_READ
_WRITE = selectors.EVENT_WRITE


def greeting(node_id: str) -> bytes:
    """The one line a listener sends to each client."""
    return _GREETING_PREFIX + node_id.encode() + b"\n"


class AliveListener:
    """Accept connections, greet each with this node's id, and hold them until this process ends.

    Args:
        node_id: this node's id (sent in the greeting).
        addr: the address to listen on (the node's advertised address).
        on_line: called on the loop's thread with each whole line a client sends (without its
            newline); it must be quick, and returns False to have that client dropped. None:
            what clients send is dropped unread.

    Raises:
        OSError: the address cannot be listened on.
    """

    def __init__(
        self, node_id: str, addr: str, on_line: Callable[[bytes], bool] | None = None
    ) -> None:
        self._greeting = greeting(node_id)
        self._on_line = on_line
        self._partial: dict[socket.socket, bytes] = {}
        self._server = socket.create_server((addr, 0), family=_family_of(addr), backlog=16)
        self._server.setblocking(False)
        self.port: int = self._server.getsockname()[1]
        self._clients: set[socket.socket] = set()
        self._accepting = True
        self._accept_pause = AcceptPause()
        self._closed = False
        self._loop = notice_loop()
        # The port listens from here on (the kernel queues connects); the loop accepts soon.
        self._loop.call(self._open)

    def connections(self) -> int:
        """How many clients are connected now."""
        return len(self._clients)

    def close(self) -> None:
        """Stop listening and close every client's connection (they see this node leave)."""
        if self._closed:
            return
        self._closed = True
        if not self._loop.call_wait(self._shut, _CLOSE_WAIT_S):
            log.warning("the death-notice loop did not close a listener in %g s", _CLOSE_WAIT_S)

    # -- on the loop's thread ----------------------------------------------------------

    def _open(self) -> None:
        if self._closed:
            return
        self._loop.add(self)
        self._loop.register(self._server, _READ, self)

    def _shut(self) -> None:
        for conn in list(self._clients):
            self._drop(conn)
        self._loop.unregister(self._server)
        self._loop.remove(self)
        self._server.close()

    def deadline(self) -> float | None:
        """When accepting resumes after a pause (None: not paused)."""
        return None if self._accepting else self._accept_pause.resume_at

    def on_timer(self, now: float) -> None:
        """Resume accepting once the pause is over."""
        if not self._accepting and not self._accept_pause.is_paused(now) and not self._closed:
            self._loop.register(self._server, _READ, self)
            self._accepting = True

    def on_ready(self, fileobj: object, events: int) -> None:
        """The port has connections to accept, or a client sent something (or left)."""
        if fileobj is self._server:
            self._accept()
            return
        assert isinstance(fileobj, socket.socket)
        try:
            self._drain(fileobj)
        except Exception:
            log.exception("death-notice listener: error serving a client; dropped it")
            self._drop(fileobj)

    def _accept(self) -> None:
        for conn, _ in accept_some(self._server, _ACCEPTS_PER_BURST, self._pause_accepting):
            failures = self._accept_pause.succeeded()
            if failures:
                log.warning(
                    "death-notice listener on port %d accepts again (after %d failed tries)",
                    self.port,
                    failures,
                )
            self._admit(conn)

    def _pause_accepting(self, exc: OSError) -> None:
        self._loop.unregister(self._server)
        self._accepting = False
        if self._accept_pause.failed(time.monotonic()):
            log.warning(
                "death-notice listener on port %d cannot accept (%s); its port stays open, "
                "pausing and retrying (not logged again until it recovers)",
                self.port,
                exc.strerror or exc,
            )

    def _admit(self, conn: socket.socket) -> None:
        if len(self._clients) >= MAX_CONNECTIONS:
            conn.close()
            return
        try:
            conn.setblocking(False)
            # A new connection's send buffer takes the short greeting whole; never block here.
            if conn.send(self._greeting) != len(self._greeting):
                raise BlockingIOError
            self._loop.register(conn, _READ, self)
        except (OSError, ValueError):
            conn.close()
            return
        self._clients.add(conn)

    def _drain(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        if self._on_line is not None:
            self._lines(conn, data)

    def _lines(self, conn: socket.socket, data: bytes) -> None:
        """Hand each whole line of ``conn`` to ``on_line``; drop a client that oversteps."""
        assert self._on_line is not None
        buffer = self._partial.pop(conn, b"") + data
        *lines, rest = buffer.split(b"\n")
        for line in lines:
            if not self._on_line(line):  # a line too long is rejected there too
                self._drop(conn)
                return
        if len(rest) >= MAX_LINE:
            self._on_line(rest)  # rejected (too long): said so by whoever parses it
            self._drop(conn)
        elif rest:
            self._partial[conn] = rest

    def _drop(self, conn: socket.socket) -> None:
        self._partial.pop(conn, None)
        self._clients.discard(conn)
        self._loop.unregister(conn)
        conn.close()


@dataclass(frozen=True)
class _Target:
    node_id: str
    addr: str
    port: int


class PeerWatch:
    """Hold a connection to one peer's AliveListener; call ``on_dead(node_id)`` when it is gone.

    ``on_dead`` runs on the death-notice loop's thread, at most once per watched node; it must
    be quick.

    One watch moves through: idle (no target) -> connecting -> greeted? -> holding the
    connection -> (it ended) connecting again at once: refused means dead. Anything else
    (refused before any greeting, a timeout, another greeting, no greeting) is "no verdict"
    and a new try after ``RETRY_S`` (after ``FIRST_RETRY_S``, doubling, once a greeted
    connection ended).

    Args:
        on_dead: called with the node id once the peer is confirmed dead (see the module).
    """

    def __init__(self, on_dead: Callable[[str], None]) -> None:
        self._on_dead = on_dead
        self._lock = threading.Lock()
        self._target: _Target | None = None
        self._closed = False
        self.state = "idle"
        self._state_changed = threading.Condition()
        # The loop thread's own: what it watches now and how far it got.
        self._current: _Target | None = None
        self._sock: socket.socket | None = None
        self._phase = "idle"  # idle | wait | connect | greet | hold
        self._due: float | None = None
        self._greeted = False
        self._retry_s = RETRY_S
        self._line = b""
        self._loop = notice_loop()
        self._loop.call(lambda: self._loop.add(self))

    def watch(self, node_id: str, addr: str, port: int) -> None:
        """Watch ``node_id`` at ``addr:port`` from now on (port 0: watch nobody)."""
        target = _Target(node_id, addr, port) if port else None
        with self._lock:
            if self._closed or target == self._target:
                return
            self._target = target
        self._loop.call(self._retarget)

    def wait_state(self, predicate: Callable[[str], bool], timeout_s: float) -> bool:
        """Block until ``predicate(state)`` holds (``state`` names what the watch is doing)."""
        with self._state_changed:
            return self._state_changed.wait_for(lambda: predicate(self.state), timeout_s)

    def close(self) -> None:
        """Stop watching (bounded: the loop does it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._target = None
        if not self._loop.call_wait(self._shut, _CLOSE_WAIT_S):
            log.warning("the death-notice loop did not close a watch in %g s", _CLOSE_WAIT_S)

    # -- on the loop's thread ----------------------------------------------------------

    def _set_state(self, state: str) -> None:
        with self._state_changed:
            self.state = state
            self._state_changed.notify_all()

    def _shut(self) -> None:
        self._drop_socket()
        self._phase, self._due, self._current = "idle", None, None
        self._loop.remove(self)
        self._set_state("closed")

    def _retarget(self) -> None:
        with self._lock:
            target, closed = self._target, self._closed
        if closed or (target == self._current and self._phase != "idle"):
            return
        self._drop_socket()
        self._current, self._greeted, self._retry_s = target, False, RETRY_S
        if target is None:
            self._phase, self._due = "idle", None
            self._set_state("idle")
            return
        self._connect()

    def _drop_socket(self) -> None:
        if self._sock is not None:
            self._loop.unregister(self._sock)
            self._sock.close()
            self._sock = None

    def _connect(self) -> None:
        target = self._current
        assert target is not None
        self._line = b""
        try:
            family = _family_of(target.addr)
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            self._no_verdict(errno.errorcode.get(exc.errno or 0, str(exc)))
            return
        sock.setblocking(False)
        self._sock = sock
        self._due = time.monotonic() + CONNECT_TIMEOUT_S
        err = sock.connect_ex((target.addr, target.port))
        if err in (0, errno.EINPROGRESS, errno.EAGAIN):
            self._phase = "connect"
            self._loop.register(sock, _WRITE, self)
            return
        self._outcome(err)

    def deadline(self) -> float | None:
        """When a connect or greeting times out, or the next try starts."""
        return self._due if self._phase in ("wait", "connect", "greet") else None

    def on_timer(self, now: float) -> None:
        """A connect or greeting took too long (no verdict), or it is time to try again."""
        if self._phase == "wait":
            self._connect()
        elif self._phase == "connect":
            self._no_verdict("timeout")
        elif self._phase == "greet":
            self._no_verdict("no greeting")

    def on_ready(self, fileobj: object, events: int) -> None:
        """The connection is up (or failed), a greeting came, or a held connection ended."""
        sock = self._sock
        if sock is None or fileobj is not sock:
            return
        if self._phase == "connect":
            self._outcome(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
        elif self._phase == "greet":
            self._read_greeting(sock)
        elif self._phase == "hold":
            self._read_held(sock)

    def _outcome(self, err: int) -> None:
        """The end of a connect: ``err`` 0 (connected) or why it failed."""
        if err == 0:
            assert self._sock is not None
            self._phase = "greet"
            self._loop.modify(self._sock, _READ, self)
            return
        if err == errno.ECONNREFUSED:
            if self._greeted:
                self._dead()
                return
            self._no_verdict("refused")
            return
        self._no_verdict(errno.errorcode.get(err, str(err)))

    def _read_greeting(self, sock: socket.socket) -> None:
        assert self._current is not None
        try:
            chunk = sock.recv(_MAX_GREETING - len(self._line))
        except BlockingIOError:
            return
        except OSError:
            self._no_verdict("no greeting")
            return
        self._line += chunk
        if chunk and not self._line.endswith(b"\n") and len(self._line) < _MAX_GREETING:
            return
        if self._line != greeting(self._current.node_id):
            self._no_verdict("another greeting (the port was reused)")
            return
        self._greeted, self._phase, self._due = True, "hold", None
        self._set_state(f"watching {self._current.node_id}")

    def _read_held(self, sock: socket.socket) -> None:
        assert self._current is not None
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            return  # a listener sends nothing after its greeting: ignore
        self._drop_socket()
        self._set_state(f"closed {self._current.node_id}")
        self._retry_s = FIRST_RETRY_S
        self._connect()  # confirm at once with a fresh connect

    def _no_verdict(self, why: str) -> None:
        assert self._current is not None
        self._drop_socket()
        self._set_state(f"no verdict {self._current.node_id}: {why}")
        self._phase, self._due = "wait", time.monotonic() + self._retry_s
        self._retry_s = min(RETRY_S, self._retry_s * 2)

    def _dead(self) -> None:
        target = self._current
        assert target is not None
        self._drop_socket()
        self._phase, self._due, self._current = "idle", None, None
        try:
            self._on_dead(target.node_id)
        except Exception:
            log.exception("peer watch: on_dead(%r) failed", target.node_id)
        self._set_state(f"dead {target.node_id}")
        with self._lock:
            if self._target == target:
                self._target = None
        self._retarget()  # idle, or a target given meanwhile


def answers(node_id: str, addr: str, port: int, timeout_s: float) -> bool:
    """Whether the listener at ``addr:port`` greets as ``node_id`` within ``timeout_s``.

    A one-off look (a fresh connection, read one line, closed): True means that node's agent is
    alive now. False is no verdict on its own (a refusal, a timeout, another greeting): the
    caller waits for heartbeats to judge, as the watch does.
    """
    want = greeting(node_id)
    try:
        with socket.create_connection((addr, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            got = b""
            while len(got) < len(want) and not got.endswith(b"\n"):
                chunk = sock.recv(len(want) - len(got))
                if not chunk:
                    break
                got += chunk
    except (OSError, ValueError):  # ValueError: an address that is not one (UnicodeError)
        return False
    return got == want


def _family_of(addr: str) -> socket.AddressFamily:
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return socket.AF_INET
    return infos[0][0] if infos else socket.AF_INET
