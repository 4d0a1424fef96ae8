"""Keeping etcd leases alive, and knowing when that failed.

``LeaseKeeper`` refreshes the leases of every client of one process and cluster (one keeper
each, ``shared_keeper``): a daemon thread sends each lease's refresh every ttl/3 seconds on one
of a few long-lived LeaseKeepAlive streams (``_STREAMS``), and a reader thread per stream
applies the replies. A process of 256
nodes used to run 256 keeper threads, each opening a stream (and gRPC a sender thread) per
refresh: at 1,024 nodes in 4 processes their refreshes came too late, and most leases expired
during the round (issue 38). For each lease the keeper keeps a ``LeaseRecord``: the monotonic
time at which the last refresh that succeeded was sent (at first: when the grant was sent), the
error of the latest refresh, and whether etcd answered that the lease is gone.
``lease_failure`` judges a record against ``now``; it reads no clock.

Invariants:
- a lease whose last successful refresh was sent less than its TTL ago is alive on the
  server (the server restarts the TTL when it handles the refresh, after it was sent);
- past that, its keys may have vanished for every other client: ``lease_failure`` says so,
  with the latest error as the reason;
- a refresh that fails (its stream broke, or it went unanswered for two thirds of its TTL, or
  the RPC deadline) is sent again on a fresh stream after a short pause; a lease etcd reports
  gone (a reply of TTL 0) is no longer refreshed but keeps its record (``is_expired``) until
  ``remove()``;
- a client that closes takes its leases out of the keeper (they expire after their TTL, as a
  crashed node's do); the others' leases go on being refreshed; the keeper (its threads, its
  stream and its connection) stops with the last client of the process that used it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import grpc
import pyetcd

from elastic_run.rendezvous.errors import RendezvousError
from elastic_run.rendezvous.etcd.connection import (
    ConnectionOptions,
    EtcdConnection,
    Shared,
    cluster_key,
)
from elastic_run.rendezvous.etcd.errors import is_unreachable, status_of
from elastic_run.rendezvous.etcd.leader_watch import WATCH

__all__ = [
    "LeaseFailure",
    "LeaseKeeper",
    "LeaseRecord",
    "lease_failure",
    "lease_is_sound",
    "release_keeper",
    "shared_keeper",
]

log = logging.getLogger(__name__)

# A refresh that failed is sent again this soon (not a third of the TTL later).
_RETRY_S = 0.25
# The longest pause between two streams that failed in a row.
_MAX_PAUSE_S = 1.0
# The keep-alive streams of a keeper (a lease goes on stream ``lease id % _STREAMS``). etcd
# handles one stream's refreshes one after another, and a member that is not the leader
# forwards each to the leader (an HTTP request): 256 leases on one stream of a loaded follower
# came back too late, and some expired (1,024 nodes in 4 processes on 2 loaded cores).
_STREAMS = 8


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


class _Stream:
    """One LeaseKeepAlive stream: requests go in through a queue, replies come back to a reader
    thread. ``sent`` maps each lease refreshed on it and not answered yet to when that was sent
    (under the keeper's lock)."""

    def __init__(
        self, shard: int, raw: Any, call: Any, requests: queue.Queue[Any], endpoint: str
    ) -> None:
        self.shard = shard
        self.raw = raw
        self.call = call
        self.requests = requests
        self.endpoint = endpoint
        self.sent: dict[int, float] = {}
        self.watch_token: int | None = None
        self.closed = False
        self.error: RendezvousError | None = None  # why it failed

    def close(self) -> None:
        """End the request stream and cancel the call (the reader then stops)."""
        self.closed = True
        self.requests.put(None)
        try:
            self.call.cancel()
        except Exception as exc:  # a broken channel may fail to cancel; it is gone either way
            log.debug("cancelling the etcd keep-alive stream failed: %s", exc)


def _requests_of(requests: queue.Queue[Any]) -> Iterator[Any]:
    """The request iterator gRPC's sender thread consumes: every queued request, until None."""
    while True:
        item = requests.get()
        if item is None:
            return
        yield item


class LeaseKeeper:
    """One daemon thread refreshing, over a few long-lived keep-alive streams, every lease of the
    clients of one process and cluster, each every ttl/3 seconds, until ``stop()``.

    The stream runs on a connection of its own (``conn``), with the failover of any call: a
    stream that fails (the member went, the leader watch closed its client, a refresh was not
    answered within two thirds of its TTL or the RPC deadline) fails the refreshes waiting on
    it, each of which is sent again on a fresh stream (of the next member when the member could
    not be reached) after a short pause.

    Args:
        conn: the connection the stream runs on (closed by ``stop()``).
        clock: the monotonic clock the records are stamped with.
    """

    def __init__(self, conn: EtcdConnection, clock: Callable[[], float] = time.monotonic) -> None:
        self._conn = conn
        self._clock = clock
        self._records: dict[int, LeaseRecord] = {}
        self._owners: dict[int, object] = {}  # lease -> the client that keeps it
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._streams: dict[int, _Stream] = {}  # shard (lease id % _STREAMS) -> its stream
        self._open_after_s = 0.0  # no new stream before (a pause after a failed one)
        self._pause_s = 0.0
        self._thread = threading.Thread(target=self._run, name="etcd-lease-keeper", daemon=True)
        self._thread.start()

    @property
    def is_stopped(self) -> bool:
        """Whether ``stop()`` was called."""
        return self._stop.is_set()

    def add(
        self, lease_id: int, ttl_s: int, granted_at_s: float | None = None, owner: object = None
    ) -> None:
        """Start refreshing ``lease_id``.

        Args:
            lease_id: the lease.
            ttl_s: its TTL in seconds.
            granted_at_s: the monotonic time at which its grant was sent (default: now).
            owner: the client that keeps it (``remove_owner`` forgets its leases).
        """
        at_s = self._clock() if granted_at_s is None else granted_at_s
        with self._lock:
            self._records[lease_id] = LeaseRecord(lease_id, ttl_s, at_s, at_s)
            self._owners[lease_id] = owner
        self._wake.set()

    def remove(self, lease_id: int) -> None:
        """Stop refreshing ``lease_id`` and forget its record."""
        with self._lock:
            self._records.pop(lease_id, None)
            self._owners.pop(lease_id, None)

    def remove_owner(self, owner: object) -> None:
        """Stop refreshing every lease ``owner`` added (a client closes: they expire)."""
        with self._lock:
            for lease_id in [k for k, o in self._owners.items() if o is owner]:
                self._records.pop(lease_id, None)
                self._owners.pop(lease_id, None)

    def record(self, lease_id: int) -> LeaseRecord | None:
        """Return what is known of ``lease_id`` (None when it is not kept)."""
        with self._lock:
            return self._records.get(lease_id)

    def stop(self, join_timeout_s: float = 5.0) -> None:
        """Stop the thread, end the stream and close the connection (bounded join)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(join_timeout_s)
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for stream in streams:
            self._leave_watch(stream)
            stream.close()
        self._conn.close()

    # -- the keeper's thread -----------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._until_due_s())
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._turn(self._clock())
            except Exception:  # noqa: BLE001 - the keeper must outlive any one turn
                log.exception("a turn of the etcd lease keeper failed")

    def _answer_limit_s(self, record: LeaseRecord) -> float:
        """How long a refresh may go unanswered before its stream is judged dead."""
        return min(self._conn.rpc_timeout_s(None), max(record.ttl_s, 1) * 2.0 / 3.0)

    def _until_due_s(self) -> float:
        """Seconds until the next refresh (or the next unanswered one's limit), at most 1 s."""
        with self._lock:
            at_s = [
                r.attempted_at_s + self._answer_limit_s(r) if r.is_pending else _due_at_s(r)
                for r in self._records.values()
            ]
        return max(0.0, min(1.0, min(at_s, default=float("inf")) - self._clock()))

    def _turn(self, now_s: float) -> None:
        with self._lock:
            late: list[tuple[_Stream, int, float]] = []
            for stream in self._streams.values():
                waits = [
                    now_s - sent_s
                    for lease_id, sent_s in stream.sent.items()
                    if (r := self._records.get(lease_id)) is not None
                    and now_s - sent_s >= self._answer_limit_s(r)
                ]
                if waits:
                    late.append((stream, len(waits), max(waits)))
        for stream, count, waited_s in late:
            error = RendezvousError(
                f"etcd {stream.endpoint} cannot be reached to refresh a lease: "
                f"{count} refresh(es) unanswered after {waited_s:.1f} s"
            )
            self._fail(stream, error, rotate=True)
        with self._lock:
            due = [
                r.lease_id
                for r in self._records.values()
                if not r.is_pending and _due_at_s(r) <= now_s
            ]
        if not due or now_s < self._open_after_s:
            return
        shards: dict[int, list[int]] = {}
        for lease_id in due:
            shards.setdefault(lease_id % _STREAMS, []).append(lease_id)
        for shard, leases in shards.items():
            self._send(shard, leases, now_s)

    def _send(self, shard: int, due: list[int], now_s: float) -> None:
        """Send the refreshes of ``due`` on the stream of ``shard`` (opened when there is none)."""
        try:
            stream = self._open(shard)
        except RendezvousError as exc:
            error = exc
            with self._lock:
                for lease_id in due:
                    self._set(
                        lease_id, lambda r: replace(r, attempted_at_s=now_s, last_error=error)
                    )
                self._pause_after_failure(now_s)
            log.warning("refreshing %d etcd lease(s) failed: %s", len(due), error)
            return
        sent_at_s = self._clock()
        with self._lock:
            if self._streams.get(shard) is not stream:  # it failed before a refresh went out
                failed = stream.error or RendezvousError("the keep-alive stream ended")
                for lease_id in due:
                    self._set(
                        lease_id, lambda r: replace(r, attempted_at_s=sent_at_s, last_error=failed)
                    )
                return  # the next turn opens another
            first = not stream.sent
            for lease_id in due:
                if lease_id in self._records:
                    self._set(
                        lease_id, lambda r: replace(r, attempted_at_s=sent_at_s, is_pending=True)
                    )
                    stream.sent[lease_id] = sent_at_s
                    stream.requests.put(pyetcd.etcdrpc.LeaseKeepAliveRequest(ID=lease_id))
            if first and stream.sent:  # the leader watch looks at the stream while it waits
                stream.watch_token = WATCH.enter(self._conn, stream.raw, "refresh leases", 0)

    def _set(self, lease_id: int, change: Callable[[LeaseRecord], LeaseRecord]) -> None:
        """Change a record (under ``_lock``) if it is still kept."""
        current = self._records.get(lease_id)
        if current is not None:
            self._records[lease_id] = change(current)

    def _pause_after_failure(self, now_s: float) -> None:
        """No new stream for a while (doubling, at most ``_MAX_PAUSE_S``; under ``_lock``)."""
        self._pause_s = min(_MAX_PAUSE_S, max(_RETRY_S, self._pause_s * 2))
        self._open_after_s = now_s + self._pause_s

    def _open(self, shard: int) -> _Stream:
        """The stream of ``shard``, opened now when there is none (with the connection's
        failover)."""
        with self._lock:
            if shard in self._streams:
                return self._streams[shard]
        requests: queue.Queue[Any] = queue.Queue()

        def open_stream(raw: Any) -> tuple[Any, Any]:
            call = raw.leasestub.LeaseKeepAlive(
                _requests_of(requests), credentials=raw.call_credentials, metadata=raw.metadata
            )
            return raw, call

        raw, call = self._conn.call("keep leases alive", open_stream)
        stream = _Stream(shard, raw, call, requests, self._conn.endpoint)
        with self._lock:
            self._streams[shard] = stream
        threading.Thread(
            target=self._read, args=(stream,), name="etcd-lease-replies", daemon=True
        ).start()
        return stream

    def _read(self, stream: _Stream) -> None:
        """The stream's reader thread: apply each reply; on its end, fail the stream."""
        try:
            for reply in stream.call:
                self._on_reply(stream, int(reply.ID), int(reply.TTL))
            error = RendezvousError(f"etcd {stream.endpoint} ended the lease keep-alive stream")
            unreachable = False
        except (grpc.RpcError, ValueError) as exc:
            if stream.closed or self._stop.is_set():
                return
            code, reason = status_of(exc)
            unreachable = is_unreachable(code, exc, reason)
            what = "cannot be reached to" if unreachable else "refused to"
            error = RendezvousError(f"etcd {stream.endpoint} {what} refresh a lease: {reason}")
        except Exception as exc:  # noqa: BLE001 - reported on the leases, the keeper goes on
            error = RendezvousError(f"the etcd lease keep-alive stream failed: {exc!r}")
            unreachable = False
        self._fail(stream, error, rotate=unreachable)

    def _on_reply(self, stream: _Stream, lease_id: int, ttl_s: int) -> None:
        expired = False
        with self._lock:
            sent_at_s = stream.sent.pop(lease_id, None)
            if sent_at_s is None:
                return  # a reply to a refresh failed meanwhile, or of a lease removed
            self._pause_s = 0.0
            if ttl_s <= 0:
                expired = lease_id in self._records
                self._set(
                    lease_id,
                    lambda r: replace(r, is_expired=True, last_error=None, is_pending=False),
                )
            else:
                self._set(
                    lease_id,
                    lambda r: replace(
                        r, ttl_s=ttl_s, refreshed_at_s=sent_at_s, last_error=None, is_pending=False
                    ),
                )
            answered = not stream.sent
        # The keeper slept until the refresh's answer limit (or 1 s): it now schedules the
        # lease's next refresh ttl/3 after this one was sent, not a whole second later.
        self._wake.set()
        if answered:
            self._leave_watch(stream)
        if expired:
            log.warning("etcd lease %x expired; its keys are gone", lease_id)

    def _fail(self, stream: _Stream, error: RendezvousError, *, rotate: bool) -> None:
        """The stream is dead: fail its unanswered refreshes, drop it, pause, open another."""
        with self._lock:
            if self._streams.get(stream.shard) is stream:
                del self._streams[stream.shard]
            stream.error = stream.error or error
            failed = list(stream.sent)
            stream.sent.clear()
            for lease_id in failed:
                self._set(lease_id, lambda r: replace(r, last_error=error, is_pending=False))
            self._pause_after_failure(self._clock())
        self._leave_watch(stream)
        stream.close()
        self._conn.drop(stream.raw, rotate=rotate)
        if failed:
            log.warning("refreshing %d etcd lease(s) failed: %s", len(failed), error)
        self._wake.set()

    def _leave_watch(self, stream: _Stream) -> None:
        with self._lock:
            token, stream.watch_token = stream.watch_token, None
        if token is not None:
            WATCH.leave(token)


# Each process's keepers, one per cluster and connection settings.
_KEEPERS: Shared[LeaseKeeper] = Shared(
    lambda key: LeaseKeeper(EtcdConnection(key[1], **dict(key[2]))), LeaseKeeper.stop
)


def shared_keeper(
    endpoints: Sequence[tuple[str, int]], options: ConnectionOptions, user: object
) -> LeaseKeeper:
    """The keeper of this process for the cluster at ``endpoints``, started on first use.

    Every client of the process with the same endpoints and connection settings shares it
    (one thread, one stream, one connection), until the last of them ``release_keeper``s it.

    Args:
        endpoints: the cluster's members, as the client lists them.
        options: the client's connection settings (the keeper's connection gets the same).
        user: the client (it then holds the keeper until ``release_keeper``).
    """
    return _KEEPERS.acquire(cluster_key(endpoints, options), user)


def release_keeper(keeper: LeaseKeeper, user: object) -> None:
    """``user`` (a client closing) no longer keeps leases: its own stop being refreshed (they
    expire after their TTL), and the keeper stops once no client of the process uses it."""
    keeper.remove_owner(user)
    _KEEPERS.release(keeper, user)


def _due_at_s(record: LeaseRecord) -> float:
    """When a lease's next refresh is due: ttl/3 after the latest one was sent, ``_RETRY_S``
    after it when that one failed; never if expired."""
    if record.is_expired:
        return float("inf")
    period_s = max(record.ttl_s, 1) / 3.0
    if record.last_error is not None:
        period_s = min(period_s, _RETRY_S)
    return record.attempted_at_s + period_s
