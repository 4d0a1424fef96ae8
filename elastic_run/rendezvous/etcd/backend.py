"""EtcdRendezvousBackend: the rendezvous key-value seam on etcd v3.

Keys live under ``<key_prefix><run_id>/`` (default prefix ``/elastic-run/``). Values
are what the protocol writes (JSON records, ASCII integers, counters that read as
integers); this module never pickles. ``wait_for`` blocks on etcd watches.

Liveness. Each node's heartbeat key ``hb/<node id>`` holds a counter bound to a lease of
``keep_alive_interval x keep_alive_max_attempt`` seconds, which the client's keeper thread
refreshes every ttl/3: when a node dies its lease expires and the key disappears, which
``read_heartbeats`` reports as None. A node whose refreshes fail while it lives would be
judged dead by its peers all the same, so ``heartbeat(node_id)`` tells it:
- when the node's lease was not refreshed successfully within its TTL (its keys are about
  to vanish, or have vanished, for the peers), ``heartbeat`` raises
  ``RendezvousConnectionError`` with the keeper's last error, at once, without a request;
- when etcd reports the lease gone (the keeper saw it expire, or the bump found it
  missing), ``heartbeat`` takes a fresh lease and bumps the counter with it, so the node can
  rejoin, and then raises ``RendezvousConnectionError`` once, saying that its keys vanished;
- it recovers by itself: the next call after a successful refresh (or after the fresh
  lease) succeeds;
- ``heartbeat_before_join(node_id)``, the beat a node makes as it joins a round, does not
  report a lapse: it binds the key to a fresh lease at once, so that the key stands for the
  round being joined (a lapsed lease would expire right after the node arrived);
- it never blocks longer than the client's RPC deadline (``read_timeout``) in all.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.backend import RendezvousBackend, heartbeat_values
from elastic_run.rendezvous.endpoints import format_endpoint, parse_endpoints
from elastic_run.rendezvous.errors import RendezvousConnectionError
from elastic_run.rendezvous.etcd.client import EtcdClient
from elastic_run.rendezvous.etcd.connection import ConnectionOptions
from elastic_run.rendezvous.etcd.counter import counter_value
from elastic_run.rendezvous.etcd.errors import EtcdLeaseNotFoundError
from elastic_run.rendezvous.etcd.kv import KeyValue, range_request
from elastic_run.rendezvous.etcd.lease import LeaseFailure
from elastic_run.rendezvous.settings import BACKEND_KEYS, DEFAULT_KEY_PREFIX, RendezvousSettings

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

__all__ = [
    "CONF_KEYS",
    "DEFAULT_KEY_PREFIX",
    "FIRST_READ_TIMEOUT_S",
    "EtcdRendezvousBackend",
    "create_backend",
    "create_etcd_backend",
    "etcd_connection_options",
    "key_prefix_of",
    "lease_ttl_of",
]

CONF_KEYS = BACKEND_KEYS["etcd"]

# The longest torch's ``create_backend`` waits for etcd's first answer (the launcher's own
# check before an agent starts waits as long).
FIRST_READ_TIMEOUT_S = 5.0

log = logging.getLogger(__name__)

_MIN_LEASE_TTL_S = 2  # etcd refuses shorter leases with its default election timing


def _value(kv: KeyValue | None) -> bytes | None:
    """A key's value as the protocol reads it: a counter reads as its decimal value."""
    if kv is None:
        return None
    counted = counter_value(kv)
    return str(counted).encode() if counted is not None else kv.value


class EtcdRendezvousBackend(RendezvousBackend):
    """The rendezvous backend on etcd v3.

    Args:
        client: the etcd client (closed by ``close()``).
        run_id: the job's id.
        key_prefix: the prefix every job's keys live under.
        lease_ttl_s: the heartbeat lease TTL in seconds (at least 2).
        heartbeat_timeout_s: how long one periodic heartbeat's calls may take (None: the
            client's RPC timeout); ``RendezvousSettings.heartbeat_deadline_s``.
    """

    CONF_KEYS = CONF_KEYS

    def __init__(
        self,
        client: EtcdClient,
        run_id: str,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        lease_ttl_s: int = 3,
        heartbeat_timeout_s: float | None = None,
    ) -> None:
        if not run_id:
            raise ConfigurationError("the rendezvous id (--rdzv-id) must not be empty")
        prefix = key_prefix if key_prefix.endswith("/") else key_prefix + "/"
        self._client = client
        self._run_id = run_id
        self._base = f"{prefix}{run_id}/"
        self._lease_ttl_s = max(_MIN_LEASE_TTL_S, int(lease_ttl_s))
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._leases: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """``etcd``."""
        return "etcd"

    @property
    def heartbeat_timeout_s(self) -> float:
        """How long one periodic heartbeat's calls may take (``heartbeat_timeout``)."""
        timeout_s = self._client.timeout_s
        hb = self._heartbeat_timeout_s
        return timeout_s if hb is None else min(timeout_s, hb)

    @property
    def endpoint(self) -> str:
        """The configured endpoints, comma-separated."""
        return ",".join(self._client.endpoints)

    @property
    def key_base(self) -> str:
        """The full prefix of this job's keys (``/elastic-run/<run id>/``)."""
        return self._base

    @property
    def client(self) -> EtcdClient:
        """The etcd client this backend uses."""
        return self._client

    def _key(self, key: str) -> str:
        return self._base + key

    def get(self, key: str) -> bytes | None:
        """Return the value of ``key`` or None when absent. Never blocks."""
        return _value(self._client.get(self._key(key)))

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Return the values of ``keys`` in order (None for absent ones), as of one revision."""
        found, _ = self._client.get_many([self._key(k) for k in keys])
        return [_value(kv) for kv in found]

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``."""
        self._client.put(self._key(key), value)

    def set_many(self, items: Mapping[str, bytes]) -> None:
        """Store several values in one transaction."""
        self._client.put_many([(self._key(k), v) for k, v in items.items()])

    def add(self, key: str, delta: int) -> int:
        """Atomically add ``delta`` to the integer at ``key`` (0 when absent); return the result."""
        return self._client.counter_add(self._key(key), delta)

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> tuple[bytes, bool]:
        """Set ``key`` to ``desired`` if it holds ``expected`` (None: absent), in one transaction.

        Returns:
            The value stored after the call (``b""`` when the key is absent) and whether
            this call wrote it: whether the key holds ``desired``, as on c10d (every caller's
            value names its writer). That also covers a compare-set whose answer was lost with
            a killed member after the cluster applied it: the client sends it again to
            another member, which finds the caller's own value there.
        """
        written, current = self._client.compare_and_swap(self._key(key), expected, desired)
        if written:
            return desired, True
        stored = current.value if current is not None else b""
        return stored, stored == desired and expected != desired

    def wait_for(self, keys: Sequence[str], timeout_s: float) -> bool:
        """Block until every key exists or ``timeout_s`` passes; return whether they exist."""
        full = [self._key(k) for k in keys]
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            found, revision = self._client.get_many(full)
            missing = [k for k, kv in zip(full, found, strict=True) if kv is None]
            if not missing:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._client.watch(missing[0], start_revision=revision + 1, timeout_s=remaining)

    def _fresh_lease(self, node_id: str, old: int | None, deadline_s: float) -> int:
        """Grant ``node_id`` a new lease, kept alive from now on (``old`` no longer is)."""
        if old is not None:
            self._client.stop_keep_alive(old)
        sent_at_s = time.monotonic()
        lease = self._client.grant_lease(self._lease_ttl_s, deadline_s=deadline_s)
        self._client.keep_alive(lease, self._lease_ttl_s, granted_at_s=sent_at_s)
        with self._lock:
            self._leases[node_id] = lease
        return lease

    def heartbeat(self, node_id: str) -> None:
        """Bump ``node_id``'s heartbeat counter, bound to its lease (granted on first use).

        See the module docstring for the rule.

        Raises:
            RendezvousConnectionError: when the node's lease was not refreshed within its
                TTL (nothing is written), when it had expired (the counter was bumped on a
                fresh lease first), or when etcd did not answer within the heartbeat's
                deadline (``heartbeat_timeout``, at most the RPC timeout).
        """
        deadline_s = time.monotonic() + self.heartbeat_timeout_s
        with self._lock:
            lease = self._leases.get(node_id)
        failure = self._client.lease_failure(lease) if lease is not None else None
        if failure is not None and not failure.is_expired:
            raise RendezvousConnectionError(self._lapsed(node_id, failure))
        if lease is None or failure is not None:
            lease = self._fresh_lease(node_id, lease, deadline_s)
        lease, gone = self._bump(node_id, lease, deadline_s)
        failure = failure or gone
        if failure is not None:
            raise RendezvousConnectionError(
                self._lapsed(node_id, failure) + f"; it beats on with the fresh lease {lease:x}"
            )

    def heartbeat_before_join(self, node_id: str) -> None:
        """Bump ``node_id``'s heartbeat on a lease that surely lives, as it is about to join.

        A lease not refreshed within its TTL (a partition that just healed) may expire on the
        server any moment now, after the node arrived, and its key with it: the members of the
        round would judge the node gone (stop 23's ci: an agent rejoined on its lapsed lease,
        the lease expired a second later, and the round it had just formed ended). A lease
        that is not sound (``etcd_lease.lease_is_sound``: lapsed, its latest refresh failed or
        overdue), like one etcd reported gone, is replaced now by a fresh one, which the key is
        bound to by the bump; the old one, no longer refreshed, expires without it.

        Raises:
            RendezvousConnectionError: etcd did not answer within the RPC deadline.
        """
        deadline_s = time.monotonic() + self._client.timeout_s
        with self._lock:
            lease = self._leases.get(node_id)
        if lease is None or not self._client.lease_is_sound(lease):
            failure = self._client.lease_failure(lease) if lease is not None else None
            doubtful = lease
            lease = self._fresh_lease(node_id, lease, deadline_s)
            if doubtful is not None:
                why = (
                    self._lapsed(node_id, failure)
                    if failure is not None
                    else f"the latest refresh of etcd lease {doubtful:x} failed or is overdue"
                )
                log.warning("%s; node '%s' joins with the fresh lease %x", why, node_id, lease)
        self._bump(node_id, lease, deadline_s)

    def _bump(self, node_id: str, lease: int, deadline_s: float) -> tuple[int, LeaseFailure | None]:
        """Bump the heartbeat counter on ``lease``; on a fresh lease when etcd says it is gone.

        Returns:
            The lease the key is bound to now, and why the one given was replaced (or None).
        """
        key = self._key(f"hb/{node_id}")
        try:
            self._client.bump_leased_counter(key, lease, deadline_s=deadline_s)
        except EtcdLeaseNotFoundError as exc:
            # etcd dropped the lease before the keeper's next refresh could tell.
            gone = LeaseFailure(f"etcd lease {lease:x} is gone ({exc})", is_expired=True)
            lease = self._fresh_lease(node_id, lease, deadline_s)
            self._client.bump_leased_counter(key, lease, deadline_s=deadline_s)
            return lease, gone
        return lease, None

    def _lapsed(self, node_id: str, failure: LeaseFailure) -> str:
        return (
            f"the heartbeat of node '{node_id}' on etcd {self.endpoint} lapsed: "
            f"{failure.reason}; the other nodes "
            + ("saw its keys vanish" if failure.is_expired else "may see its keys vanish")
            + " and may drop it from the round"
        )

    def check_reachable(self, timeout_s: float) -> None:
        """Read one key within ``timeout_s`` (see ``RendezvousBackend.check_reachable``).

        The read is serializable: any member answers it from its own copy, with or without a
        leader. The check asks whether the store can be reached and accepts the credentials;
        a cluster electing a new leader (its old one just died) can, and the join waits for
        the election like for any store that does not answer yet. A linearizable read here
        failed an agent started during such an election with exit 4 ("leader changed"),
        under load, while two members of three lived.
        """
        deadline_s = time.monotonic() + timeout_s

        def read(c: Any) -> Any:
            request = range_request(self._key("round"), limit=1, serializable=True)
            return c.kvstub.Range(
                request,
                self._client.rpc_timeout_s(deadline_s),
                credentials=c.call_credentials,
                metadata=c.metadata,
            )

        self._client.call("answer a first read", read, deadline_s=deadline_s)

    def read_heartbeats(self, node_ids: Sequence[str]) -> list[int | None]:
        """Return each node's heartbeat counter, None where its key is gone (lease expired).

        A key that holds something other than an integer is read as a counter of its own,
        with a warning (see ``backend.heartbeat_values``); it never raises for one.
        """
        values = self.get_many([f"hb/{n}" for n in node_ids])
        return heartbeat_values(node_ids, values, f"etcd {self.endpoint}")

    def forget_node(self, node_id: str) -> None:
        """Revoke ``node_id``'s lease: its heartbeat key disappears at once."""
        with self._lock:
            lease = self._leases.pop(node_id, None)
        if lease is not None:
            self._client.stop_keep_alive(lease)
            self._client.revoke_lease(lease)

    def round_store(self, prefix: str) -> Store:
        """Return an ``EtcdStore`` under ``<job prefix><prefix>`` sharing this backend's client."""
        from elastic_run.rendezvous.etcd.store import EtcdStore

        return EtcdStore(self._client, self._key(prefix))

    def exists(self) -> bool:
        """Return whether any key lives under this job's prefix (one counting request)."""
        return self._client.count_prefix(self._base) > 0

    def delete_all(self) -> int:
        """Delete every key of this job (for tests and cleanup); return how many."""
        return self._client.delete_prefix(self._base)

    def close(self) -> None:
        """Stop refreshing leases and close the connection. Idempotent.

        Leases are not revoked: the keys of a node that closes without ``forget_node``
        expire after their TTL, as a crashed node's would.
        """
        self._client.close()


def etcd_connection_options(params: RendezvousParameters) -> ConnectionOptions:
    """The etcd client's settings from ``--rdzv-conf`` (see :func:`create_etcd_backend`).

    Raises:
        ConfigurationError: a config value is invalid.
    """
    settings = RendezvousSettings.from_params(params)
    read_timeout_s = settings.read_timeout_s
    return ConnectionOptions(
        protocol=settings.protocol,
        ca_cert=settings.ca_cert,
        cert=settings.ssl_cert,
        key=settings.ssl_cert_key,
        user=settings.user,
        password=settings.password,
        timeout_s=read_timeout_s,
        retry_window_s=min(read_timeout_s, 15.0),
    )


def lease_ttl_of(params: RendezvousParameters) -> int:
    """The heartbeat lease TTL: the handler's staleness budget, rounded up to whole seconds."""
    return math.ceil(RendezvousSettings.from_params(params).stale_after_s)


def key_prefix_of(params: RendezvousParameters) -> str:
    """The prefix every job's keys live under (``key_prefix``, default ``/elastic-run/``)."""
    return RendezvousSettings.from_params(params).key_prefix


def create_etcd_backend(params: RendezvousParameters) -> EtcdRendezvousBackend:
    """Build an ``EtcdRendezvousBackend`` from ``--rdzv-endpoint`` and ``--rdzv-conf``.

    Config keys: ``protocol`` (http|https), ``ca_cert`` (or ``cacert``), ``ssl_cert``
    (or ``cert``), ``ssl_cert_key`` (or ``key``), ``read_timeout`` (s, default 60),
    ``user``, ``password``, ``key_prefix`` (default ``/elastic-run/``),
    ``keep_alive_interval`` (s, default 1) and ``keep_alive_max_attempt`` (default 5),
    whose product is the heartbeat lease TTL.

    Args:
        params: the rendezvous parameters.

    Returns:
        The backend (not yet connected: the first call connects).

    Raises:
        ConfigurationError: when the endpoint or a config value is invalid.
    """
    if not params.endpoint:
        raise ConfigurationError("the etcd backend needs --rdzv-endpoint host:port[,host:port]")
    endpoints = [format_endpoint(h, p) for h, p in parse_endpoints(params.endpoint)]
    client = EtcdClient(endpoints, **etcd_connection_options(params))
    return EtcdRendezvousBackend(
        client,
        params.run_id,
        key_prefix=key_prefix_of(params),
        # The lease outlives a heartbeat by the handler's staleness budget.
        lease_ttl_s=lease_ttl_of(params),
        heartbeat_timeout_s=RendezvousSettings.from_params(params).heartbeat_deadline_s,
    )


def create_backend(params: RendezvousParameters) -> tuple[EtcdRendezvousBackend, Store]:
    """Build an etcd backend and a store beside it from ``params`` (torch's ``create_backend``).

    Reads the keys :func:`create_etcd_backend` reads.

    Args:
        params: the rendezvous parameters.

    Like torch's, it reads from etcd once before it returns (within the read timeout, at most
    :data:`FIRST_READ_TIMEOUT_S`): an etcd that cannot be reached is said here, not at the
    first rendezvous call.

    Returns:
        The backend, and an ``EtcdStore`` on the same client under the job's ``store/`` prefix.

    Raises:
        ConfigurationError: the endpoint or a config value is invalid (a ValueError).
        RendezvousConnectionError: etcd did not answer the first read.
        RendezvousError: etcd refused it (credentials, TLS).
    """
    backend = create_etcd_backend(params)
    try:
        read_timeout_s = RendezvousSettings.from_params(params).read_timeout_s
        backend.check_reachable(min(read_timeout_s, FIRST_READ_TIMEOUT_S))
    except BaseException:
        backend.close()
        raise
    return backend, backend.round_store("store/")
