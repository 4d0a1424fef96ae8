"""The seam between the dynamic rendezvous and a store: a small key-value interface.

The O(N) protocol (see ``protocol/decisions.py``) needs only these primitives, each O(1) in
size except the two batch calls. Keys are relative to the job (``round``,
``r3/arrivals``...); a backend maps them under its own prefix for the run id.

Contract, for every implementation:
- ``get``/``get_many`` never block: a missing key reads as ``None``.
- ``add`` is atomic and creates the key at 0 when missing; it returns the new value.
- ``compare_set(key, None, v)`` sets only when the key is absent. It returns the
  value now stored and whether this call wrote it.
- ``wait_for`` blocks until every key exists or the timeout passes (a watch, not a
  poll, where the store allows). It returns whether they all exist.
- ``heartbeat``/``read_heartbeats``: a node bumps its own counter; a reader sees the
  counter (or ``None`` once the backend knows the node is gone, e.g. a lease expired).
  ``heartbeat`` raises when this node's liveness is not being kept (the write failed, or
  etcd's lease could not be refreshed), so the node learns it before its peers evict it.
- ``read_counter`` reads an integer key in one request that never blocks (0 when absent).
- ``member_states`` names the store's own members and their states where the job runs them
  (the embedded etcd cluster), None elsewhere: views ask the seam, never the concrete class.
- ``CONF_KEYS``: the ``--rdzv-conf`` keys the backend reads itself (beside the handler's).
- Every method raises ``RendezvousConnectionError`` when the store cannot be
  reached within the backend's read timeout; no third-party error escapes.

torch's ``RendezvousBackend`` is another seam: ``get_state``/``set_state`` of one state blob
that every join and heartbeat rewrites (O(N) bytes per write, compare-and-set retries). The
O(N) protocol cannot run on it, deliberately; :func:`require_backend` turns one away with a
``TypeError`` that names the methods needed here.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import ClosedRecord, read_closed, read_heartbeat

if TYPE_CHECKING:
    from torch.distributed import Store

__all__ = ["RendezvousBackend", "closed_record", "heartbeat_values", "require_backend"]

log = logging.getLogger(__name__)
_warned_garbage: set[str] = set()  # heartbeat keys already warned about (once per process)
_warned_closed: set[bytes] = set()  # bad values of the closed key already warned about
# Keys every job writes early (its first arrival writes the first two), or later for good.
_JOB_KEYS = (
    keys.ROUND,
    keys.arrivals(0),
    keys.CLOSED,
    keys.EPOCH,
    keys.RESTARTS,
    keys.EVENT_COUNT,
)


def heartbeat_values(
    node_ids: Sequence[str], raws: Sequence[bytes | None], where: str
) -> list[int | None]:
    """Turn heartbeat keys as read into counters for a liveness verdict; never raises.

    A value that is not an integer is read as a counter of its own (see
    ``records.read_heartbeat``), with a warning naming the key (once per key): garbage drops
    no node that still beats, and stops no reader.

    Args:
        node_ids: whose heartbeats were read.
        raws: the stored values, None where a key is absent.
        where: the store, for the warning.
    """
    out: list[int | None] = []
    for node_id, raw in zip(node_ids, raws, strict=True):
        value, is_garbage = read_heartbeat(raw)
        if is_garbage and keys.heartbeat(node_id) not in _warned_garbage:
            _warned_garbage.add(keys.heartbeat(node_id))
            log.warning(
                "the heartbeat key '%s' on %s holds %r, not an integer; read as a counter "
                "(the node's next beat overwrites it; said once)",
                keys.heartbeat(node_id),
                where,
                (raw or b"")[:40],
            )
        out.append(value)
    return out


def closed_record(raw: bytes | None, where: str) -> ClosedRecord | None:
    """Turn the ``closed`` key as read into the job's closed record; never raises.

    A value that is not a valid closed record (garbage, a pickle, a reason we do not know)
    closes nothing and stops no reader (see ``records.read_closed``): the job reads as open,
    with a warning naming the key (once per value), until a close replaces it.

    Args:
        raw: the stored value, None when the key is absent.
        where: the store, for the warning.

    Returns:
        The closed record, or None while the job is open.
    """
    record, problem = read_closed(raw)
    if problem is not None and raw is not None and raw not in _warned_closed:
        _warned_closed.add(raw)
        log.warning(
            "%s on %s; the job stays open until a close (elastic-run close, or the job's end) "
            "replaces it (said once)",
            problem,
            where,
        )
    return record


class RendezvousBackend(ABC):
    """A store the dynamic rendezvous handler runs its protocol on."""

    CONF_KEYS: ClassVar[frozenset[str]] = frozenset()

    @property
    @abstractmethod
    def name(self) -> str:
        """The backend name (``c10d``, ``etcd``)."""

    @property
    @abstractmethod
    def endpoint(self) -> str:
        """Where the store is, for messages (``host:port``)."""

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """Return the value of ``key`` or None when absent. Never blocks."""

    @abstractmethod
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Return the values of ``keys`` in order (None for absent ones), in one trip."""

    @abstractmethod
    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``."""

    @abstractmethod
    def set_many(self, items: Mapping[str, bytes]) -> None:
        """Store several values in one trip."""

    @abstractmethod
    def add(self, key: str, delta: int) -> int:
        """Atomically add ``delta`` to the integer at ``key`` (0 when absent); return the result."""

    @abstractmethod
    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> tuple[bytes, bool]:
        """Set ``key`` to ``desired`` if it holds ``expected`` (None: absent).

        Returns:
            The value stored after the call, and whether this call wrote it.
        """

    @abstractmethod
    def wait_for(self, keys: Sequence[str], timeout_s: float) -> bool:
        """Block until all ``keys`` exist or ``timeout_s`` passes; return whether they exist."""

    @abstractmethod
    def heartbeat(self, node_id: str) -> None:
        """Show that ``node_id`` is alive (a counter bump, a lease refresh)."""

    def beat_batch_key(self) -> Hashable | None:
        """What backends whose heartbeats one ``heartbeat_many`` may write share (None: none).

        Two backends with the same key reach the same keys of the same store, so one of them
        may write the other's heartbeats: a process holding many nodes of one job (a benchmark,
        a test) beats them all in one request. None (the default): each node beats for itself.
        """
        return None

    def heartbeat_many(self, node_ids: Sequence[str]) -> None:
        """Show that every one of ``node_ids`` is alive (default: one ``heartbeat`` each).

        Only called with nodes of backends that share this one's ``beat_batch_key``.

        Raises:
            RendezvousError: a heartbeat failed (the ones after it may not have been written).
        """
        for node_id in node_ids:
            self.heartbeat(node_id)

    def heartbeat_before_join(self, node_id: str) -> None:
        """Show that ``node_id`` is alive as it is about to join a round (default: ``heartbeat``).

        A backend whose liveness can lapse unseen (an etcd lease not refreshed within its TTL
        expires on the server a moment later, and the key with it) makes sure here that the
        key stands for the round being joined, rather than report the lapse: the members of
        that round would otherwise judge the node gone right after it arrived.
        """
        self.heartbeat(node_id)

    @abstractmethod
    def read_heartbeats(self, node_ids: Sequence[str]) -> list[int | None]:
        """Return each node's heartbeat counter, None where the node is known gone."""

    def check_reachable(self, timeout_s: float) -> None:  # noqa: B027 - optional hook
        """Make one real request within ``timeout_s``, so a launcher fails fast (no-op here).

        For backends that connect lazily (etcd): a store that cannot be reached, refuses the
        credentials or the TLS files, is said before the agent starts, not after its first
        rendezvous attempt ran out of time. A backend that connects when built needs none.

        Raises:
            RendezvousConnectionError: the store did not answer within ``timeout_s``.
            RendezvousError: the store refused the request (credentials, TLS).
        """

    def forget_node(self, node_id: str) -> None:  # noqa: B027 - optional hook
        """Drop what the backend keeps alive for ``node_id`` (a lease) when it leaves."""

    @abstractmethod
    def round_store(self, prefix: str) -> Store:
        """Return a torch ``Store`` view of the backend under ``prefix``, private to a round."""

    def get_unwaited(self, keys: Sequence[str]) -> list[bytes | None]:
        """Like ``get_many``, for keys nobody waits for while absent, or known to exist.

        A store whose read of a key that may be waited for costs more than one request
        (c10d: three) reads these in one request each. Never blocks.
        """
        return self.get_many(keys)

    def read_counter(self, key: str) -> int:
        """Return the integer at ``key`` (0 when absent) in one request, never blocking.

        Raises:
            RendezvousStateError: the value is not an integer.
        """
        from elastic_run.rendezvous.protocol.records import decode_int

        raw = self.get(key)
        return decode_int(key, raw) if raw is not None else 0

    @property
    def is_hosting(self) -> bool:
        """Whether this process hosts the store (it must outlive the job's other agents)."""
        return False

    def member_states(self) -> Mapping[str, str] | None:
        """The store's own members and their states, for ``status`` and ``close`` (one knock each).

        Returns:
            Each member's client ``host:port`` and its state (``up``, ``down`` or ``silent``),
            in the order the members are listed; None for a store whose members are not the
            job's to show (the default: a c10d store, an external etcd cluster).
        """
        return None

    def exists(self) -> bool:
        """Return whether anything was ever written for this run id (one batch read).

        The job exists when any of its keys does: a deleted or lost ``round`` key does not make
        a running job unknown. A store that can list keys (etcd) counts the job's prefix; the
        default reads the keys every job writes: the round and round 0's arrival count (its
        first arrival), the closed record, the epoch, the restart count, the event count.
        """
        return any(raw is not None for raw in self.get_many(list(_JOB_KEYS)))

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads. Idempotent."""


def require_backend(backend: object) -> RendezvousBackend:
    """Return ``backend`` if the dynamic rendezvous can run on it.

    Args:
        backend: what a caller passed as the backend.

    Returns:
        The backend.

    Raises:
        TypeError: it is not a :class:`RendezvousBackend`; for a torch-style backend (only
            ``get_state``/``set_state``) the message says why and what to implement.
    """
    if isinstance(backend, RendezvousBackend):
        return backend
    needed = ", ".join(sorted(RendezvousBackend.__abstractmethods__))
    kind = type(backend).__name__
    if hasattr(backend, "get_state") and hasattr(backend, "set_state"):
        raise TypeError(
            f"{kind} is a torch-style rendezvous backend (get_state/set_state over one state "
            f"blob); elastic-run's O(N) rendezvous cannot run on a single blob. Subclass "
            f"elastic_run.rendezvous.backend.RendezvousBackend and implement: {needed}"
        )
    raise TypeError(
        f"{kind} is not a RendezvousBackend: subclass "
        f"elastic_run.rendezvous.backend.RendezvousBackend and implement: {needed}"
    )
