"""A small typed adapter over the untyped ``pyetcd`` client (etcd v3 over gRPC).

Everything above this module talks to etcd through :class:`EtcdClient` only; no
``grpc`` or ``pyetcd`` error escapes it. What it adds to the raw client:

- failover across several endpoints: a connection failure moves to the next
  endpoint and the call is retried until ``retry_window_s`` has passed;
- re-authentication: an expired auth token (UNAUTHENTICATED after an idle spell)
  rebuilds the client and retries once;
- watches that survive a server restart: a broken watch stream is re-created
  from the last seen revision + 1;
- a daemon thread that keeps leases alive (every ttl/3) with ``stop()`` and a
  bounded join.

Invariants: an unreachable store raises :class:`RendezvousConnectionError` (with the
endpoint and the reason); rejected credentials or an untrusted certificate raise
:class:`RendezvousError` with one line; a bad local file raises ``ConfigurationError``.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

# The agent spawns workers with fork + exec, and sets their parent-death signal in between.
# gRPC's fork handlers would run in that child and abort it (epoll on a closed descriptor):
# the agent never uses gRPC across a fork, so they are turned off before gRPC loads.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # noqa: E402
import pyetcd  # noqa: E402
import pyetcd.exceptions as etcd_exc  # noqa: E402

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.errors import RendezvousConnectionError, RendezvousError

__all__ = ["EtcdClient", "KeyValue", "LeaseKeeper", "WatchEvent", "parse_endpoints"]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PORT = 2379

# Keep gRPC from backing off for minutes after a server restart.
_GRPC_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

# etcd's default --max-txn-ops: a bigger transaction is refused ("too many operations").
MAX_TXN_OPS = 128
_RETRYABLE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
_TLS_MARKERS = ("handshake", "ssl", "certificate", "tls")


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd stores it."""

    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease_id: int
    version: int = 0  # puts since the key was created (1 after the first)


_COUNTER_PREFIX = b'{"counter_base":'


def encode_counter(base: int) -> bytes:
    """The stored form of a counter whose value is ``base`` at version 1 (readable JSON)."""
    return _COUNTER_PREFIX + str(base).encode() + b"}"


def counter_value(kv: KeyValue) -> int | None:
    """The value of a counter written by ``EtcdClient.counter_add``; None for anything else."""
    if not kv.value.startswith(_COUNTER_PREFIX) or not kv.value.endswith(b"}"):
        return None
    try:
        base = int(kv.value[len(_COUNTER_PREFIX) : -1].decode())
    except (UnicodeDecodeError, ValueError):
        return None
    return base + kv.version - 1


def _stored_count(key: str, kv: KeyValue | None) -> int:
    """The count at a key: 0 when absent, a counter's value, or a plain ASCII integer.

    Raises:
        RendezvousError: when the key holds anything else.
    """
    if kv is None:
        return 0
    counted = counter_value(kv)
    if counted is not None:
        return counted
    try:
        return int(kv.value.decode() or "0")
    except (UnicodeDecodeError, ValueError):
        raise RendezvousError(
            f"etcd key '{key}' holds {kv.value[:40]!r}, not a counter or an integer"
        ) from None


@dataclass(frozen=True)
class WatchEvent:
    """A change seen by a watch: a put (``is_delete`` False) or a delete."""

    key: str
    value: bytes
    mod_revision: int
    is_delete: bool


def parse_endpoints(endpoint: str, default_port: int = DEFAULT_PORT) -> list[tuple[str, int]]:
    """Parse ``host[:port][,host[:port]...]`` into ``(host, port)`` pairs.

    Args:
        endpoint: one or several comma-separated endpoints; a scheme prefix is ignored.
        default_port: the port of an endpoint that names none.

    Returns:
        The endpoints in the order given.

    Raises:
        ConfigurationError: when the string is empty or a port is not a number.
    """
    result: list[tuple[str, int]] = []
    for raw in endpoint.split(","):
        part = raw.strip()
        if "://" in part:
            part = part.split("://", 1)[1]
        part = part.rstrip("/")
        if not part:
            continue
        host, sep, port_text = part.rpartition(":")
        if not sep:
            host, port_text = part, str(default_port)
        try:
            port = int(port_text)
        except ValueError:
            raise ConfigurationError(f"the etcd endpoint '{raw.strip()}' has a bad port") from None
        result.append((host.strip("[]") or "127.0.0.1", port))
    if not result:
        raise ConfigurationError("no etcd endpoint given (expected host:port[,host:port...])")
    return result


def _rpc_error(exc: BaseException) -> grpc.RpcError | None:
    """Find the gRPC error behind ``exc`` (pyetcd re-raises some without the cause)."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        if isinstance(seen, grpc.RpcError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _details(rpc: grpc.RpcError | None, exc: BaseException) -> str:
    if rpc is not None and hasattr(rpc, "details"):
        text = str(rpc.details() or "")
        return " ".join(text.split()) or str(rpc.code())
    return " ".join(str(exc).split()) or type(exc).__name__


class EtcdClient:
    """A typed etcd v3 client with failover, re-authentication and error translation.

    Args:
        endpoints: ``host:port`` strings (one or several members of one cluster).
        protocol: ``http`` or ``https``.
        ca_cert: path of the CA certificate (implies TLS).
        cert: path of the client certificate (with ``key``).
        key: path of the client key.
        user: etcd user name (with ``password``).
        password: the user's password.
        timeout_s: the deadline of one RPC.
        retry_window_s: how long a call keeps retrying over the endpoints while none answers.

    Raises:
        ConfigurationError: when the TLS settings are inconsistent.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        protocol: str = "http",
        ca_cert: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        user: str | None = None,
        password: str | None = None,
        timeout_s: float = 60.0,
        retry_window_s: float = 10.0,
    ) -> None:
        self._endpoints = [f"{h}:{p}" for h, p in parse_endpoints(",".join(endpoints))]
        if protocol not in ("http", "https"):
            raise ConfigurationError(f"the etcd protocol must be http or https, got '{protocol}'")
        if (cert is None) != (key is None):
            raise ConfigurationError("the etcd client certificate and key must be given together")
        if (user is None) != (password is None):
            raise ConfigurationError("the etcd user and password must be given together")
        self._secure = protocol == "https" or ca_cert is not None
        self._ca_cert = ca_cert
        self._cert = cert
        self._key = key
        self._user = user
        self._password = password
        self._timeout_s = timeout_s
        self._retry_window_s = retry_window_s
        self._lock = threading.Lock()
        self._index = 0
        self._raw: Any = None
        self._closed = threading.Event()
        self._keeper: LeaseKeeper | None = None

    # -- connection management -------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The endpoint in use (``host:port``)."""
        return self._endpoints[self._index]

    @property
    def endpoints(self) -> list[str]:
        """All configured endpoints."""
        return list(self._endpoints)

    @property
    def timeout_s(self) -> float:
        """The deadline of one RPC."""
        return self._timeout_s

    def _credentials(self) -> Any:
        if not self._secure:
            return None
        try:
            ca = open(self._ca_cert, "rb").read() if self._ca_cert else None
            cert = open(self._cert, "rb").read() if self._cert else None
            key = open(self._key, "rb").read() if self._key else None
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read an etcd TLS file: {exc.filename}: {exc.strerror}"
            ) from exc
        return grpc.ssl_channel_credentials(ca, key, cert)

    def _build(self, endpoint: str) -> Any:
        host, _, port = endpoint.rpartition(":")
        ep = pyetcd.Endpoint(
            host,
            int(port),
            secure=self._secure,
            creds=self._credentials(),
            time_retry=0.0,
            opts=_GRPC_OPTIONS,
        )
        try:
            raw = pyetcd.MultiEndpointEtcd3Client(
                endpoints=[ep],
                timeout=self._timeout_s,
                user=self._user,
                password=self._password,
                failover=False,
            )
            if not self._secure:
                # gRPC refuses call credentials on a plain channel; the token still
                # travels in the metadata, which is all etcd reads.
                raw.call_credentials = None
            return raw
        except BaseException:
            ep.close()
            raise

    def _current(self) -> tuple[Any, str]:
        with self._lock:
            if self._closed.is_set():
                raise RendezvousConnectionError(f"the etcd client of {self.endpoint} is closed")
            endpoint = self._endpoints[self._index]
            if self._raw is None:
                self._raw = self._build(endpoint)
            return self._raw, endpoint

    def _drop(self, raw: Any, rotate: bool) -> None:
        """Forget ``raw`` (a failed or stale client) and, on failure, move to the next endpoint."""
        with self._lock:
            if self._raw is raw and raw is not None:
                self._raw = None
                if rotate:
                    self._index = (self._index + 1) % len(self._endpoints)
            else:
                raw = None
        if raw is not None:
            try:
                raw.close()
            except Exception as exc:  # closing a broken channel may fail; it is gone either way
                log.debug("closing the etcd channel failed: %s", exc)

    def call(self, what: str, fn: Callable[[Any], T]) -> T:
        """Run ``fn(raw_client)`` with failover, re-authentication and error translation.

        Args:
            what: a few words for error messages (``get 'round'``).
            fn: the operation on the raw pyetcd client; it may be retried.

        Returns:
            What ``fn`` returned.

        Raises:
            RendezvousConnectionError: when no endpoint answered within the retry window.
            RendezvousError: when etcd rejected the request (credentials, TLS, permission).
        """
        deadline = time.monotonic() + self._retry_window_s
        reauthenticated = False
        delay_s = 0.05
        tried = 0
        while True:
            raw: Any = None
            endpoint = self.endpoint
            try:
                raw, endpoint = self._current()
                return fn(raw)
            except (ConfigurationError, RendezvousError):
                raise
            except (grpc.RpcError, etcd_exc.Etcd3Exception, ValueError) as exc:
                rpc = _rpc_error(exc)
                code = rpc.code() if rpc is not None and hasattr(rpc, "code") else None
                reason = _details(rpc, exc)
                if code == grpc.StatusCode.UNAUTHENTICATED and not reauthenticated:
                    # The auth token expired after an idle spell: log in again, once.
                    reauthenticated = True
                    self._drop(raw, rotate=False)
                    continue
                self._raise_if_rejected(endpoint, code, reason, exc)
                # Another thread dropped this channel after a failure: a call on it fails with
                # a ValueError, one in flight is CANCELLED with "Channel closed!". The next try
                # takes the client that replaced it.
                channel_closed = (isinstance(exc, ValueError) and "closed" in str(exc).lower()) or (
                    code == grpc.StatusCode.CANCELLED and "channel closed" in reason.lower()
                )
                retryable = (
                    channel_closed
                    or code in _RETRYABLE_CODES
                    or code is None
                    and isinstance(
                        exc,
                        (
                            etcd_exc.ConnectionFailedError,
                            etcd_exc.ConnectionTimeoutError,
                            etcd_exc.NoServerAvailableError,
                        ),
                    )
                )
                if not retryable:
                    raise RendezvousError(f"etcd {endpoint} refused to {what}: {reason}") from exc
                tried += 1
                self._drop(raw, rotate=True)
                if time.monotonic() >= deadline and tried >= len(self._endpoints):
                    raise RendezvousConnectionError(
                        f"etcd {', '.join(self._endpoints)} cannot be reached to {what}: {reason}"
                    ) from exc
                if tried % len(self._endpoints) == 0:
                    if self._closed.wait(delay_s):
                        raise RendezvousConnectionError(
                            f"the etcd client of {endpoint} was closed during {what}"
                        ) from exc
                    delay_s = min(delay_s * 2, 0.5)

    def _raise_if_rejected(self, endpoint: str, code: Any, reason: str, exc: BaseException) -> None:
        lowered = reason.lower()
        if "authentication failed" in lowered:
            raise RendezvousError(
                f"etcd {endpoint} rejected the credentials for user '{self._user}'"
            ) from exc
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise RendezvousError(
                f"etcd {endpoint} did not accept the login of user '{self._user}': {reason}"
            ) from exc
        if code == grpc.StatusCode.PERMISSION_DENIED:
            raise RendezvousError(
                f"etcd {endpoint} denied user '{self._user}' access: {reason}"
            ) from exc
        if code == grpc.StatusCode.INVALID_ARGUMENT and "user name is empty" in lowered:
            raise RendezvousError(
                f"etcd {endpoint} requires a user and password (rdzv-conf user=..., password=...)"
            ) from exc
        if self._secure and code == grpc.StatusCode.UNAVAILABLE:
            if any(marker in lowered for marker in _TLS_MARKERS):
                raise RendezvousError(
                    f"etcd {endpoint}: the TLS handshake failed (is the server certificate "
                    f"signed by the CA in '{self._ca_cert}'?)"
                ) from exc

    def close(self) -> None:
        """Stop the lease keeper and close the connection. Idempotent."""
        if self._keeper is not None:
            self._keeper.stop()
        self._closed.set()
        with self._lock:
            raw, self._raw = self._raw, None
        if raw is not None:
            try:
                raw.close()
            except Exception as exc:  # a broken channel may fail to close; it is gone
                log.debug("closing the etcd channel failed: %s", exc)

    # -- key-value ---------------------------------------------------------------------

    @staticmethod
    def _kv(value: bytes, meta: Any) -> KeyValue:
        return KeyValue(
            key=bytes(meta.key).decode(),
            value=bytes(value),
            mod_revision=int(meta.mod_revision),
            create_revision=int(meta.create_revision),
            lease_id=int(meta.lease_id),
            version=int(meta.version),
        )

    @staticmethod
    def _raw_kv(kv: Any) -> KeyValue:
        """A KeyValue from the protobuf ``mvccpb.KeyValue`` of a raw response."""
        return KeyValue(
            key=bytes(kv.key).decode(),
            value=bytes(kv.value),
            mod_revision=int(kv.mod_revision),
            create_revision=int(kv.create_revision),
            lease_id=int(kv.lease),
            version=int(kv.version),
        )

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
        return self._raw_kv(resp.kvs[0]), revision

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
                            request_range=c._build_get_range_request(k, revision=revision)
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
            if not kvs:
                result.append(None)
            else:
                result.append(self._raw_kv(kvs[0]))
        return result, read_at if revision is None else revision

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Return every key under ``prefix`` (sorted by key) and the revision of the read."""
        resp = self.call(f"list '{prefix}'", lambda c: c.get_prefix_response(prefix))
        return (
            [self._raw_kv(kv) for kv in resp.kvs],
            int(resp.header.revision),
        )

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
        current = self._kv(*ranges[-1][0]) if ranges and ranges[-1] else None
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
        current = self._kv(*ranges[-1][0]) if ranges and ranges[-1] else None
        return bool(succeeded), current

    def atomic_add(self, key: str, delta: int, lease_id: int | None = None) -> int:
        """Add ``delta`` to the ASCII integer at ``key`` (0 when absent); return the result.

        A compare-and-swap loop on the key's mod revision: correct under any concurrency.

        Raises:
            RendezvousError: when the key holds something other than an integer.
        """
        return self._add_by_swap(key, delta, lease_id, as_counter=False)

    def counter_add(self, key: str, delta: int) -> int:
        """Add ``delta`` to the counter at ``key`` (0 when absent); return the result.

        A counter is stored as ``{"counter_base": B}`` and reads as B + version - 1 (see
        ``counter_value``). Adding 1 is one transaction that cannot lose a race: a put that
        keeps the value bumps the key's version, so N nodes arriving at once cost N
        transactions, where a compare-and-swap loop costs O(N²) retries. Other deltas (and
        a key that holds a plain integer) take a compare-and-swap on the mod revision.

        Raises:
            RendezvousError: when the key holds something other than a counter or an integer.
        """
        if delta == 1:
            value = counter_value(self._bump(key))
            if value is not None:
                return value
        return self._add_by_swap(key, delta, None, as_counter=True)

    def _add_by_swap(self, key: str, delta: int, lease_id: int | None, as_counter: bool) -> int:
        """Read the count at ``key`` (a counter or a plain integer), write it plus ``delta``.

        Written as a plain integer, or with ``as_counter`` in the counter form (whose base
        accounts for the version this put brings). A key bound to a lease keeps it.
        """
        while True:
            current = self.get(key)
            result = _stored_count(key, current) + delta
            if as_counter:
                version_after = current.version + 1 if current is not None else 1
                value = encode_counter(result - (version_after - 1))
            else:
                value = str(result).encode()
            # A put without a lease would detach the key from its lease: keep it.
            lease = lease_id
            if lease is None and current is not None and current.lease_id:
                lease = current.lease_id
            written, _ = self.put_if_mod_revision(
                key, current.mod_revision if current is not None else 0, value, lease
            )
            if written:
                return result

    def _bump(self, key: str) -> KeyValue:
        """Create ``key`` as a counter at 1, or put it again keeping value and lease."""
        rpc = pyetcd.etcdrpc

        def op(c: Any) -> Any:
            read = rpc.RequestOp(request_range=c._build_get_range_request(key))
            return c.kvstub.Txn(
                rpc.TxnRequest(
                    compare=[
                        rpc.Compare(
                            result=rpc.Compare.GREATER,
                            target=rpc.Compare.CREATE,
                            key=key.encode(),
                            create_revision=0,
                        )
                    ],
                    success=[
                        rpc.RequestOp(
                            request_put=rpc.PutRequest(
                                key=key.encode(), ignore_value=True, ignore_lease=True
                            )
                        ),
                        read,
                    ],
                    failure=[
                        rpc.RequestOp(
                            request_put=rpc.PutRequest(key=key.encode(), value=encode_counter(1))
                        ),
                        read,
                    ],
                ),
                c.timeout,
                credentials=c.call_credentials,
                metadata=c.metadata,
            )

        resp = self.call(f"add to '{key}'", op)
        kvs = resp.responses[1].response_range.kvs
        if not kvs:
            raise RendezvousError(f"etcd key '{key}' vanished while it was counted")
        return self._raw_kv(kvs[0])

    # -- leases ------------------------------------------------------------------------

    def grant_lease(self, ttl_s: int) -> int:
        """Grant a lease of ``ttl_s`` seconds; return its id."""
        lease = self.call("grant a lease", lambda c: c.lease(ttl_s))
        return int(lease.id)

    def refresh_lease(self, lease_id: int) -> int:
        """Refresh a lease; return its remaining TTL in seconds (0 or less: the lease is gone)."""
        responses = self.call("refresh a lease", lambda c: list(c.refresh_lease(lease_id)))
        return int(responses[0].TTL) if responses else 0

    def lease_remaining_s(self, lease_id: int) -> int:
        """Return the seconds left on a lease (-1 when it is gone)."""
        info = self.call("read a lease", lambda c: c.get_lease_info(lease_id))
        return int(info.TTL)

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease: every key bound to it disappears now. A lease already gone is fine."""
        try:
            self.call("revoke a lease", lambda c: c.revoke_lease(lease_id))
        except RendezvousError as exc:
            if "lease not found" not in str(exc):
                raise

    def keep_alive(self, lease_id: int, ttl_s: int) -> None:
        """Refresh ``lease_id`` every ``ttl_s / 3`` seconds from the keeper thread."""
        with self._lock:
            if self._keeper is None:
                self._keeper = LeaseKeeper(self)
            keeper = self._keeper
        keeper.add(lease_id, ttl_s)

    def stop_keep_alive(self, lease_id: int) -> None:
        """Stop refreshing ``lease_id`` (it then expires after its TTL)."""
        if self._keeper is not None:
            self._keeper.remove(lease_id)

    # -- watches -----------------------------------------------------------------------

    def watch(
        self, key: str, *, prefix: bool = False, start_revision: int, timeout_s: float
    ) -> list[WatchEvent]:
        """Wait for the first changes of ``key`` (or keys under it) at or after ``start_revision``.

        The watch survives a server restart or a failover: it is re-created from the
        last seen revision + 1 until ``timeout_s`` has passed.

        Args:
            key: the key, or the prefix when ``prefix`` is true.
            prefix: whether to watch every key under ``key``.
            start_revision: the first revision of interest (the read's revision + 1).
            timeout_s: how long to wait.

        Returns:
            The events of the first batch, or an empty list on timeout (or when the
            revision was compacted: the caller re-reads in either case).

        Raises:
            RendezvousConnectionError: when no endpoint answers within the retry window.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        revision = start_revision
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            responses: queue.Queue[Any] = queue.Queue()
            kwargs: dict[str, Any] = {"start_revision": revision}
            if prefix:
                kwargs["range_end"] = pyetcd.utils.prefix_range_end(key.encode())

            def create(
                c: Any, sink: queue.Queue[Any] = responses, options: dict[str, Any] = kwargs
            ) -> tuple[Any, int]:
                return c, c.add_watch_callback(key, sink.put, **options)

            try:
                raw, watch_id = self.call(f"watch '{key}'", create)
            except RendezvousError as exc:
                if isinstance(exc.__cause__, etcd_exc.RevisionCompactedError):
                    return []
                raise
            try:
                try:
                    item = responses.get(timeout=remaining)
                except queue.Empty:
                    return []
            finally:
                try:
                    raw.cancel_watch(watch_id)
                except Exception as exc:  # the stream may be gone already; nothing to cancel
                    log.debug("cancelling an etcd watch failed: %s", exc)
            if isinstance(item, etcd_exc.RevisionCompactedError):
                return []
            if isinstance(item, BaseException) or item is None:
                # The stream broke (server restart, failover): reconnect and resume.
                log.info("etcd watch on '%s' broke (%s); resuming at %d", key, item, revision)
                self._drop(raw, rotate=False)
                self.status_revision()  # waits (within the retry window) for a server
                continue
            events = [
                WatchEvent(
                    key=bytes(ev.key).decode(),
                    value=bytes(ev.value),
                    mod_revision=int(ev.mod_revision),
                    is_delete=isinstance(ev, pyetcd.events.DeleteEvent),
                )
                for ev in item.events
            ]
            if events:
                return events
            revision = max(revision, int(item.header.revision) + 1)


class LeaseKeeper:
    """A daemon thread refreshing leases every ttl/3 seconds until ``stop()``.

    A refresh that fails is logged and retried at the next turn; a lease that etcd
    reports gone is dropped (its keys have expired).
    """

    def __init__(self, client: EtcdClient) -> None:
        self._client = client
        self._leases: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="etcd-lease-keeper", daemon=True)
        self._thread.start()
        self.last_error: RendezvousError | None = None

    def add(self, lease_id: int, ttl_s: int) -> None:
        """Start refreshing ``lease_id``."""
        with self._lock:
            self._leases[lease_id] = ttl_s
        self._wake.set()

    def remove(self, lease_id: int) -> None:
        """Stop refreshing ``lease_id``."""
        with self._lock:
            self._leases.pop(lease_id, None)

    def stop(self, join_timeout_s: float = 5.0) -> None:
        """Stop the thread and wait for it at most ``join_timeout_s`` seconds."""
        self._stop.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(join_timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                leases = dict(self._leases)
            interval_s = min((max(ttl, 1) / 3.0 for ttl in leases.values()), default=1.0)
            self._wake.wait(interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            for lease_id in leases:
                with self._lock:
                    if lease_id not in self._leases:
                        continue
                try:
                    ttl = self._client.refresh_lease(lease_id)
                except RendezvousError as exc:
                    self.last_error = exc
                    log.warning("refreshing etcd lease %x failed: %s", lease_id, exc)
                    continue
                if ttl <= 0:
                    log.warning("etcd lease %x expired; its keys are gone", lease_id)
                    self.remove(lease_id)
