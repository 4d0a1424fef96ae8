"""Would the workers' gloo bind loopback while this node advertises another address?

Without ``GLOO_SOCKET_IFNAME``, gloo binds the address this host's name resolves to. Where the
name resolves only to loopback (Debian's ``127.0.1.1`` line in /etc/hosts, or a name that does
not resolve, where torch falls back to ``127.0.0.1``), the workers of a multi-host job tell
each other a loopback address and every connection between hosts fails (torchrun does the
same). The agent knows the address it advertises, so it can say so in one line, with the fix.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable, Mapping

__all__ = ["GlooLoopbackCheck", "gloo_loopback_warning"]

log = logging.getLogger(__name__)


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


def _resolve(name: str) -> list[str]:
    try:
        return sorted({str(info[4][0]) for info in socket.getaddrinfo(name, None)})
    except OSError:
        return []


def _interface_of(addr: str) -> str | None:
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == addr for a in addrs):
            return str(name)
    return None


def gloo_loopback_warning(
    advertised: str,
    env: Mapping[str, str],
    *,
    hostname: str | None = None,
    resolve: Callable[[str], list[str]] = _resolve,
    interface_of: Callable[[str], str | None] = _interface_of,
) -> str | None:
    """Return the warning to print, or None when gloo would bind a usable address.

    Args:
        advertised: the address this node gives the others (``--local-addr`` or its own).
        env: the workers' environment (``GLOO_SOCKET_IFNAME`` set: nothing to say).
        hostname: this host's name (default: ``socket.gethostname()``).
        resolve: name -> addresses (injected by tests).
        interface_of: address -> the name of the interface holding it (injected by tests).
    """
    if env.get("GLOO_SOCKET_IFNAME"):
        return None
    mine = resolve(advertised)
    if not mine or any(_is_loopback(a) for a in mine):
        return None  # a single-host job, or an address we cannot judge
    name = hostname if hostname is not None else socket.gethostname()
    bound = resolve(name)
    if bound and not all(_is_loopback(a) for a in bound):
        return None
    shown = ", ".join(bound) if bound else "nothing (torch falls back to 127.0.0.1)"
    iface = interface_of(mine[0]) or "<the interface of " + mine[0] + ">"
    return (
        f"this host's name '{name}' resolves to {shown}: the workers' gloo would bind loopback "
        f"while this node advertises {advertised}; set GLOO_SOCKET_IFNAME={iface} "
        f"(and NCCL_SOCKET_IFNAME={iface} for NCCL)"
    )


class GlooLoopbackCheck:
    """Says the gloo loopback warning at most once per agent, for a job that spans nodes."""

    def __init__(self) -> None:
        self._done = False

    def check(
        self, group_world_size: int, advertised: str, envs: Mapping[int, Mapping[str, str]]
    ) -> None:
        """Check once, on the first attempt with more than one node (``envs``: by local rank)."""
        if group_world_size <= 1 or self._done or not envs:
            return
        self._done = True
        warning = gloo_loopback_warning(advertised, next(iter(envs.values())))
        if warning is not None:
            log.warning("%s", warning)
