"""The gloo loopback warning: said when the host name resolves to loopback only and the node
advertises another address; silent with GLOO_SOCKET_IFNAME or on a single host."""

from __future__ import annotations

from elastic_run.agent.workers.gloo_check import gloo_loopback_warning

_NAMES = {
    "vm": ["127.0.1.1"],
    "good": ["10.0.0.5"],
    "10.0.0.5": ["10.0.0.5"],
    "127.0.0.1": ["127.0.0.1"],
    "nowhere": [],
}


def _warn(advertised: str, hostname: str, env: dict[str, str] | None = None) -> str | None:
    return gloo_loopback_warning(
        advertised,
        env or {},
        hostname=hostname,
        resolve=lambda name: _NAMES.get(name, []),
        interface_of=lambda addr: "eth0" if addr == "10.0.0.5" else None,
    )


def test_a_loopback_host_name_with_a_routable_address_is_one_line_with_the_fix() -> None:
    text = _warn("10.0.0.5", "vm")
    assert text is not None and "\n" not in text
    assert "'vm' resolves to 127.0.1.1" in text
    assert "GLOO_SOCKET_IFNAME=eth0" in text and "NCCL_SOCKET_IFNAME=eth0" in text
    unresolved = _warn("10.0.0.5", "nowhere")
    assert unresolved is not None and "falls back to 127.0.0.1" in unresolved


def test_no_warning_when_gloo_is_told_or_would_bind_a_usable_address() -> None:
    assert _warn("10.0.0.5", "vm", {"GLOO_SOCKET_IFNAME": "eth0"}) is None
    assert _warn("10.0.0.5", "good") is None
    assert _warn("127.0.0.1", "vm") is None  # every node on this host
