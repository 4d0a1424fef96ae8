"""Death notices between agents in milliseconds: a greeted connection closes and the port refuses.

Heartbeats judge a silent node only after ``keep_alive_interval x keep_alive_max_attempt``.
Most node losses can be seen much sooner: when an agent process dies (SIGKILL, the OOM killer,
a crash) while its host stays up, that host's kernel closes the process's sockets at once. So
each node listens on one TCP port (:class:`AliveListener`, advertised in its arrival record)
and the member before it in the ring holds one connection to it (:class:`PeerWatch`): O(1)
connections per node, whatever N.

Wire protocol: on accept the listener sends one line, ``elastic-run alive <node id>\\n``, and
nothing else ever; whatever a client sends is read and dropped. It executes nothing.

The verdict "dead" needs both facts, so nothing on the path can fake one:
- a connection that greeted with the watched node id ends (EOF or reset), and
- a fresh connect to the same address and port is refused (the host answered, nobody listens).

Everything else gives no verdict and heartbeats decide as before: a connect that is refused
before any greeting (a firewall rejecting the port), a timeout or an unreachable host (the host
itself is gone), a different greeting (the port was reused), a reconnect that greets again (a
middlebox dropped an idle connection). A node that leaves on purpose closes its listener too,
which is right: it also drops its heartbeat.

Invariants:
- One thread per object, each with ``close()`` and a bounded join. A wake-up pipe is closed
  only after its thread ended and is never written after ``close()``: a reused descriptor
  number would be another socket of this process (a store connection).
- The listener holds at most ``MAX_CONNECTIONS`` clients; past that it closes new ones, so a
  stranger can delay a verdict (heartbeats then decide) but never exhaust the agent's files.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["AliveListener", "PeerWatch", "greeting"]

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
_JOIN_S = 5.0


def greeting(node_id: str) -> bytes:
    """The one line a listener sends to each client."""
    return _GREETING_PREFIX + node_id.encode() + b"\n"


class AliveListener:
    """Accept connections, greet each with this node's id, and hold them until this process ends.

    Args:
        node_id: this node's id (sent in the greeting).
        addr: the address to listen on (the node's advertised address).

    Raises:
        OSError: the address cannot be listened on.
    """

    def __init__(self, node_id: str, addr: str) -> None:
        self._greeting = greeting(node_id)
        self._server = socket.create_server((addr, 0), family=_family_of(addr), backlog=16)
        self._server.setblocking(False)
        self.port: int = self._server.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._server, selectors.EVENT_READ)
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._clients: set[socket.socket] = set()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="elastic-run-alive", daemon=True)
        self._thread.start()

    def connections(self) -> int:
        """How many clients are connected now."""
        return len(self._clients)

    def close(self) -> None:
        """Stop listening and close every client's connection (they see this node leave)."""
        if self._closed.is_set():
            return
        self._closed.set()
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=_JOIN_S)
        _close_pipe_after(self._thread, self._wake_r, self._wake_w)

    def _serve(self) -> None:
        try:
            while not self._closed.is_set():
                for key, _ in self._selector.select():
                    if key.fileobj is self._server:
                        self._accept()
                    elif key.fileobj != self._wake_r:
                        self._drain(key.fileobj)  # type: ignore[arg-type]
        finally:
            for conn in list(self._clients):
                self._drop(conn)
            self._selector.close()
            self._server.close()

    def _accept(self) -> None:
        try:
            conn, _ = self._server.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        if len(self._clients) >= MAX_CONNECTIONS:
            conn.close()
            return
        try:
            conn.setblocking(True)
            conn.settimeout(1.0)
            conn.sendall(self._greeting)
            conn.setblocking(False)
        except OSError:
            conn.close()
            return
        self._clients.add(conn)
        self._selector.register(conn, selectors.EVENT_READ)

    def _drain(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        self._clients.discard(conn)
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()


@dataclass(frozen=True)
class _Target:
    node_id: str
    addr: str
    port: int


class PeerWatch:
    """Hold a connection to one peer's AliveListener; call ``on_dead(node_id)`` when it is gone.

    ``on_dead`` runs on the watch's thread, at most once per watched node.

    Args:
        on_dead: called with the node id once the peer is confirmed dead (see the module).
    """

    def __init__(self, on_dead: Callable[[str], None]) -> None:
        self._on_dead = on_dead
        self._lock = threading.Lock()
        self._target: _Target | None = None
        self._changed = threading.Event()
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self.state = "idle"
        self._state_changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="elastic-run-peerwatch", daemon=True)
        self._thread.start()

    def watch(self, node_id: str, addr: str, port: int) -> None:
        """Watch ``node_id`` at ``addr:port`` from now on (port 0: watch nobody)."""
        target = _Target(node_id, addr, port) if port else None
        with self._lock:
            if self._closed or target == self._target:
                return  # closed: its wake-up pipe may be gone
            self._target = target
        self._poke()

    def wait_state(self, predicate: Callable[[str], bool], timeout_s: float) -> bool:
        """Block until ``predicate(state)`` holds (``state`` names what the watch is doing)."""
        with self._state_changed:
            return self._state_changed.wait_for(lambda: predicate(self.state), timeout_s)

    def close(self) -> None:
        """Stop watching and join the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._target = None
        self._poke()
        self._thread.join(timeout=_JOIN_S)
        _close_pipe_after(self._thread, self._wake_r, self._wake_w)

    # -- the thread ------------------------------------------------------------------------

    def _poke(self) -> None:
        self._changed.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _set_state(self, state: str) -> None:
        with self._state_changed:
            self.state = state
            self._state_changed.notify_all()

    def _current(self) -> tuple[_Target | None, bool]:
        with self._lock:
            return self._target, self._closed

    def _run(self) -> None:
        while True:
            self._changed.clear()
            target, closed = self._current()
            if closed:
                self._set_state("closed")
                return
            if target is None:
                self._set_state("idle")
                self._changed.wait()
                continue
            if self._watch(target):
                self._on_dead(target.node_id)
                self._set_state(f"dead {target.node_id}")
                with self._lock:
                    if self._target == target:
                        self._target = None

    def _interrupted(self, wait_s: float) -> bool:
        """Sleep up to ``wait_s``; True when the target changed or the watch closed meanwhile."""
        return self._changed.wait(wait_s)

    def _watch(self, target: _Target) -> bool:
        """Watch ``target`` until it is confirmed dead (True) or the target changes (False)."""
        greeted = False
        retry_s = RETRY_S
        while True:
            outcome = self._connect(target)
            if outcome == "refused" and greeted:
                return True
            if isinstance(outcome, socket.socket):
                greeted = True
                self._set_state(f"watching {target.node_id}")
                ended = self._hold(outcome)
                outcome.close()
                if not ended:
                    return False  # interrupted: a new target or close
                self._set_state(f"closed {target.node_id}")
                retry_s = FIRST_RETRY_S
                continue  # confirm at once with a fresh connect
            self._set_state(f"no verdict {target.node_id}: {outcome}")
            if self._interrupted(retry_s):
                return False
            retry_s = min(RETRY_S, retry_s * 2)

    def _connect(self, target: _Target) -> socket.socket | str:
        """A greeted connection, or why not: refused, timeout, unreachable, bad greeting."""
        try:
            sock = socket.create_connection((target.addr, target.port), timeout=CONNECT_TIMEOUT_S)
        except ConnectionRefusedError:
            return "refused"
        except TimeoutError:
            return "timeout"
        except OSError as exc:
            return errno.errorcode.get(exc.errno or 0, str(exc))
        try:
            line = b""
            while not line.endswith(b"\n") and len(line) < _MAX_GREETING:
                chunk = sock.recv(_MAX_GREETING - len(line))
                if not chunk:
                    break
                line += chunk
        except OSError:
            sock.close()
            return "no greeting"
        if line != greeting(target.node_id):
            sock.close()
            return "another greeting (the port was reused)"
        return sock

    def _hold(self, sock: socket.socket) -> bool:
        """Block on ``sock``; True when the peer ended it, False when interrupted."""
        sock.setblocking(False)
        with selectors.DefaultSelector() as sel:
            sel.register(sock, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select():
                    if key.fileobj == self._wake_r:
                        _drain_pipe(self._wake_r)
                        if self._changed.is_set():
                            return False
                        continue
                    try:
                        data = sock.recv(4096)
                    except BlockingIOError:
                        continue
                    except OSError:
                        return True
                    if not data:
                        return True


def _close_pipe_after(thread: threading.Thread, *fds: int) -> None:
    """Close a wake-up pipe once the thread that polls it has ended.

    While the thread may still run, the descriptors stay open (two leaked files): closed, their
    numbers would be reused by the next socket the process opens (a store connection), and a
    late read or write on them would steal or inject that socket's bytes.
    """
    if thread.is_alive():
        log.warning("%s did not end in %g s; its wake-up pipe stays open", thread.name, _JOIN_S)
        return
    for fd in fds:
        os.close(fd)


def _drain_pipe(fd: int) -> None:
    try:
        while os.read(fd, 64):
            pass
    except BlockingIOError:
        pass


def _family_of(addr: str) -> socket.AddressFamily:
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return socket.AF_INET
    return infos[0][0] if infos else socket.AF_INET
