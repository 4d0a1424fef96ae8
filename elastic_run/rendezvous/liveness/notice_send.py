"""Send one line to many agents' death-notice ports at once, on the notice loop, never blocking.

A node that ends a round tells the round's other members (``protocol/round_notice.py``): for each
it opens a connection to the member's listener (``peerwatch.AliveListener``), reads the greeting
(the port must still be that member's: a port reused by another process is not told), writes
the line and closes. The greeting is read whole before the line goes, so the close is a clean
FIN, never a reset that could discard the line at the receiver.

Invariants:
- Runs on the process's notice loop (``notice_loop.py``): every connect is non-blocking, every
  read is of a ready socket, every wait is a timer (``CONNECT_TIMEOUT_S`` a target).
- At most ``IN_FLIGHT`` connections at once per send, so telling thousands of members does not
  take thousands of descriptors.
- Nothing raises into the caller: a target that refuses, times out or greets otherwise is
  counted as missed (it finds the round's end at its next look, as without notices).
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from elastic_run.rendezvous.liveness.notice_loop import notice_loop
from elastic_run.rendezvous.liveness.peerwatch import CONNECT_TIMEOUT_S, greeting

__all__ = ["IN_FLIGHT", "NoticeTarget", "send_line"]

log = logging.getLogger(__name__)

IN_FLIGHT = 64
_MAX_GREETING = 256


@dataclass(frozen=True)
class NoticeTarget:
    """A member to tell: its node id (its listener's greeting) and its listener's address."""

    node_id: str
    addr: str
    port: int


@dataclass
class _Conn:
    target: NoticeTarget
    sock: socket.socket
    due: float
    phase: str = "connect"  # connect | greet
    got: bytes = b""


class _Send:
    """One line to many targets (a loop member until the last target is done)."""

    def __init__(
        self,
        line: bytes,
        targets: Sequence[NoticeTarget],
        on_done: Callable[[int, list[str]], None] | None,
    ) -> None:
        self._line = line
        self._todo = deque(targets)
        self._conns: dict[socket.socket, _Conn] = {}
        self._sent = 0
        self._missed: list[str] = []
        self._on_done = on_done
        self._loop = notice_loop()

    # -- on the loop's thread -------------------------------------------------------------

    def begin(self) -> None:
        self._loop.add(self)
        self._fill()

    def deadline(self) -> float | None:
        return min((c.due for c in self._conns.values()), default=None)

    def on_timer(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if c.due <= now]:
            self._finish(conn, "timeout")
        self._fill()

    def on_ready(self, fileobj: object, events: int) -> None:
        conn = self._conns.get(fileobj)  # type: ignore[call-overload]
        if conn is None:
            return
        if conn.phase == "connect":
            err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._finish(conn, errno.errorcode.get(err, str(err)))
            else:
                conn.phase = "greet"
                self._loop.modify(conn.sock, selectors.EVENT_READ, self)
        else:
            self._read_greeting(conn)
        self._fill()

    def _fill(self) -> None:
        while self._todo and len(self._conns) < IN_FLIGHT:
            self._open(self._todo.popleft())
        if not self._todo and not self._conns:
            self._loop.remove(self)
            if self._on_done is not None:
                try:
                    self._on_done(self._sent, self._missed)
                except Exception:
                    log.exception("round notice: the completion callback failed")
                self._on_done = None

    def _open(self, target: NoticeTarget) -> None:
        try:
            family = socket.AF_INET6 if ":" in target.addr else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            self._missed.append(f"{target.node_id}: {exc.strerror or exc}")
            return
        sock.setblocking(False)
        try:
            err = sock.connect_ex((target.addr, target.port))
        except (OSError, ValueError) as exc:  # ValueError: not an address (UnicodeError)
            sock.close()
            self._missed.append(f"{target.node_id}: {exc}")
            return
        if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
            sock.close()
            self._missed.append(f"{target.node_id}: {errno.errorcode.get(err, str(err))}")
            return
        conn = _Conn(target, sock, time.monotonic() + CONNECT_TIMEOUT_S)
        self._conns[sock] = conn
        self._loop.register(sock, selectors.EVENT_WRITE, self)

    def _read_greeting(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(_MAX_GREETING - len(conn.got))
        except BlockingIOError:
            return
        except OSError as exc:
            self._finish(conn, exc.strerror or str(exc))
            return
        conn.got += chunk
        if chunk and not conn.got.endswith(b"\n") and len(conn.got) < _MAX_GREETING:
            return
        if conn.got != greeting(conn.target.node_id):
            self._finish(conn, "another greeting (the port was reused)")
            return
        try:
            # A fresh connection's send buffer takes one short line whole.
            whole = conn.sock.send(self._line) == len(self._line)
        except OSError as exc:
            self._finish(conn, exc.strerror or str(exc))
            return
        self._finish(conn, None if whole else "the line did not go whole")

    def _finish(self, conn: _Conn, missed: str | None) -> None:
        self._conns.pop(conn.sock, None)
        self._loop.unregister(conn.sock)
        conn.sock.close()
        if missed is None:
            self._sent += 1
        else:
            self._missed.append(f"{conn.target.node_id}: {missed}")


def send_line(
    line: bytes,
    targets: Sequence[NoticeTarget],
    on_done: Callable[[int, list[str]], None] | None = None,
) -> None:
    """Send ``line`` to each of ``targets`` from the notice loop; return at once.

    Args:
        line: what to send (one line, at most a few hundred bytes).
        targets: the listeners to send it to.
        on_done: called on the loop's thread once every target is done, with how many got the
            line and ``"<node id>: <why>"`` for each that did not.
    """
    send = _Send(line, targets, on_done)
    notice_loop().call(send.begin)
