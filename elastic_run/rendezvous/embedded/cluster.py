"""The embedded cluster's spec: which hosts are members, on which ports, and which one is here.

``--rdzv-endpoint h1,h2,h3`` (``host[:port]`` each, 1, 3 or 5 of them) names the members. A
member listens for clients on its port (default :data:`DEFAULT_CLIENT_PORT`, 29410) and for its
peers on the next one (client port + 1). The cluster is static: ``--initial-cluster`` names every
member (``m1=http://h1:29411,...``), ``--initial-cluster-state new``, and the cluster token is
derived from the run id, so two jobs on the same hosts never join each other's cluster.

Which member is this host (:func:`find_local_member`): the entry whose host is ``--local-addr``
exactly, else the one whose host is this host's name (short or fully qualified), else the one
that resolves to one of this host's addresses. Two entries matching at the same level is bad
input (name one with ``--local-addr``). A member binds one address, the one it is reached at:
never all interfaces.

Invariants: a spec holds 1, 3 or 5 members with distinct ``(host, client port)`` and peer ports
that clash with no client port on the same host; bad input raises one ``ConfigurationError``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.endpoints import format_endpoint, parse_endpoints

__all__ = [
    "DEFAULT_CLIENT_PORT",
    "MEMBER_COUNTS",
    "EmbeddedCluster",
    "LocalIdentity",
    "MemberSpec",
    "cluster_token",
    "find_local_member",
    "local_identity",
    "parse_cluster",
    "resolve_host",
]

DEFAULT_CLIENT_PORT = 29410
MEMBER_COUNTS = (1, 3, 5)


@dataclass(frozen=True)
class MemberSpec:
    """One member: its name in the cluster, its host as listed and its client port."""

    name: str
    host: str
    client_port: int

    @property
    def peer_port(self) -> int:
        """The port its peers reach it on: the client port + 1."""
        return self.client_port + 1

    @property
    def client_endpoint(self) -> str:
        """``host:port`` of its client URL."""
        return format_endpoint(self.host, self.client_port)

    def url(self, scheme: str, port: int) -> str:
        """``scheme://host:port`` (an IPv6 host bracketed)."""
        return f"{scheme}://{format_endpoint(self.host, port)}"


@dataclass(frozen=True)
class EmbeddedCluster:
    """The static cluster of one job: its members, in the order listed, and its token."""

    members: tuple[MemberSpec, ...]
    token: str

    @property
    def size(self) -> int:
        """How many members the cluster has."""
        return len(self.members)

    @property
    def majority(self) -> int:
        """How many members must live for the cluster to answer (its quorum)."""
        return self.size // 2 + 1

    @property
    def tolerates(self) -> int:
        """How many members the cluster may lose and still answer."""
        return self.size - self.majority

    @property
    def client_endpoints(self) -> list[str]:
        """Every member's client ``host:port``, in the order listed."""
        return [m.client_endpoint for m in self.members]

    def describe(self) -> str:
        """``m1=h1:29410, m2=h2:29410, ...`` for messages and ``--print-config``."""
        return ", ".join(f"{m.name}={m.client_endpoint}" for m in self.members)

    def initial_cluster(self, peer_scheme: str) -> str:
        """The ``--initial-cluster`` value: every member's name and peer URL."""
        return ",".join(f"{m.name}={m.url(peer_scheme, m.peer_port)}" for m in self.members)


def cluster_token(run_id: str) -> str:
    """The cluster token of a job: the same on every host, distinct per run id."""
    return "elastic-run-" + hashlib.sha256(run_id.encode()).hexdigest()[:16]


def parse_cluster(endpoint: str, run_id: str) -> EmbeddedCluster:
    """Read the members from ``--rdzv-endpoint h1[:port],h2[:port],...``.

    Raises:
        ConfigurationError: no endpoint, a bad one, a count other than 1, 3 or 5, the same
            member twice, or a peer port (client + 1) that is another member's client port.
    """
    if not endpoint or not endpoint.strip():
        raise ConfigurationError(
            "--rdzv-backend embedded-etcd needs --rdzv-endpoint h1,h2,h3 (the member hosts)"
        )
    pairs = parse_endpoints(endpoint, DEFAULT_CLIENT_PORT)
    if len(pairs) not in MEMBER_COUNTS:
        raise ConfigurationError(
            f"--rdzv-endpoint {endpoint!r} names {len(pairs)} embedded etcd members: give 3 or 5 "
            "hosts (1 for a single-host job); an even count survives no more losses than one less"
        )
    members: list[MemberSpec] = []
    for i, (host, port) in enumerate(pairs, start=1):
        if not 0 < port < 65535:
            raise ConfigurationError(
                f"--rdzv-endpoint {endpoint!r}: member port {port} must be in 1..65534 "
                "(its peer port is the next one)"
            )
        members.append(MemberSpec(f"m{i}", host, port))
    taken = {(m.host, m.client_port) for m in members}
    if len(taken) != len(members):
        raise ConfigurationError(f"--rdzv-endpoint {endpoint!r} names a member twice")
    for m in members:
        if (m.host, m.peer_port) in taken:
            raise ConfigurationError(
                f"--rdzv-endpoint {endpoint!r}: {m.host}:{m.peer_port} is {m.name}'s peer port "
                "(client port + 1) and another member's client port"
            )
    return EmbeddedCluster(tuple(members), cluster_token(run_id))


@dataclass(frozen=True)
class LocalIdentity:
    """What this host is called and where it is reached.

    Attributes:
        local_addr: ``--local-addr``, or None.
        names: the host's names (short and fully qualified).
        addresses: every address of its interfaces.
    """

    local_addr: str | None
    names: frozenset[str]
    addresses: frozenset[str]


def local_identity(local_addr: str | None) -> LocalIdentity:
    """This host's identity: ``--local-addr``, its names and its interface addresses."""
    import psutil

    names = {socket.gethostname()}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    addresses = {
        _plain(a.address)
        for nics in psutil.net_if_addrs().values()
        for a in nics
        if a.family in (socket.AF_INET, socket.AF_INET6)
    }
    return LocalIdentity(local_addr, frozenset(n for n in names if n), frozenset(addresses))


def _plain(address: str) -> str:
    return address.split("%", 1)[0]


def resolve_host(host: str) -> list[str]:
    """The addresses ``host`` resolves to (itself when it is an address); [] when it does not."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return list(dict.fromkeys(_plain(str(info[4][0])) for info in infos))


def find_local_member(
    cluster: EmbeddedCluster,
    me: LocalIdentity,
    resolve: Callable[[str], Sequence[str]] = resolve_host,
) -> tuple[MemberSpec, str] | None:
    """Which member this host runs, and the address it binds; None when it runs none.

    Args:
        cluster: the members.
        me: this host's identity.
        resolve: host name -> its addresses.

    Returns:
        The member and the one address to listen on: ``--local-addr`` or the listed host
        when they are an address, else the first of the host's addresses that is local.

    Raises:
        ConfigurationError: several members match this host equally.
    """
    levels: list[Callable[[MemberSpec], str | None]] = [
        lambda m: _bind_of(m.host, resolve, me.addresses) if m.host == me.local_addr else None,
        lambda m: _bind_of(m.host, resolve, me.addresses) if m.host in me.names else None,
        lambda m: _local_address(resolve(m.host), me.addresses),
    ]
    for level in levels:
        found = [(m, bind) for m in cluster.members if (bind := level(m)) is not None]
        if len(found) > 1:
            raise ConfigurationError(
                "this host matches several embedded etcd members ("
                + ", ".join(m.client_endpoint for m, _ in found)
                + "): give --local-addr with the host of one of them"
            )
        if found:
            return found[0]
    return None


def _local_address(addresses: Iterable[str], local: frozenset[str]) -> str | None:
    return next((a for a in addresses if a in local), None)


def _bind_of(
    host: str, resolve: Callable[[str], Sequence[str]], local: frozenset[str]
) -> str | None:
    """The address a member listed as ``host`` (this host) listens on."""
    addresses = list(resolve(host))
    if not addresses:
        return None
    return _local_address(addresses, local) or addresses[0]
