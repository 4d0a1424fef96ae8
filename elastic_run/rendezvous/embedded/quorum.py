"""The quorum watch: which members of the embedded cluster are up, and when the quorum is gone.

Every ``interval_s`` (0.5 s in a member's agent, 2 s in the others) a thread knocks at each member's client port (a TCP connect, nothing sent):

- ``up``: it accepted;
- ``down``: it refused (its host answered, and no member listens there: it died);
- ``silent``: no answer in time (a partition that may heal, or a host that died).

The verdict (:func:`quorum_verdict`, pure) counts as lost only members that were up once and now
refuse: a member not started yet refuses too, and a silent one may come back. When more members
are lost than the cluster tolerates, the rendezvous has lost its quorum for good: no etcd call can
succeed again, so calls stop trying at once (``gone_reason``) and the agent exits 4 with one line
instead of waiting out its timeouts. A host cut off sees the others silent, never refusing, and
waits for the heal.

Invariants: the thread never raises and never writes; ``stop()`` joins it within a bound.
"""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from elastic_run.rendezvous.embedded.cluster import EmbeddedCluster, resolve_host

__all__ = ["MemberState", "QuorumWatch", "Verdict", "knock", "quorum_verdict"]

MemberState = Literal["up", "down", "silent"]


def knock(host: str, port: int, timeout_s: float) -> MemberState:
    """Knock at ``host:port`` once: up (accepted), down (refused) or silent."""
    addresses = resolve_host(host)
    if not addresses:
        return "silent"
    family = socket.AF_INET6 if ":" in addresses[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect((addresses[0], port))
        except ConnectionRefusedError:
            return "down"
        except OSError as exc:
            # A host that answers "unreachable" is no refusal: its member may come back.
            return "down" if exc.errno == errno.ECONNREFUSED else "silent"
        return "up"


@dataclass(frozen=True)
class Verdict:
    """The members' states and, when the quorum is gone for good, the line that says so."""

    states: Mapping[str, MemberState]
    lost: tuple[str, ...]
    reason: str | None


def quorum_verdict(
    cluster: EmbeddedCluster, states: Mapping[str, MemberState], seen_up: frozenset[str]
) -> Verdict:
    """Whether the cluster lost its quorum for good (see the module docstring).

    Args:
        cluster: the members.
        states: each member's latest state, by name.
        seen_up: the members that were up at least once.
    """
    lost = tuple(
        m.name for m in cluster.members if states.get(m.name) == "down" and m.name in seen_up
    )
    reason = None
    if len(lost) > cluster.tolerates:
        where = ", ".join(m.client_endpoint for m in cluster.members if m.name in lost)
        reason = (
            f"the rendezvous lost its quorum: {len(lost)} of the {cluster.size} embedded etcd "
            f"members are down ({where}), and it needs {cluster.majority} of them"
        )
    return Verdict(dict(states), lost, reason)


class QuorumWatch:
    """A thread that knocks at every member every ``interval_s`` and keeps the verdict.

    Args:
        cluster: the members.
        interval_s: seconds between rounds of knocks.
        knock_timeout_s: how long one knock waits for an answer.
    """

    def __init__(
        self, cluster: EmbeddedCluster, interval_s: float = 0.5, knock_timeout_s: float = 0.5
    ) -> None:
        self._cluster = cluster
        self._interval_s = interval_s
        self._knock_timeout_s = knock_timeout_s
        self._lock = threading.Lock()
        self._seen_up: set[str] = set()
        self._verdict = quorum_verdict(cluster, {}, frozenset())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="elastic-run-quorum-watch", daemon=True
            )
            self._thread.start()

    def check_now(self) -> Verdict:
        """Knock at every member once, now, and return the new verdict."""
        states = {
            m.name: knock(m.host, m.client_port, self._knock_timeout_s)
            for m in self._cluster.members
        }
        with self._lock:
            self._seen_up |= {name for name, state in states.items() if state == "up"}
            verdict = quorum_verdict(self._cluster, states, frozenset(self._seen_up))
            if self._verdict.reason is not None:
                verdict = self._verdict  # lost for good stays lost
            self._verdict = verdict
            return verdict

    @property
    def verdict(self) -> Verdict:
        """The latest verdict."""
        with self._lock:
            return self._verdict

    def gone_reason(self) -> str | None:
        """Why the cluster will never answer again, or None (for ``EtcdConnection``)."""
        return self.verdict.reason

    def _run(self) -> None:
        while not self._stop.is_set():
            self.check_now()
            self._stop.wait(self._interval_s)

    def stop(self) -> None:
        """Stop the thread and wait for it (bounded). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._knock_timeout_s * self._cluster.size + 2.0)
