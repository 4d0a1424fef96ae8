"""EmbeddedEtcdBackend: the etcd backend on the embedded cluster's members, and this host's member.

Every agent builds one (:func:`create_embedded_backend`): the etcd backend, unchanged, on the
members' client URLs (this host's first), with two differences in how it calls etcd: a member
without a leader refuses at once (etcd's require-leader), and once the quorum watch (``quorum.py``)
judges the quorum lost for good every call fails at once with the line that says so (exit 4).
An agent on a listed host also starts its member (``member.py``); readers (``status``,
``close``) never do.

Lifetime: the member lives as long as the job, not as long as its agent's workers. ``close()``
(the agent's last act) keeps it up while other agents of the job still beat (their heartbeat
keys are there), unless the others can spare it: after it leaves, the cluster must still
tolerate the losses it tolerated (each member that leaves early claims one of the
``tolerates`` slots, by compare-and-set, so two never take the last one). It leaves at once
when the quorum is lost, and after ``_UNREACHABLE_LINGER_S`` of not reaching the cluster (this
host is cut off: the others do not need it). Then etcd stops and its directory goes.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.embedded.cluster import (
    EmbeddedCluster,
    MemberSpec,
    find_local_member,
    local_identity,
    parse_cluster,
)
from elastic_run.rendezvous.embedded.member import EmbeddedMember, MemberTLS
from elastic_run.rendezvous.embedded.quorum import QuorumWatch
from elastic_run.rendezvous.errors import RendezvousConnectionError, RendezvousError
from elastic_run.rendezvous.etcd.backend import (
    EtcdRendezvousBackend,
    etcd_connection_options,
    key_prefix_of,
    lease_ttl_of,
)
from elastic_run.rendezvous.etcd.client import EtcdClient
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.settings import RendezvousSettings

__all__ = ["BACKEND_NAME", "SPARED_KEY", "EmbeddedEtcdBackend", "create_embedded_backend"]

log = logging.getLogger(__name__)

BACKEND_NAME = "embedded-etcd"
SPARED_KEY = "embedded/spared"
"""The job key listing the members that left while the job went on (JSON list of names)."""

_UNREACHABLE_LINGER_S = 10.0
_LINGER_POLL_S = 0.5
_FORM_SAY_AFTER_S = 5.0
# A member that is not serving yet (the cluster forms) may fail a TLS handshake: refusals are
# retried this long before they count (a wrong CA is then one line, not a wait for the join).
_REFUSAL_GRACE_S = 30.0


class EmbeddedEtcdBackend(EtcdRendezvousBackend):
    """The etcd backend on an embedded cluster (see the module docstring).

    Args:
        client: the etcd client on the members.
        run_id: the job's id.
        cluster: the members.
        watch: the quorum watch (started here, stopped by ``close()``).
        member: this host's member (started by the caller), or None.
        key_prefix: the prefix every job's keys live under.
        lease_ttl_s: the heartbeat lease TTL.
        form_timeout_s: how long ``check_reachable`` waits for the cluster to form.
        heartbeat_timeout_s: how long one periodic heartbeat's calls may take.
    """

    def __init__(
        self,
        client: EtcdClient,
        run_id: str,
        cluster: EmbeddedCluster,
        watch: QuorumWatch,
        member: EmbeddedMember | None = None,
        *,
        key_prefix: str,
        lease_ttl_s: int,
        form_timeout_s: float,
        heartbeat_timeout_s: float | None = None,
    ) -> None:
        super().__init__(
            client,
            run_id,
            key_prefix=key_prefix,
            lease_ttl_s=lease_ttl_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
        )
        self._cluster = cluster
        self._watch = watch
        self._member = member
        self._form_timeout_s = form_timeout_s
        self._pause = threading.Event()
        self._closed = False
        self._formed = False  # the cluster answered once: agents may rely on it

    @property
    def name(self) -> str:
        """``embedded-etcd``."""
        return BACKEND_NAME

    @property
    def cluster(self) -> EmbeddedCluster:
        """The members."""
        return self._cluster

    @property
    def local_member(self) -> MemberSpec | None:
        """The member this agent runs, or None."""
        return self._member.spec if self._member is not None else None

    def member_states(self) -> dict[str, str]:
        """Knock at every member now: each one's client ``host:port`` and whether it is up,
        down or silent (for ``status`` and ``close``), in the order listed."""
        states = self._watch.check_now().states
        return {m.client_endpoint: states.get(m.name, "silent") for m in self._cluster.members}

    def check_reachable(self, timeout_s: float) -> None:
        """Wait for the cluster to answer: up to the join timeout while its members start.

        Raises:
            RendezvousConnectionError: this host's member exited (its last log line says why),
                the quorum is lost for good, or the cluster did not form in time.
            RendezvousError: a member still refused the request (TLS, credentials) after
                ``_REFUSAL_GRACE_S`` (while the cluster forms, a refusal may be transient).
        """
        start = time.monotonic()
        deadline = start + max(timeout_s, self._form_timeout_s)
        said = False
        while True:
            member = self._member
            if member is not None and not member.is_running():
                raise RendezvousConnectionError(
                    f"the embedded etcd member {member.spec.name} ({member.spec.client_endpoint}) "
                    f"exited at start: {member.exit_reason() or 'no output'}"
                )
            try:
                super().check_reachable(min(1.0, max(0.05, deadline - time.monotonic())))
                self._formed = True
                return
            except RendezvousError as exc:
                now = time.monotonic()
                refused = not isinstance(exc, RendezvousConnectionError)
                if refused and now - start >= _REFUSAL_GRACE_S:
                    raise
                if now >= deadline:
                    raise RendezvousConnectionError(
                        f"the embedded etcd cluster ({self._cluster.describe()}) did not form "
                        f"within {now - start:.0f} s: {exc}"
                    ) from exc
                verdict = self._watch.check_now()
                if verdict.reason is not None:
                    raise RendezvousConnectionError(verdict.reason) from exc
                if not said and now - start >= _FORM_SAY_AFTER_S:
                    up = [n for n, s in verdict.states.items() if s == "up"]
                    log.warning(
                        "waiting for the embedded etcd cluster to form (%s): %d of %d members "
                        "up, %d needed",
                        self._cluster.describe(),
                        len(up),
                        self._cluster.size,
                        self._cluster.majority,
                    )
                    said = True
                self._pause.wait(0.2)

    def close(self) -> None:
        """Keep this host's member up while the job needs it, then stop it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._formed and self._member is not None and self._member.is_running():
                self._linger()
        finally:
            self._watch.stop()
            super().close()
            if self._member is not None:
                self._member.stop()

    def _linger(self) -> None:
        """Return once the job no longer needs this host's member (module docstring)."""
        said = False
        unreachable_since: float | None = None
        prefix = self.key_base + keys.heartbeat("")
        while self._watch.gone_reason() is None:
            try:
                beating = self.client.count_prefix(prefix)
                if beating == 0 or self._spared():
                    return
                unreachable_since = None
            except RendezvousError as exc:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since >= _UNREACHABLE_LINGER_S:
                    log.warning("leaving the embedded etcd cluster: %s", exc)
                    return
                beating = -1
            if not said and beating > 0:
                spec = self._member.spec if self._member is not None else None
                log.warning(
                    "keeping this host's etcd member %s up until the job ends: %d agent(s) "
                    "still use the cluster",
                    spec.client_endpoint if spec is not None else "?",
                    beating,
                )
                said = True
            self._pause.wait(_LINGER_POLL_S)

    def _spared(self) -> bool:
        """Claim one of the cluster's spare slots for this member (compare-and-set)."""
        member = self._member
        if member is None:
            return True
        raw = self.get(SPARED_KEY)
        names = _names(raw)
        me = member.spec.name
        if me in names:
            return True
        lost = set(self._watch.verdict.lost) - set(names) - {me}
        if len(names) + len(lost) + 1 > self._cluster.tolerates:
            return False
        _, written = self.compare_set(SPARED_KEY, raw, json.dumps([*names, me]).encode())
        return written


def _names(raw: bytes | None) -> list[str]:
    if raw is None:
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def _member_tls(settings: RendezvousSettings) -> MemberTLS | None:
    cert, key = settings.ssl_cert, settings.ssl_cert_key
    if not cert and not key:
        return None
    if not cert or not key:
        raise ConfigurationError(
            "embedded etcd TLS needs both ssl_cert and ssl_cert_key in --rdzv-conf"
        )
    return MemberTLS(cert, key, settings.ca_cert)


def create_embedded_backend(
    params: RendezvousParameters, *, allow_hosting: bool = True
) -> EmbeddedEtcdBackend:
    """Build the backend of ``--rdzv-backend embedded-etcd`` (module docstring).

    Args:
        params: the rendezvous parameters (the endpoint lists the members).
        allow_hosting: False for readers (``status``, ``close``): never start a member.

    Raises:
        ConfigurationError: the member list or a config value is bad, or this host is a
            member and etcd is not installed (the line names what to install).
        RendezvousConnectionError: this host's member could not be started.
    """
    cluster = parse_cluster(params.endpoint, params.run_id)
    settings = RendezvousSettings.from_params(params)
    options = etcd_connection_options(params)
    tls = _member_tls(settings)
    if tls is not None:
        options["protocol"] = "https"
    member: EmbeddedMember | None = None
    endpoints = cluster.client_endpoints
    if allow_hosting:
        local_addr = params.local_addr or params.get("local_addr")
        found = find_local_member(cluster, local_identity(str(local_addr) if local_addr else None))
        if found is not None:
            spec, bind = found
            member = EmbeddedMember(
                cluster,
                spec,
                bind,
                params.run_id,
                tls=tls,
                election_timeout_s=settings.election_timeout_s,
            )
            endpoints = [spec.client_endpoint] + [e for e in endpoints if e != spec.client_endpoint]
            # Calls on another host's member are cut off with that host: go back home.
            options["prefer_first"] = True
    # Members' agents knock twice a second; the others, possibly thousands, every 2 s.
    watch = QuorumWatch(cluster, interval_s=0.5 if member is not None else 2.0)
    options["require_leader"] = True
    options["gone_reason"] = watch.gone_reason
    options["silence_may_heal"] = True
    client = EtcdClient(endpoints, **options)
    backend = EmbeddedEtcdBackend(
        client,
        params.run_id,
        cluster,
        watch,
        member,
        key_prefix=key_prefix_of(params),
        lease_ttl_s=lease_ttl_of(params),
        heartbeat_timeout_s=settings.heartbeat_deadline_s,
        form_timeout_s=settings.join_timeout_s,
    )
    try:
        if member is not None:
            member.start()
        watch.start()
    except BaseException:
        backend.close()
        raise
    return backend
