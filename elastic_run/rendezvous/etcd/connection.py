"""One logical connection to an etcd cluster: failover, re-authentication, error translation.

``EtcdConnection.call(what, fn)`` runs ``fn`` on the raw pyetcd client of the endpoint in
use and turns every failure into a typed error (see ``etcd_errors``):
- the endpoint cannot be reached: drop its client, move to the next endpoint and retry, until
  the retry window (or the caller's deadline) has passed;
- the auth token expired (UNAUTHENTICATED after an idle spell): log in again, once;
- the call ran on a raw client that is no longer the current one: retry on the current one;
- the leader changed while the call waited (``leader_watch``: a write forwarded to a leader
  that died is lost, and the member would hold the call until its deadline): the watch drops
  the raw client, and the call is retried on a fresh one.

A cut node leaves promptly: once a call found no endpoint answering ("cannot be reached"), every
RPC gets at most ``SHORT_RPC_TIMEOUT_S`` (a few seconds instead of ``read_timeout``) and every
call tries each endpoint once (instead of retrying for the retry window) until a call succeeds
again, so the calls on a cut node's way out (the failure event, the lease grant of the rejoin,
the revoke) fail in seconds, not minutes each; the first success ends that state and the next
call gets the full timeout and window back.

A connection with a home (``prefer_first``: the embedded backend lists this host's own member
first) that failed over elsewhere (at start, members refuse until they elect a leader) looks
at home every ``HOME_LOOK_S`` from a background thread, and goes back once home answers with a
leader: a node whose calls sit on another host's member is cut off with that host, while its
own member only goes with its own host. Calls in flight finish on the client they started on.

Whether a failed call ran on a dropped client is decided from state, not from the error: each
raw client carries the *generation* it was built in, and dropping or closing it starts a new
generation. A client dropped by another thread (after its own failure) or by ``close()`` fails the calls still
using it (a ValueError before they start, CANCELLED in flight); such a failure says nothing
about the cluster, so it is retried, or, after ``close()``, reported as closed.

What the clients of one process share per cluster: ``Shared(make, stop)`` keeps one object
per key (``cluster_key``: the process id, the endpoints and the connection settings, so a forked
child makes its own), made on first ``acquire`` and stopped after its last user's ``release``.
The lease keeper and the watch hub, each on a connection of its own, are shared so: a process of
256 nodes runs one of each per cluster, not 256 (issue 38).

Invariants: no ``grpc`` or ``pyetcd`` error escapes ``call``; an unreachable store raises
``RendezvousConnectionError`` naming the endpoints and the reason; a refused request raises
``RendezvousError`` (``EtcdLeaseNotFoundError`` for a lease that is gone); a bad local TLS
file raises ``ConfigurationError``; with a deadline, ``call`` returns or raises by then (its
``fn`` bounds each RPC with ``rpc_timeout_s(deadline_s)``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypedDict, TypeVar

import grpc
import pyetcd
import pyetcd.exceptions as etcd_exc

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.endpoints import format_endpoint
from elastic_run.rendezvous.errors import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousUnreachableError,
)
from elastic_run.rendezvous.etcd.errors import is_unreachable, refusal, status_of
from elastic_run.rendezvous.etcd.leader_watch import WATCH, member_status, raft_term_of
from elastic_run.rendezvous.settings import DEFAULT_READ_TIMEOUT_S

__all__ = [
    "HOME_LOOK_S",
    "SHORT_RPC_TIMEOUT_S",
    "ConnectionOptions",
    "EtcdConnection",
    "Shared",
    "cluster_key",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Keep gRPC from backing off for minutes after a server restart.
_GRPC_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# The deadline of each RPC while the cluster could not be reached (see the module docstring).
SHORT_RPC_TIMEOUT_S = 2.0
# How often a connection away from its home member looks whether home answers again.
HOME_LOOK_S = 1.0
# How long ``close`` waits for the look at home to end.
_HOME_JOIN_S = 2.0
# The shortest deadline given to an RPC: gRPC fails one of 0 s at once, which is what a
# caller whose deadline has passed gets.
_MIN_RPC_TIMEOUT_S = 0.001


class ConnectionOptions(TypedDict, total=False):
    """The keyword arguments of :class:`EtcdConnection` (also taken by ``EtcdClient``)."""

    protocol: str
    ca_cert: str | None
    cert: str | None
    key: str | None
    user: str | None
    password: str | None
    timeout_s: float
    retry_window_s: float
    require_leader: bool
    gone_reason: Callable[[], str | None] | None
    silence_may_heal: bool
    prefer_first: bool


class EtcdConnection:
    """The raw pyetcd client of the endpoint in use, with failover and error translation.

    Args:
        endpoints: ``(host, port)`` of each member of one cluster (at least one).
        protocol: ``http`` or ``https``.
        ca_cert: path of the CA certificate (implies TLS).
        cert: path of the client certificate (with ``key``).
        key: path of the client key.
        user: etcd user name (with ``password``).
        password: the user's password.
        timeout_s: the deadline of one RPC.
        retry_window_s: how long a call keeps retrying over the endpoints while none answers.
        require_leader: ask every member to refuse at once ("no leader") while it has no
            leader, instead of holding the request until its deadline: a member cut off from
            the others answers quickly, and the call moves on to another.
        gone_reason: says why the cluster will never answer again (None while it may): a
            call checks it before each try and raises ``RendezvousConnectionError`` with it.
        silence_may_heal: a call that no endpoint answered raises ``RendezvousUnreachableError``
            (a partition that may heal: the join retries until its timeout) instead of
            ``RendezvousConnectionError`` (exit 4), unless ``gone_reason`` says otherwise.
        prefer_first: the first endpoint is home (this host's own member): after a failover,
            go back to it once it answers with a leader.

    Raises:
        ConfigurationError: when the protocol, the TLS or the credential settings are wrong.
    """

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        *,
        protocol: str = "http",
        ca_cert: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        user: str | None = None,
        password: str | None = None,
        timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        retry_window_s: float = 10.0,
        require_leader: bool = False,
        gone_reason: Callable[[], str | None] | None = None,
        silence_may_heal: bool = False,
        prefer_first: bool = False,
    ) -> None:
        if not endpoints:
            raise ConfigurationError("no etcd endpoint given")
        if protocol not in ("http", "https"):
            raise ConfigurationError(f"the etcd protocol must be http or https, got '{protocol}'")
        if (cert is None) != (key is None):
            raise ConfigurationError("the etcd client certificate and key must be given together")
        if (user is None) != (password is None):
            raise ConfigurationError("the etcd user and password must be given together")
        self._endpoints = list(endpoints)
        self._secure = protocol == "https" or ca_cert is not None
        self._ca_cert = ca_cert
        self._cert = cert
        self._key = key
        self._user = user
        self._password = password
        self._timeout_s = timeout_s
        self._unreached = False  # the latest call found no endpoint answering
        self._retry_window_s = retry_window_s
        self._require_leader = require_leader
        self._gone_reason = gone_reason
        self._silence_may_heal = silence_may_heal
        self._lock = threading.Lock()
        self._index = 0
        self._raw: Any = None
        self._generation = 0
        self._closed = threading.Event()
        self._term = 0  # the newest raft term seen in a response (0: none yet)
        self._prefer_first = prefer_first and len(self._endpoints) > 1
        self._home_ready = False  # home answers again: the next call goes back to it
        self._home_look: threading.Thread | None = None
        self._in_flight: dict[int, int] = {}  # id(raw client) -> calls in flight on it
        self._retired: dict[int, Any] = {}  # replaced clients with calls still in flight

    @property
    def endpoint(self) -> str:
        """The endpoint in use (``host:port``)."""
        return format_endpoint(*self._endpoints[self._index])

    @property
    def endpoints(self) -> list[str]:
        """All configured endpoints (``host:port``)."""
        return [format_endpoint(h, p) for h, p in self._endpoints]

    @property
    def timeout_s(self) -> float:
        """The deadline of one RPC."""
        return self._timeout_s

    def _rpc_limit_s(self) -> float:
        if self._unreached:
            return min(self._timeout_s, SHORT_RPC_TIMEOUT_S)
        return self._timeout_s

    def rpc_timeout_s(self, deadline_s: float | None) -> float:
        """The deadline to give one RPC: the client's (short while the cluster could not be
        reached), cut to what is left until ``deadline_s``."""
        if deadline_s is None:
            return self._rpc_limit_s()
        return max(_MIN_RPC_TIMEOUT_S, min(self._rpc_limit_s(), deadline_s - time.monotonic()))

    # -- the raw client ----------------------------------------------------------------

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
        # gRPC takes any bytes here and fails each handshake later, as an unreachable server
        # would: a file that is not PEM is bad input, said before anything starts.
        for path, data, marker in (
            (self._ca_cert, ca, b"-----BEGIN CERTIFICATE-----"),
            (self._cert, cert, b"-----BEGIN CERTIFICATE-----"),
            (self._key, key, b"PRIVATE KEY-----"),
        ):
            if data is not None and marker not in data:
                raise ConfigurationError(
                    f"the etcd TLS file {path} is not PEM (no '{marker.decode()}' line)"
                )
        return grpc.ssl_channel_credentials(ca, key, cert)

    def _build(self, host: str, port: int, *, login: bool = True) -> Any:
        """A raw client of one member (``login=False``: no credentials, for status reads,
        which etcd serves without a login)."""
        # pyetcd joins host and port as the gRPC target: an IPv6 host needs its brackets.
        ep = pyetcd.Endpoint(
            f"[{host}]" if ":" in host else host,
            port,
            secure=self._secure,
            creds=self._credentials(),
            time_retry=0.0,
            opts=_GRPC_OPTIONS,
        )
        try:
            raw = pyetcd.MultiEndpointEtcd3Client(
                endpoints=[ep],
                timeout=self._rpc_limit_s(),
                user=self._user if login else None,
                password=self._password if login else None,
                failover=False,
            )
            if not self._secure:
                # gRPC refuses call credentials on a plain channel; the token still
                # travels in the metadata, which is all etcd reads.
                raw.call_credentials = None
            if self._require_leader:
                # etcd's own clients' WithRequireLeader: refused at once without a leader.
                raw.metadata = (*(raw.metadata or ()), ("hasleader", "true"))
            _fix_stubs(raw)
            return raw
        except BaseException:
            ep.close()
            raise

    def _current(self) -> tuple[Any, str, int]:
        """The raw client in use (built on first use), its endpoint and its generation."""
        with self._lock:
            if self._closed.is_set():
                raise RendezvousConnectionError(f"the etcd client of {self.endpoint} is closed")
            if self._home_ready:
                self._go_home()
            endpoint = self.endpoint
            if self._raw is None:
                try:
                    self._raw = self._build(*self._endpoints[self._index])
                except BaseException:
                    # The login reached no server (or was refused): a retry takes the next.
                    self._index = (self._index + 1) % len(self._endpoints)
                    self._away_from_home()
                    raise
            return self._raw, endpoint, self._generation

    def drop(self, raw: Any, rotate: bool = False) -> None:
        """Forget ``raw`` if it is still the one in use (a new generation starts).

        Args:
            raw: the raw client a call failed on.
            rotate: move to the next endpoint too (the endpoint failed).
        """
        with self._lock:
            if raw is None or self._raw is not raw:
                return
            self._raw = None
            self._generation += 1
            if rotate:
                self._index = (self._index + 1) % len(self._endpoints)
                self._away_from_home()
        _close_quietly(raw)

    def _go_home(self) -> None:
        """Switch back to the first endpoint (under ``_lock``, once home answered). Calls in
        flight on the old client finish there; it closes when the last of them returns
        (``_let_go``), or now when none is in flight."""
        self._home_ready = False
        if self._index == 0:
            return
        old, self._raw = self._raw, None
        if old is not None and self._in_flight.get(id(old), 0):
            self._retired[id(old)] = old
        elif old is not None:
            _close_quietly(old)
        self._generation += 1
        self._index = 0
        log.info("etcd: back on %s (this host's member answers again)", self.endpoint)

    def _away_from_home(self) -> None:
        """Start looking at home (under ``_lock``, after the index moved)."""
        if not self._prefer_first or self._index == 0 or self._closed.is_set():
            return
        if self._home_look is not None and self._home_look.is_alive():
            return
        self._home_look = threading.Thread(
            target=self._look_at_home, name="etcd-home-look", daemon=True
        )
        self._home_look.start()

    def _look_at_home(self) -> None:
        """Every ``HOME_LOOK_S`` while away: does home answer with a leader? Then go back."""
        me = threading.current_thread()
        while not self._closed.wait(HOME_LOOK_S):
            with self._lock:
                if self._index == 0:
                    break
            if self._home_answers():
                with self._lock:
                    self._home_ready = True
                break
        with self._lock:
            if self._home_look is me:
                self._home_look = None

    def _home_answers(self) -> bool:
        try:
            raw = self._build(*self._endpoints[0], login=False)
        except Exception:  # noqa: BLE001 - home does not answer yet (or refuses): look again
            return False
        try:
            status = member_status(raw)
        finally:
            _close_quietly(raw)
        return status is not None and status[0] != 0

    def release(self, raw: Any, why: str, *, next_member: bool) -> None:
        """Close ``raw`` for the leader watch: its calls fail as stale and are retried, on a
        fresh client of the same member, or of the next one when ``next_member``. A client
        already replaced (a connection back home) is closed too."""
        log.debug("etcd %s: closing the client: %s", self.endpoint, why)
        with self._lock:
            current = self._raw is raw
            if not current:
                self._retired.pop(id(raw), None)
        if current:
            self.drop(raw, rotate=next_member)
        else:
            _close_quietly(raw)

    def note_term(self, term: int) -> None:
        """The member said (a response header, a status) the cluster is at raft ``term``."""
        with self._lock:
            if term > self._term:
                self._term = term

    def _hold(self, raw: Any) -> None:
        with self._lock:
            self._in_flight[id(raw)] = self._in_flight.get(id(raw), 0) + 1

    def _let_go(self, raw: Any) -> None:
        """A call on ``raw`` returned: close it if it was retired and this was the last."""
        with self._lock:
            left = self._in_flight.get(id(raw), 1) - 1
            if left > 0:
                self._in_flight[id(raw)] = left
                return
            self._in_flight.pop(id(raw), None)
            retired = self._retired.pop(id(raw), None)
        if retired is not None:
            _close_quietly(retired)

    def close(self) -> None:
        """Close the connection; calls in flight fail as closed. Idempotent. The look at
        home stops (a bounded join: one in a login or status read ends within its deadline)."""
        with self._lock:
            self._closed.set()
            raw, self._raw = self._raw, None
            retired = list(self._retired.values())
            self._retired.clear()
            self._generation += 1
            look = self._home_look
        for old in [raw, *retired]:
            if old is not None:
                _close_quietly(old)
        if look is not None and look is not threading.current_thread():
            look.join(_HOME_JOIN_S)

    @property
    def is_closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed.is_set()

    # -- calls -------------------------------------------------------------------------

    def call(self, what: str, fn: Callable[[Any], T], *, deadline_s: float | None = None) -> T:
        """Run ``fn(raw_client)`` with failover, re-authentication and error translation.

        Args:
            what: a few words for error messages (``get 'round'``).
            fn: the operation on the raw pyetcd client; it may be retried.
            deadline_s: a monotonic time by which to give up (default: the retry window
                from now, none while the cluster could not be reached; in either case after
                every endpoint was tried).

        Returns:
            What ``fn`` returned.

        Raises:
            RendezvousConnectionError: when no endpoint answered in time, or the connection
                was closed.
            EtcdLeaseNotFoundError: when the lease the request named is gone.
            RendezvousError: when etcd refused the request (credentials, TLS, permission).
        """
        window_s = 0.0 if self._unreached else self._retry_window_s
        give_up_at_s = deadline_s if deadline_s is not None else time.monotonic() + window_s
        reauthenticated = False
        delay_s = 0.05
        tried = 0
        while True:
            raw: Any = None
            generation = -1
            endpoint = self.endpoint
            gone = self._gone_reason() if self._gone_reason is not None else None
            if gone is not None:
                raise RendezvousConnectionError(gone)
            try:
                raw, endpoint, generation = self._current()
                self._hold(raw)
                token = WATCH.enter(self, raw, what, self._term)
                try:
                    result = fn(raw)
                finally:
                    WATCH.leave(token)
                    self._let_go(raw)
                self.note_term(raft_term_of(result))
                if self._unreached:
                    # Reached again: the next raw client gets the full RPC deadline back.
                    self._unreached = False
                    self.drop(raw)
                return result
            except (ConfigurationError, RendezvousError):
                raise
            except (grpc.RpcError, etcd_exc.Etcd3Exception, ValueError) as exc:
                code, reason = status_of(exc)
                stale = raw is not None and generation != self._generation
                if stale and self._closed.is_set():
                    raise RendezvousConnectionError(
                        f"the etcd client of {endpoint} was closed during {what}"
                    ) from exc
                if not stale:
                    if code == grpc.StatusCode.UNAUTHENTICATED and not reauthenticated:
                        # The auth token expired after an idle spell: log in again, once.
                        reauthenticated = True
                        self.drop(raw)
                        continue
                    refused = refusal(
                        code,
                        reason,
                        endpoint=endpoint,
                        what=what,
                        user=self._user,
                        secure=self._secure,
                        ca_cert=self._ca_cert,
                    )
                    if refused is not None:
                        raise refused from exc
                    if not is_unreachable(code, exc, reason):
                        raise RendezvousError(
                            f"etcd {endpoint} refused to {what}: {reason}"
                        ) from exc
                    self.drop(raw, rotate=True)
                tried += 1
                now_s = time.monotonic()
                if now_s >= give_up_at_s and (
                    deadline_s is not None or tried >= len(self._endpoints)
                ):
                    self._unreached = True
                    gone = self._gone_reason() if self._gone_reason is not None else None
                    if gone is not None:
                        raise RendezvousConnectionError(gone) from exc
                    error = (
                        RendezvousUnreachableError
                        if self._silence_may_heal
                        else RendezvousConnectionError
                    )
                    raise error(
                        f"etcd {', '.join(self.endpoints)} cannot be reached to {what}: {reason}"
                    ) from exc
                if tried % len(self._endpoints) == 0:
                    pause_s = min(delay_s, max(0.0, give_up_at_s - now_s))
                    if self._closed.wait(pause_s):
                        raise RendezvousConnectionError(
                            f"the etcd client of {endpoint} was closed during {what}"
                        ) from exc
                    delay_s = min(delay_s * 2, 0.5)


# -- what the clients of one process share per cluster (the lease keeper, the watches) --


def cluster_key(endpoints: Sequence[tuple[str, int]], options: ConnectionOptions) -> Hashable:
    """The key of one cluster as a client reaches it: this process, the endpoints, the settings."""
    settings = tuple(sorted(options.items(), key=lambda kv: kv[0]))
    return (os.getpid(), tuple(endpoints), settings)


class Shared(Generic[T]):
    """One object per key, made on first use, stopped after its last user let go of it.

    Args:
        make: makes the object of a key.
        stop: stops an object no user holds any longer.
    """

    def __init__(self, make: Callable[[Any], T], stop: Callable[[T], None]) -> None:
        self._make = make
        self._stop = stop
        self._lock = threading.Lock()
        self._objects: dict[Hashable, T] = {}
        self._users: dict[int, tuple[Hashable, set[int]]] = {}  # id(obj) -> key, id(users)

    def acquire(self, key: Hashable, user: object) -> T:
        """The object of ``key`` (made now when there is none), held by ``user`` from now on."""
        with self._lock:
            obj = self._objects.get(key)
            if obj is None:
                obj = self._make(key)
                self._objects[key] = obj
                self._users[id(obj)] = (key, set())
            self._users[id(obj)][1].add(id(user))
            return obj

    def release(self, obj: T, user: object) -> None:
        """``user`` no longer holds ``obj``; the last user's release stops it."""
        with self._lock:
            entry = self._users.get(id(obj))
            if entry is None:
                return
            key, users = entry
            users.discard(id(user))
            if users:
                return
            del self._users[id(obj)]
            if self._objects.get(key) is obj:
                del self._objects[key]
        self._stop(obj)


def _fix_stubs(raw: Any) -> None:
    """Make the raw client's gRPC stubs now, and keep them for its whole life.

    Another thread may close a raw client (``drop``, ``close``) while a call still holds it.
    A call on a closed channel fails with a ValueError, which ``call`` retries, but making a
    stub on a closed channel crashes the process (SIGSEGV, grpcio 1.85). pyetcd makes its
    stubs on first use and throws them away after a failed call, to make them again; this
    adapter drops the whole raw client after a failure instead, so it needs neither.
    """
    for stub in ("kvstub", "leasestub", "maintenancestub", "watcher"):
        getattr(raw, stub)
    raw._clear_old_stubs = _keep_stubs


def _keep_stubs() -> None:
    """Replaces pyetcd's ``_clear_old_stubs`` (see ``_fix_stubs``)."""


def _close_quietly(raw: Any) -> None:
    try:
        raw.close()
    except Exception as exc:  # a broken channel may fail to close; it is gone either way
        log.debug("closing the etcd channel failed: %s", exc)
