"""EtcdClient: the typed etcd v3 operations elastic-run uses, over the untyped ``pyetcd``.

Everything above the adapter talks to etcd through this class only: reads (one key, many
keys as of one revision, a prefix), writes (plain, batched, compare-and-set on a value or a
revision), counters (see ``etcd_counter``), leases kept alive by the ``LeaseKeeper`` that
the process's clients of one cluster share, and watches (see ``etcd_watch``). Failover,
re-authentication and error translation happen in ``EtcdConnection.call``, which every
operation goes through (via ``EtcdClient.call``).

Invariants: no ``grpc`` or ``pyetcd`` error escapes; an unreachable store raises
``RendezvousConnectionError`` (with the endpoints and the reason); a refused request raises
``RendezvousError``, ``EtcdLeaseNotFoundError`` when the lease it named is gone; a batch
larger than ``MAX_TXN_OPS`` is split, each part one transaction.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pyetcd
from typing_extensions import Unpack

from elastic_run.rendezvous.endpoints import parse_endpoints
from elastic_run.rendezvous.errors import RendezvousConnectionError
from elastic_run.rendezvous.etcd.connection import ConnectionOptions, EtcdConnection
from elastic_run.rendezvous.etcd.counter import add_by_swap, add_one, add_one_leased, counter_value
from elastic_run.rendezvous.etcd.errors import EtcdLeaseNotFoundError
from elastic_run.rendezvous.etcd.kv import (
    KeyValue,
    WatchEvent,
    kv_from_meta,
    kv_from_proto,
    range_request,
)
from elastic_run.rendezvous.etcd.lease import (
    LeaseFailure,
    LeaseKeeper,
    lease_failure,
    lease_is_sound,
    release_keeper,
    shared_keeper,
)
from elastic_run.rendezvous.etcd.watch import WatchHub, release_hub, shared_hub

__all__ = ["MAX_TXN_OPS", "EtcdClient"]

T = TypeVar("T")

# etcd's default --max-txn-ops: a bigger transaction is refused ("too many operations").
MAX_TXN_OPS = 128


class EtcdClient:
    """A typed etcd v3 client with failover, re-authentication and error translation.

    Args:
        endpoints: ``host:port`` strings (one or several members of one cluster).
        protocol, ca_cert, cert, key, user, password, timeout_s, retry_window_s: the
            connection's settings, as :class:`EtcdConnection` takes them.

    Raises:
        ConfigurationError: when an endpoint, the TLS or the credential settings are wrong.
    """

    def __init__(self, endpoints: Sequence[str], **options: Unpack[ConnectionOptions]) -> None:
        self._members = parse_endpoints(",".join(endpoints))
        self._options = options
        self._conn = EtcdConnection(self._members, **options)
        self._keeper: LeaseKeeper | None = None
        self._hub: WatchHub | None = None  # the process's watches of this cluster
        self._keeper_lock = threading.Lock()
        self._closed = False

    @property
    def endpoint(self) -> str:
        """The endpoint in use (``host:port``)."""
        return self._conn.endpoint

    @property
    def endpoints(self) -> list[str]:
        """All configured endpoints."""
        return self._conn.endpoints

    @property
    def timeout_s(self) -> float:
        """The deadline of one RPC."""
        return self._conn.timeout_s

    def rpc_timeout_s(self, deadline_s: float | None) -> float:
        """The deadline to give one RPC: ``timeout_s``, cut to what is left until ``deadline_s``."""
        return self._conn.rpc_timeout_s(deadline_s)

    def call(self, what: str, fn: Callable[[Any], T], *, deadline_s: float | None = None) -> T:
        """Run ``fn(raw_client)`` with failover, re-authentication and error translation.

        Every operation of this class goes through here (see ``EtcdConnection.call``).

        Args:
            what: a few words for error messages (``get 'round'``).
            fn: the operation on the raw pyetcd client; it may be retried.
            deadline_s: a monotonic time by which to give up (default: the retry window).

        Returns:
            What ``fn`` returned.

        Raises:
            RendezvousConnectionError: when no endpoint answered in time.
            RendezvousError: when etcd refused the request (credentials, TLS, permission).
        """
        return self._conn.call(what, fn, deadline_s=deadline_s)

    def close(self) -> None:
        """Stop refreshing this client's leases and close the connection. Idempotent.

        The leases of the other clients that share the process's keeper are kept alive."""
        with self._keeper_lock:
            self._closed = True
            keeper, self._keeper = self._keeper, None
            hub, self._hub = self._hub, None
        if keeper is not None:
            release_keeper(keeper, self)
        if hub is not None:
            release_hub(hub, self)
        self._conn.close()

    # -- key-value ---------------------------------------------------------------------

    def status_revision(self) -> int:
        """Return the current revision of the store (a real request: a health check)."""
        resp = self.call("read the revision", lambda c: c.get_response("\0", limit=1))
        return int(resp.header.revision)

    def get(self, key: str) -> KeyValue | None:
        """Return ``key`` or None when absent."""
        return self.get_with_revision(key)[0]

    def get_with_revision(self, key: str) -> tuple[KeyValue | None, int]:
        """Return ``key`` (None when absent) and the store revision of the read."""
        resp = self.call(f"get '{key}'", lambda c: c.get_response(key))
        revision = int(resp.header.revision)
        if resp.count < 1:
            return None, revision
        return kv_from_proto(resp.kvs[0]), revision

    def get_many(self, keys: Sequence[str]) -> tuple[list[KeyValue | None], int]:
        """Read ``keys`` as of one revision; return them in order (None when absent) and it.

        One transaction per ``MAX_TXN_OPS`` keys (etcd refuses bigger ones by default); the
        later ones read at the first one's revision, so the whole answer is one snapshot.
        """
        if not keys:
            return [], self.status_revision()
        result: list[KeyValue | None] = []
        revision: int | None = None
        for start in range(0, len(keys), MAX_TXN_OPS):
            chunk = keys[start : start + MAX_TXN_OPS]
            found, revision = self._get_chunk(chunk, revision, len(keys))
            result += found
        assert revision is not None
        return result, revision

    def _get_chunk(
        self, keys: Sequence[str], revision: int | None, total: int
    ) -> tuple[list[KeyValue | None], int]:
        def op(c: Any) -> tuple[list[Any], int]:
            resp = c.kvstub.Txn(
                pyetcd.etcdrpc.TxnRequest(
                    success=[
                        pyetcd.etcdrpc.RequestOp(
                            request_range=range_request(k, revision=revision or 0)
                        )
                        for k in keys
                    ]
                ),
                c.timeout,
                credentials=c.call_credentials,
                metadata=c.metadata,
            )
            return list(resp.responses), int(resp.header.revision)

        responses, read_at = self.call(f"get {total} keys", op)
        result: list[KeyValue | None] = []
        for r in responses:
            kvs = r.response_range.kvs
            result.append(kv_from_proto(kvs[0]) if kvs else None)
        return result, read_at if revision is None else revision

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Return every key under ``prefix`` (sorted by key) and the revision of the read."""
        resp = self.call(f"list '{prefix}'", lambda c: c.get_prefix_response(prefix))
        return [kv_from_proto(kv) for kv in resp.kvs], int(resp.header.revision)

    def count_prefix(self, prefix: str) -> int:
        """Return how many keys exist under ``prefix``."""
        resp = self.call(
            f"count '{prefix}'", lambda c: c.get_prefix_response(prefix, count_only=True)
        )
        return int(resp.count)

    def put(self, key: str, value: bytes, lease_id: int | None = None) -> int:
        """Store ``value`` under ``key`` (bound to ``lease_id`` when given); return the revision."""
        resp = self.call(f"put '{key}'", lambda c: c.put(key, value, lease=lease_id))
        return int(resp.header.revision)

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Store several values, ``MAX_TXN_OPS`` to a transaction (each one atomic)."""

        def put_chunk(chunk: Sequence[tuple[str, bytes]]) -> Callable[[Any], Any]:
            return lambda c: c.transaction(
                compare=[], success=[c.transactions.put(k, v) for k, v in chunk], failure=[]
            )

        for start in range(0, len(items), MAX_TXN_OPS):
            self.call(f"put {len(items)} keys", put_chunk(items[start : start + MAX_TXN_OPS]))

    def delete(self, key: str) -> bool:
        """Delete ``key``; return whether it existed."""
        return bool(self.call(f"delete '{key}'", lambda c: c.delete(key)))

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix``; return how many were deleted."""
        resp = self.call(f"delete '{prefix}*'", lambda c: c.delete_prefix(prefix))
        return int(resp.deleted)

    def create_if_absent(
        self, key: str, value: bytes, lease_id: int | None = None
    ) -> tuple[bool, KeyValue]:
        """Create ``key`` only when absent, in one transaction.

        Returns:
            Whether this call created it, and the key as stored after the call.
        """
        return self.put_if_mod_revision(key, 0, value, lease_id)

    def put_if_mod_revision(
        self, key: str, mod_revision: int, value: bytes, lease_id: int | None = None
    ) -> tuple[bool, KeyValue]:
        """Put ``value`` if ``key`` is still at ``mod_revision`` (0: absent), in one transaction.

        Returns:
            Whether this call wrote it, and the key as stored after the call.
        """

        def op(c: Any) -> tuple[bool, list[Any]]:
            compare = (
                c.transactions.create(key) == 0
                if mod_revision == 0
                else c.transactions.mod(key) == mod_revision
            )
            return c.transaction(  # type: ignore[no-any-return]
                compare=[compare],
                success=[c.transactions.put(key, value, lease=lease_id), c.transactions.get(key)],
                failure=[c.transactions.get(key)],
            )

        succeeded, responses = self.call(f"compare-and-set '{key}'", op)
        ranges = [r for r in responses if isinstance(r, list)]
        current = kv_from_meta(*ranges[-1][0]) if ranges and ranges[-1] else None
        if current is None:
            # Deleted between the compare and the read: report what we know.
            current = KeyValue(key, value if succeeded else b"", 0, 0, lease_id or 0)
        return bool(succeeded), current

    def compare_and_swap(
        self, key: str, expected: bytes | None, desired: bytes
    ) -> tuple[bool, KeyValue | None]:
        """Set ``key`` to ``desired`` if it holds ``expected`` (None: absent).

        Returns:
            Whether this call wrote it, and the key as stored after the call (None if absent).
        """

        def op(c: Any) -> tuple[bool, list[Any]]:
            compare = (
                c.transactions.create(key) == 0
                if expected is None
                else c.transactions.value(key) == expected
            )
            return c.transaction(  # type: ignore[no-any-return]
                compare=[compare],
                success=[c.transactions.put(key, desired), c.transactions.get(key)],
                failure=[c.transactions.get(key)],
            )

        succeeded, responses = self.call(f"compare-and-set '{key}'", op)
        ranges = [r for r in responses if isinstance(r, list)]
        current = kv_from_meta(*ranges[-1][0]) if ranges and ranges[-1] else None
        return bool(succeeded), current

    # -- counters (see etcd_counter) ---------------------------------------------------

    def atomic_add(self, key: str, delta: int, lease_id: int | None = None) -> int:
        """Add ``delta`` to the ASCII integer at ``key`` (0 when absent); return the result.

        A compare-and-swap loop on the key's mod revision: correct under any concurrency.
        A key bound to a lease keeps it (``lease_id`` binds it to another).

        Raises:
            RendezvousError: when the key holds something other than an integer.
        """
        return add_by_swap(self, key, delta, lease_id, as_counter=False)

    def counter_add(self, key: str, delta: int) -> int:
        """Add ``delta`` to the counter at ``key`` (0 when absent); return the result.

        Adding 1 is one transaction that cannot lose a race (see ``etcd_counter``): N nodes
        arriving at once cost N transactions, where a compare-and-swap loop costs O(N²)
        retries. Other deltas (and a key that holds a plain integer) take a compare-and-swap
        on the mod revision.

        Raises:
            RendezvousError: when the key holds something other than a counter or an integer.
        """
        if delta == 1:
            value = counter_value(add_one(self, key))
            if value is not None:
                return value
        return add_by_swap(self, key, delta, None, as_counter=True)

    def bump_leased_counter(
        self, key: str, lease_id: int, *, deadline_s: float | None = None
    ) -> int:
        """Add 1 to the counter at ``key`` and keep it bound to ``lease_id``: one transaction.

        When ``key`` is bound to ``lease_id`` its value and lease are kept (the version counts
        up); otherwise (absent, or bound to another lease or none) it is written anew as a
        counter at 1 bound to ``lease_id``.

        Args:
            key: the counter's key.
            lease_id: the lease to bind it to.
            deadline_s: a monotonic time by which to give up.

        Returns:
            The counter's value after the call.

        Raises:
            EtcdLeaseNotFoundError: when etcd no longer knows ``lease_id``.
            RendezvousConnectionError: when etcd does not answer by the deadline.
        """
        return add_one_leased(self, key, lease_id, deadline_s)

    # -- leases ------------------------------------------------------------------------

    def grant_lease(self, ttl_s: int, *, deadline_s: float | None = None) -> int:
        """Grant a lease of ``ttl_s`` seconds; return its id.

        Args:
            ttl_s: the TTL to ask for.
            deadline_s: a monotonic time by which to give up.
        """
        request = pyetcd.etcdrpc.LeaseGrantRequest(TTL=ttl_s, ID=0)

        def op(c: Any) -> Any:
            return c.leasestub.LeaseGrant(
                request,
                self.rpc_timeout_s(deadline_s),
                credentials=c.call_credentials,
                metadata=c.metadata,
            )

        resp = self.call("grant a lease", op, deadline_s=deadline_s)
        return int(resp.ID)

    def refresh_lease(self, lease_id: int) -> int:
        """Refresh a lease; return its remaining TTL in seconds (0 or less: the lease is gone)."""
        responses = self.call("refresh a lease", lambda c: list(c.refresh_lease(lease_id)))
        return int(responses[0].TTL) if responses else 0

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease: every key bound to it disappears now. A lease already gone is fine."""
        try:
            self.call("revoke a lease", lambda c: c.revoke_lease(lease_id))
        except EtcdLeaseNotFoundError:
            pass  # expired or revoked already: what was asked for is done

    def keep_alive(self, lease_id: int, ttl_s: int, granted_at_s: float | None = None) -> None:
        """Refresh ``lease_id`` every ``ttl_s / 3`` seconds, from the keeper this process's
        clients of this cluster share (``etcd_lease.shared_keeper``).

        Args:
            lease_id: the lease.
            ttl_s: its TTL.
            granted_at_s: the monotonic time at which its grant was sent (default: now).

        Raises:
            RendezvousConnectionError: the client is closed.
        """
        with self._keeper_lock:
            if self._closed:
                raise RendezvousConnectionError(f"the etcd client of {self.endpoint} is closed")
            if self._keeper is None:
                self._keeper = shared_keeper(self._members, self._options, self)
            keeper = self._keeper
        keeper.add(lease_id, ttl_s, granted_at_s, owner=self)

    def stop_keep_alive(self, lease_id: int) -> None:
        """Stop refreshing ``lease_id`` (it then expires after its TTL)."""
        if self._keeper is not None:
            self._keeper.remove(lease_id)

    def lease_failure(self, lease_id: int) -> LeaseFailure | None:
        """Why the keys of a kept lease may be gone for other clients; None while it is alive.

        See ``etcd_lease.lease_failure``; None too for a lease this client does not keep.
        """
        record = self._keeper.record(lease_id) if self._keeper is not None else None
        return lease_failure(record, time.monotonic()) if record is not None else None

    def lease_is_sound(self, lease_id: int) -> bool:
        """Whether a kept lease will surely outlive its next refresh (``etcd_lease``); False too
        for a lease this client does not keep."""
        record = self._keeper.record(lease_id) if self._keeper is not None else None
        return record is not None and lease_is_sound(record, time.monotonic())

    # -- watches -----------------------------------------------------------------------

    def watch(
        self, key: str, *, prefix: bool = False, start_revision: int, timeout_s: float
    ) -> list[WatchEvent]:
        """Wait for the first changes of ``key`` (or keys under it) at or after ``start_revision``.

        The callers of the process's clients of this cluster share the watches of one
        connection (``etcd_watch.WatchHub``). The watch survives a server restart or a
        failover (see ``etcd_watch``). It waits at
        most the RPC deadline (``timeout_s`` of the client) at a time: a member that stops
        answering without closing its connections (frozen, partitioned away) never breaks
        the stream, and a watch held there would miss every change made through the other
        members until the caller's timeout. The caller re-reads after an empty return; that
        read fails over from such a member within its own deadline.

        Args:
            key: the key, or the prefix when ``prefix`` is true.
            prefix: whether to watch every key under ``key``.
            start_revision: the first revision of interest (the read's revision + 1).
            timeout_s: how long to wait (at most ``self.timeout_s`` is waited).

        Returns:
            The events of the first batch, or an empty list on timeout (or when the
            revision was compacted: the caller re-reads in either case).

        Raises:
            RendezvousConnectionError: when no endpoint answers within the retry window.
        """
        with self._keeper_lock:
            if self._closed:
                raise RendezvousConnectionError(f"the etcd client of {self.endpoint} is closed")
            if self._hub is None:
                self._hub = shared_hub(self._members, self._options, self)
            hub = self._hub
        return hub.wait(
            key,
            prefix=prefix,
            start_revision=start_revision,
            timeout_s=min(timeout_s, self.timeout_s),
            user=self,
        )
