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
- One thread per object, each with ``close()`` and a bounded join. A wake-up pipe is closed
  only after its thread ended and is never written after ``close()``: a reused descriptor
  number would be another socket of this process (a store connection).
- The listener's port stays open until ``close()``. No exception of one client, and no
  ``accept()`` error, ends its thread: an error of one pending connection (ECONNABORTED...) is
  skipped; running out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) is logged
  once per episode, and accepting pauses (50 ms, doubling up to 1 s: the port is taken out of
  the selector, so the loop does not spin) and resumes. Waiting connections stay in the backlog
  and are greeted once descriptors free; a watcher waits ``CONNECT_TIMEOUT_S`` for a greeting,
  so a short pressure costs it nothing. (Chosen over keeping a spare descriptor to
  accept-and-close under EMFILE: that turns every waiting watcher into "no greeting", and the
  freed descriptor races with the agent's other threads, which need it more.)
- The listener holds at most ``MAX_CONNECTIONS`` clients; past that it closes new ones, so a
  stranger can delay a verdict (heartbeats then decide) but never exhaust the agent's files.
- A watch's thread survives its own errors (out of descriptors to connect or to poll): each is
  a "no verdict" and it tries again after ``RETRY_S``; an error in ``on_dead`` is logged.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from elastic_run.descriptors import AcceptPause, accept_some

__all__ = [
    "CONNECT_TIMEOUT_S",
    "FIRST_RETRY_S",
    "MAX_CONNECTIONS",
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
_JOIN_S = 5.0
_ACCEPTS_PER_BURST = 64


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
        self._accepting = True
        self._accept_pause = AcceptPause()
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
        loop_pause = AcceptPause()
        try:
            while not self._closed.is_set():
                try:
                    self._serve_once()
                    loop_pause.succeeded()
                except Exception:
                    # Never end the thread (that would close the port: a false death notice).
                    if loop_pause.failed(time.monotonic()):
                        log.exception("death-notice listener: unexpected error; going on")
                    resume_at = loop_pause.resume_at or 0.0
                    self._closed.wait(max(0.0, resume_at - time.monotonic()))
        finally:
            for conn in list(self._clients):
                self._drop(conn)
            self._selector.close()
            self._server.close()

    def _serve_once(self) -> None:
        now = time.monotonic()
        if not self._accepting and not self._accept_pause.is_paused(now):
            self._selector.register(self._server, selectors.EVENT_READ)
            self._accepting = True
        resume_at = None if self._accepting else self._accept_pause.resume_at
        timeout = None if resume_at is None else max(0.0, resume_at - now)
        for key, _ in self._selector.select(timeout):
            if key.fileobj is self._server:
                self._accept()
            elif key.fileobj != self._wake_r:
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                try:
                    self._drain(conn)
                except Exception:
                    log.exception("death-notice listener: error serving a client; dropped it")
                    self._drop(conn)

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
        self._selector.unregister(self._server)
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
            self._selector.register(conn, selectors.EVENT_READ)
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
        failing = False
        while True:
            try:
                if self._run_once():
                    return
                failing = False
            except Exception as exc:
                # Never end the watch on its own error: report no verdict and try again.
                if not failing:
                    log.exception("peer watch: unexpected error; trying again")
                failing = True
                target, _ = self._current()
                who = target.node_id if target is not None else "nobody"
                self._set_state(f"no verdict {who}: {type(exc).__name__}")
                self._interrupted(RETRY_S)

    def _run_once(self) -> bool:
        """One step of the thread: True when the watch is closed."""
        self._changed.clear()
        target, closed = self._current()
        if closed:
            self._set_state("closed")
            return True
        if target is None:
            self._set_state("idle")
            self._changed.wait()
            return False
        if self._watch(target):
            try:
                self._on_dead(target.node_id)
            except Exception:
                log.exception("peer watch: on_dead(%r) failed", target.node_id)
            self._set_state(f"dead {target.node_id}")
            with self._lock:
                if self._target == target:
                    self._target = None
        return False

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
        # poll(2), not epoll: it needs no descriptor of its own, so it works when none is left.
        with selectors.PollSelector() as sel:
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
