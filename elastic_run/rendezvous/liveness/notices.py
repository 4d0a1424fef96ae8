"""One node's death notices: its own listener, its watch on the ring successor, the dead it saw.

The node's side of ``peerwatch.py``: it listens on one port (advertised in its arrival record)
and holds one connection to its ring successor's port. When the watch confirms a death, the
node id joins ``closed_peers`` for good (node ids are never reused) and ``on_dead`` runs, so the
liveness thread judges the round at once instead of after the heartbeat budget.

The same port carries a round's end told by a member (``protocol/round_notice.py``): the
listener hands each line a client sends to ``on_line`` (the handler parses it and may look at
the store once), and ``tell`` sends a line to the other members' ports
(``notice_send.py``).

Without a listening port (the address cannot be bound) the node still runs: heartbeats alone
judge it, the record says port 0, and nobody can tell it of a round's end: it finds it at its
next look.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from elastic_run.rendezvous.liveness.notice_send import NoticeTarget, send_line
from elastic_run.rendezvous.liveness.peerwatch import AliveListener, PeerWatch
from elastic_run.rendezvous.protocol import decisions as proto
from elastic_run.rendezvous.protocol.records import NodeRecord

__all__ = ["DeathNotices"]

log = logging.getLogger(__name__)


class DeathNotices:
    """This node's listener, its watch, and the peers it saw die.

    Args:
        run_id: the job id (for messages).
        node_id: this node's id (its listener greets with it).
        addr: the address to listen on (the node's advertised address).
        on_dead: called (from the watch's thread) after a peer was confirmed dead.
        on_line: called (from the notice loop's thread) with each line a client of the
            listener sends; returns False to drop that client (see ``AliveListener``).
    """

    def __init__(
        self,
        run_id: str,
        node_id: str,
        addr: str,
        on_dead: Callable[[str], None],
        on_line: Callable[[bytes], bool] | None = None,
    ) -> None:
        self._run_id = run_id
        self._node_id = node_id
        self._addr = addr
        self._on_dead = on_dead
        self._on_line = on_line
        self._lock = threading.Lock()
        self._closed: frozenset[str] = frozenset()
        self._alive: AliveListener | None = None
        self._watch: PeerWatch | None = None

    @property
    def port(self) -> int:
        """The listening port (0: none, heartbeats alone judge this node)."""
        return self._alive.port if self._alive is not None else 0

    @property
    def state(self) -> str:
        """What the watch does, for people (``watching <id>``, ``idle``...)."""
        return self._watch.state if self._watch is not None else "idle"

    @property
    def closed_peers(self) -> frozenset[str]:
        """The node ids this node saw die. No I/O."""
        return self._closed

    def start(self) -> None:
        """Listen and start the watch (idempotent)."""
        if self._watch is not None:
            return
        try:
            self._alive = AliveListener(self._node_id, self._addr, self._on_line)
        except OSError as exc:
            log.info(
                "rendezvous '%s': no death-notice port on %s (%s); heartbeats alone judge this node",
                self._run_id,
                self._addr,
                exc,
            )
        self._watch = PeerWatch(self._dead)

    def watch(self, successor: NodeRecord | None) -> None:
        """Watch ``successor`` from now on (None: alone in the round, nobody to watch)."""
        if self._watch is None:
            return
        if successor is None:
            self._watch.watch("", "", 0)
        else:
            self._watch.watch(successor.node_id, successor.addr, successor.alive_port)

    def tell(
        self,
        line: bytes,
        targets: Sequence[NoticeTarget],
        on_done: Callable[[int, list[str]], None] | None = None,
    ) -> None:
        """Send ``line`` to each target's port, from the notice loop; return at once.

        Nothing is sent before ``start`` (a node that opens no socket tells nobody).
        """
        if self._watch is None or not targets:
            return
        send_line(line, targets, on_done)

    def apply(self, beats: proto.Heartbeats, now: float) -> proto.Heartbeats:
        """``beats`` with the seen deaths applied (gone for good)."""
        closed = self._closed
        return beats.with_closed(closed, now) if closed else beats

    def close(self) -> None:
        """Stop watching and close the listener (peers see this node leave)."""
        if self._watch is not None:
            self._watch.close()
        if self._alive is not None:
            self._alive.close()

    def _dead(self, node_id: str) -> None:
        with self._lock:
            self._closed = self._closed | {node_id}
        log.info(
            "rendezvous '%s': the agent of %s ended (its connection closed and its port refuses)",
            self._run_id,
            node_id,
        )
        self._on_dead(node_id)
