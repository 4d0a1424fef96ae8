"""The link to a TCPStore host: read deadlines, broken links told apart, is this host the store's.

A TCPStore client waits for a reply as long as its socket lives, and a silent partition
(packets dropped, no reset) keeps it alive for the kernel's whole retransmission time (about
15 minutes): a heartbeat ``set`` even "succeeds" while its bytes sit unacknowledged. torch gives
no handle on the socket, so :func:`set_link_deadline` finds this process's sockets connected to
the store's address and sets ``TCP_USER_TIMEOUT`` on them: data unacknowledged for longer than
the deadline resets the connection, and the call waiting on it fails. A busy store host still
acknowledges at once (the kernel does, not the process), so load alone never trips it.

A link that broke is remade by the backend on its next call; :func:`is_unreachable` says
whether the store did not answer (a partition, which may heal: keep trying) or refused (its
host is up and nothing listens: the store is gone).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Collection

__all__ = [
    "is_link_failure",
    "is_local_host",
    "is_unreachable",
    "probe_link",
    "set_link_deadline",
]

_UNREACHABLE_WORDS = ("timed out", "timeout", "no route to host", "network is unreachable")
_LINK_WORDS = (
    *_UNREACHABLE_WORDS,
    "broken pipe",
    "connection reset",
    "connection closed",
    "connection refused",
    "remote server shutdown",
    "end of file",
    "failed to recv",
    "failed to send",
)


def _addresses(host: str, port: int) -> set[tuple[str, int]]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return set()
    return {(str(info[4][0]).removeprefix("::ffff:"), port) for info in infos}


def set_link_deadline(
    host: str, port: int, deadline_s: float, fds: Collection[int] | None = None
) -> list[int]:
    """Set ``TCP_USER_TIMEOUT`` on every socket of this process connected to ``host:port``.

    Idempotent (a socket set before is set again). Does nothing where the option is missing.

    Args:
        host: the store's host.
        port: the store's port.
        deadline_s: how long sent data may stay unacknowledged before the link is reset.
        fds: only these descriptors (those a connect may have opened); None: every one.

    Returns:
        The descriptors set.
    """
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is None:
        return []
    peers = _addresses(host, port)
    done: list[int] = []
    if fds is None:
        try:
            fds = [int(name) for name in os.listdir("/proc/self/fd")]
        except OSError:
            return []
    for fd in fds:
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            dup = os.dup(fd)
        except OSError:
            continue
        try:
            # The number may have been reused by something else since the readlink.
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)
            continue
        try:
            peer = sock.getpeername() if sock.type == socket.SOCK_STREAM else None
            # torch connects over IPv6 where it can: an IPv4 peer reads ::ffff:a.b.c.d.
            if peer is not None and (str(peer[0]).removeprefix("::ffff:"), peer[1]) in peers:
                sock.setsockopt(socket.IPPROTO_TCP, option, max(1, int(deadline_s * 1000)))
                done.append(fd)
        except OSError:
            pass  # not connected, or not TCP
        finally:
            sock.close()  # closes the duplicate only
    return done


def probe_link(host: str, port: int, timeout_s: float) -> None:
    """Open and close one TCP connection to the store: tells a refusal from no answer.

    TCPStore retries a refused connect until its timeout and then reports a timeout, so a
    store that is gone (refused: exit 4) would read like a partition (no answer: keep trying).

    Raises:
        ConnectionRefusedError: the host answered and nothing listens (the store is gone).
        OSError: no answer within ``timeout_s`` (``TimeoutError``), or no route.
    """
    with socket.create_connection((host, port), timeout=timeout_s):
        pass


def _text(exc: BaseException) -> str:
    parts: list[str] = []
    while exc is not None and len(parts) < 4:
        parts.append(str(exc).lower())
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return " ".join(parts)


def is_link_failure(exc: BaseException) -> bool:
    """Whether a store call failed because its connection broke or did not answer."""
    from torch.distributed import DistNetworkError

    return isinstance(exc, DistNetworkError) or any(w in _text(exc) for w in _LINK_WORDS)


def is_unreachable(exc: BaseException) -> bool:
    """Whether a connect failed without a refusal (the store did not answer at all)."""
    if isinstance(exc, ConnectionRefusedError):
        return False
    if isinstance(exc, TimeoutError):
        return True
    text = _text(exc)
    return "refused" not in text and any(w in text for w in _UNREACHABLE_WORDS)


def is_local_host(host: str) -> bool:
    """Return whether ``host`` names this machine (loopback, its name, or one of its addresses)."""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    for addr in (str(a) for a in addrs):
        if ipaddress.ip_address(addr.split("%")[0]).is_loopback:
            return True
        try:
            with socket.socket(
                socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_DGRAM
            ) as probe:
                probe.bind((addr, 0))
            return True
        except OSError:
            continue
    return False
