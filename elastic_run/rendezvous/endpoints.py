"""Rendezvous endpoints: parsing ``host[:port]`` and lists of them, for every backend.

One rule splits a host from its port, and both parsers use it:
- ``[v6addr]:port`` or ``[v6addr]``: the brackets hold the host;
- ``host:port`` with exactly one colon: a name or an IPv4 address and a port;
- anything else (no colon, or a bare IPv6 address with several): all host, default port.

Invariants: a parsed host is never empty; a parsed port is an integer in 0..65535; bad
input raises one ``ConfigurationError`` that quotes the endpoint.
"""

from __future__ import annotations

import re

from elastic_run.errors import ConfigurationError

__all__ = [
    "C10D_DEFAULT_PORT",
    "ETCD_DEFAULT_PORT",
    "format_endpoint",
    "parse_endpoint",
    "parse_endpoints",
    "parse_rendezvous_endpoint",
]

C10D_DEFAULT_PORT = 29400
ETCD_DEFAULT_PORT = 2379
# torch's rule for a host: labels, an IPv4 address or an IPv6 address (word characters, dots,
# colons and dashes), nothing else.
_HOST_CHARS = re.compile(r"[\w.:-]+")


def parse_endpoint(endpoint: str, default_port: int = C10D_DEFAULT_PORT) -> tuple[str, int]:
    """Split ``host[:port]`` (``[v6]:port`` too) into a host and a port.

    Args:
        endpoint: the endpoint; surrounding blanks are ignored.
        default_port: the port of an endpoint that names none.

    Returns:
        The host (without IPv6 brackets) and the port.

    Raises:
        ConfigurationError: the port is not a number in 0..65535, the host is empty or a
            ``[`` is not closed.
    """
    text = endpoint.strip()
    host, port_text = text, ""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ConfigurationError(f"bad rendezvous endpoint '{endpoint}': unclosed '['")
        host, rest = text[1:end], text[end + 1 :]
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    if not host:
        raise ConfigurationError(f"bad rendezvous endpoint '{endpoint}': no host")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigurationError(
            f"bad rendezvous endpoint '{endpoint}': port '{port_text}' is not in 0..65535"
        )
    return host, int(port_text)


def parse_endpoints(endpoint: str, default_port: int = ETCD_DEFAULT_PORT) -> list[tuple[str, int]]:
    """Parse ``host[:port][,host[:port]...]`` into ``(host, port)`` pairs.

    Each part is read by ``parse_endpoint``, after dropping a scheme prefix
    (``http://``, ``https://``) and a trailing ``/``; empty parts are skipped.

    Args:
        endpoint: one or several comma-separated endpoints.
        default_port: the port of an endpoint that names none.

    Returns:
        The endpoints in the order given.

    Raises:
        ConfigurationError: when no endpoint is given or one of them is bad.
    """
    result: list[tuple[str, int]] = []
    for raw in endpoint.split(","):
        part = raw.strip()
        if "://" in part:
            part = part.split("://", 1)[1]
        part = part.rstrip("/")
        if part:
            result.append(parse_endpoint(part, default_port))
    if not result:
        raise ConfigurationError(
            f"no rendezvous endpoint given in '{endpoint}' (expected host[:port][,host[:port]...])"
        )
    return result


def format_endpoint(host: str, port: int) -> str:
    """The ``host:port`` form of an endpoint, bracketing an IPv6 host (``[::1]:2379``).

    ``parse_endpoint`` reads it back as ``(host, port)``.
    """
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_rendezvous_endpoint(endpoint: str | None, default_port: int) -> tuple[str, int]:
    """Split ``host[:port]`` as torch's ``parse_rendezvous_endpoint`` does.

    The same rule as :func:`parse_endpoint`, with torch's two additions: no endpoint (None or
    blank) means ``localhost`` at ``default_port``, and a host may hold only word characters,
    dots, colons and dashes.

    Args:
        endpoint: ``host[:port]``, ``[v6addr][:port]``, or None.
        default_port: the port of an endpoint that names none.

    Returns:
        The host (without IPv6 brackets) and the port.

    Raises:
        ConfigurationError: a bad or missing port after ``:``, or a bad host (a ``ValueError``,
            as torch raises).
    """
    if endpoint is None or not endpoint.strip():
        return "localhost", default_port
    if endpoint.strip().endswith(":"):
        raise ConfigurationError(f"bad rendezvous endpoint '{endpoint}': no port after ':'")
    host, port = parse_endpoint(endpoint, default_port)
    if not _HOST_CHARS.fullmatch(host):
        raise ConfigurationError(
            f"bad rendezvous endpoint '{endpoint}': the host must be a name, an IPv4 address or "
            "an IPv6 address"
        )
    return host, port
