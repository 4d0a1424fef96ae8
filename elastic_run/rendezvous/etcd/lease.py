"""Keeping etcd leases alive, and knowing when that failed.

``LeaseKeeper`` is a daemon thread that refreshes every lease it holds each ttl/3 seconds.
For each lease it keeps a ``LeaseRecord``: the monotonic time at which the last refresh that
succeeded was sent (at first: when the grant was sent), the error of the latest refresh, and
whether etcd answered that the lease is gone. ``lease_failure`` judges a record against
``now``; it reads no clock.

Invariants:
- a lease whose last successful refresh was sent less than its TTL ago is alive on the
  server (the server restarts the TTL when it handles the refresh, after it was sent);
- past that, its keys may have vanished for every other client: ``lease_failure`` says so,
  with the latest error as the reason;
- a refresh that fails is retried at the next turn; a lease etcd reports gone is no longer
  refreshed but keeps its record (``is_expired``) until ``remove()``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from elastic_run.rendezvous.errors import RendezvousError

__all__ = [
    "LeaseFailure",
    "LeaseKeeper",
    "LeaseRecord",
    "LeaseRefresher",
    "lease_failure",
    "lease_is_sound",
]

log = logging.getLogger(__name__)


class LeaseRefresher(Protocol):
    """What the keeper needs from a client."""

    def refresh_lease(self, lease_id: int) -> int:
        """Refresh a lease; return its TTL in seconds (0 or less: the lease is gone)."""
        ...


@dataclass(frozen=True)
class LeaseRecord:
    """What the keeper knows of one lease.

    Attributes:
        lease_id: the lease.
        ttl_s: its TTL in seconds, as etcd last reported it.
        refreshed_at_s: monotonic time at which the last successful refresh (or the grant)
            was sent.
        attempted_at_s: monotonic time at which the latest refresh (or the grant) was sent.
        is_pending: the latest refresh has had no answer yet.
        last_error: the error of the latest refresh; None when it succeeded.
        is_expired: etcd answered that the lease is gone (its keys are gone).
    """

    lease_id: int
    ttl_s: int
    refreshed_at_s: float
    attempted_at_s: float
    is_pending: bool = False
    last_error: RendezvousError | None = None
    is_expired: bool = False


@dataclass(frozen=True)
class LeaseFailure:
    """Why a lease's keys may be gone for the other clients.

    Attributes:
        reason: a sentence with the facts.
        is_expired: etcd said the lease is gone (a fresh lease is needed); False when the
            refreshes only failed or went unanswered for longer than the TTL.
    """

    reason: str
    is_expired: bool


def lease_failure(record: LeaseRecord, now_s: float) -> LeaseFailure | None:
    """Judge a lease: None while it is surely alive on the server, else why it may not be.

    Args:
        record: what the keeper recorded for the lease.
        now_s: the current monotonic time.

    Returns:
        None when the last successful refresh was sent less than the TTL ago and etcd has
        not reported the lease gone; a ``LeaseFailure`` otherwise.
    """
    lease = f"etcd lease {record.lease_id:x}"
    if record.is_expired:
        return LeaseFailure(f"{lease} expired", is_expired=True)
    age_s = now_s - record.refreshed_at_s
    if age_s < record.ttl_s:
        return None
    if record.last_error is not None:
        why = f"the last refresh failed: {record.last_error}"
    elif record.is_pending:
        why = f"a refresh sent {now_s - record.attempted_at_s:.1f} s ago has had no answer"
    else:
        why = "no refresh was attempted"
    return LeaseFailure(
        f"{lease} was last refreshed {age_s:.1f} s ago, past its TTL of {record.ttl_s} s ({why})",
        is_expired=False,
    )


def lease_is_sound(record: LeaseRecord, now_s: float) -> bool:
    """Whether a lease will surely outlive the next refresh due: for a node about to join.

    ``lease_failure`` says when a lease's keys may be gone already. A lease it does not judge
    failed can still be doomed: its latest refresh failed, or was sent during a partition and
    waits for its RPC deadline while the keeper can send no other. etcd expires it at its TTL
    after the last refresh it handled, even if the network came back meanwhile. Sound: the
    latest refresh succeeded (or is pending less than a third of the TTL, the keeper's period)
    and the last successful one was sent less than the TTL ago.

    Args:
        record: what the keeper recorded for the lease.
        now_s: the current monotonic time.
    """
    if lease_failure(record, now_s) is not None or record.last_error is not None:
        return False
    return not record.is_pending or now_s - record.attempted_at_s < max(record.ttl_s, 1) / 3.0


class LeaseKeeper:
    """A daemon thread refreshing leases every ttl/3 seconds until ``stop()``.

    Args:
        client: what refreshes a lease (an ``EtcdClient``).
        clock: the monotonic clock the records are stamped with.
    """

    def __init__(self, client: LeaseRefresher, clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._clock = clock
        self._records: dict[int, LeaseRecord] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="etcd-lease-keeper", daemon=True)
        self._thread.start()

    def add(self, lease_id: int, ttl_s: int, granted_at_s: float | None = None) -> None:
        """Start refreshing ``lease_id``.

        Args:
            lease_id: the lease.
            ttl_s: its TTL in seconds.
            granted_at_s: the monotonic time at which its grant was sent (default: now).
        """
        at_s = self._clock() if granted_at_s is None else granted_at_s
        with self._lock:
            self._records[lease_id] = LeaseRecord(lease_id, ttl_s, at_s, at_s)
        self._wake.set()

    def remove(self, lease_id: int) -> None:
        """Stop refreshing ``lease_id`` and forget its record."""
        with self._lock:
            self._records.pop(lease_id, None)

    def record(self, lease_id: int) -> LeaseRecord | None:
        """Return what is known of ``lease_id`` (None when it is not kept)."""
        with self._lock:
            return self._records.get(lease_id)

    def stop(self, join_timeout_s: float = 5.0) -> None:
        """Stop the thread and wait for it at most ``join_timeout_s`` seconds."""
        self._stop.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(join_timeout_s)

    def _update(self, lease_id: int, change: Callable[[LeaseRecord], LeaseRecord]) -> None:
        with self._lock:
            current = self._records.get(lease_id)
            if current is not None:
                self._records[lease_id] = change(current)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._until_due_s())
            self._wake.clear()
            now_s = self._clock()
            with self._lock:
                due = [r.lease_id for r in self._records.values() if _due_at_s(r) <= now_s]
            for lease_id in due:
                if self._stop.is_set():
                    return
                self._refresh(lease_id)

    def _until_due_s(self) -> float:
        """Seconds until the next refresh is due, at most 1 s."""
        with self._lock:
            due_at_s = min(map(_due_at_s, self._records.values()), default=float("inf"))
        return max(0.0, min(1.0, due_at_s - self._clock()))

    def _refresh(self, lease_id: int) -> None:
        with self._lock:
            if lease_id not in self._records:
                return
        sent_at_s = self._clock()
        self._update(lease_id, lambda r: replace(r, attempted_at_s=sent_at_s, is_pending=True))
        try:
            ttl_s = self._client.refresh_lease(lease_id)
        except RendezvousError as exc:
            error = exc
            self._update(lease_id, lambda r: replace(r, last_error=error, is_pending=False))
            log.warning("refreshing etcd lease %x failed: %s", lease_id, error)
            return
        if ttl_s <= 0:
            self._update(
                lease_id, lambda r: replace(r, is_expired=True, last_error=None, is_pending=False)
            )
            log.warning("etcd lease %x expired; its keys are gone", lease_id)
            return
        self._update(
            lease_id,
            lambda r: replace(
                r, ttl_s=ttl_s, refreshed_at_s=sent_at_s, last_error=None, is_pending=False
            ),
        )


def _due_at_s(record: LeaseRecord) -> float:
    """When a lease's next refresh is due: ttl/3 after the latest one was sent; never if expired."""
    if record.is_expired:
        return float("inf")
    return record.attempted_at_s + max(record.ttl_s, 1) / 3.0
