"""Several hosts on one machine: network namespaces on a bridge, with partitions on demand.

``Hosts(3)`` builds, as root:

    er<id>br        a namespace holding the bridge ``br0`` (the "switch")
    er<id>h1..hN    one namespace per host, each with ``lo`` and ``eth0`` = 10.77.<k>.<i>/24,
                    a veth whose other end is a port of ``br0``

``partition(i)`` takes host i's bridge port down: its packets are dropped silently (no reset, no
"unreachable"), as when a cable or a switch port dies; ``heal(i)`` brings it back. ``limit(i,
rate)`` rate-limits host i's link both ways (``tc ... tbf``, this kernel has no netem), as a
slow NIC or a bad cable would. ``run(i, argv)``
starts a process inside host i's namespace (``ip netns exec``). ``close()`` kills every process
started through it and deletes the namespaces.

Root only (``ip netns``): ``require_hosts()`` fails the calling test in one line when this
process is not root or iproute2 is missing (``scripts/setup.sh`` installs it).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from tests.machine import require_linux, require_program, require_root

__all__ = ["Hosts", "require_hosts"]

_SUBNETS_USED: set[int] = set()


def require_hosts() -> None:
    """Fail the test in one line unless this process may build hosts: root, and iproute2.

    Off Linux (no network namespaces at all) the test is skipped instead.
    """
    require_linux("network namespaces")
    require_root("network namespaces (ip netns)")
    require_program("ip", "iproute2")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Hosts:
    """``n`` hosts on one bridge (see the module docstring)."""

    def __init__(self, n: int) -> None:
        self.tag = f"er{secrets.token_hex(3)}"
        self.bridge_ns = f"{self.tag}br"
        self.names = [f"{self.tag}h{i}" for i in range(1, n + 1)]
        subnet = next(k for k in range(77, 250) if k not in _SUBNETS_USED)
        _SUBNETS_USED.add(subnet)
        self._subnet = subnet
        self.addrs = [f"10.{subnet}.0.{i}" for i in range(1, n + 1)]
        self._procs: list[subprocess.Popen[bytes]] = []
        self._made: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        _ip("netns", "add", self.bridge_ns)
        self._made.append(self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        _ip("-n", self.bridge_ns, "link", "set", "lo", "up")
        for i, (name, addr) in enumerate(zip(self.names, self.addrs, strict=True), start=1):
            _ip("netns", "add", name)
            self._made.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
            # One veth: eth0 in the host, p<i> in the bridge namespace, a port of br0.
            _ip("-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}",
                "netns", self.bridge_ns)  # fmt: skip
            _ip("-n", name, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", self.bridge_ns, "link", "set", f"p{i}", "master", "br0")
            _ip("-n", self.bridge_ns, "link", "set", f"p{i}", "up")

    def addr(self, i: int) -> str:
        """Host i's address (1-based)."""
        return self.addrs[i - 1]

    def partition(self, i: int) -> None:
        """Cut host i off: its bridge port goes down, packets are dropped silently."""
        _ip("-n", self.bridge_ns, "link", "set", f"p{i}", "down")

    def heal(self, i: int) -> None:
        """Bring host i's bridge port back."""
        _ip("-n", self.bridge_ns, "link", "set", f"p{i}", "up")

    def limit(self, i: int, rate: str) -> None:
        """Rate-limit host i's link both ways to ``rate`` (tc's units, e.g. ``100mbit``): a token
        bucket on its ``eth0`` (what it sends) and on its bridge port (what it receives)."""
        tbf = ["root", "tbf", "rate", rate, "burst", "64kb", "latency", "200ms"]
        for ns, dev in ((self.names[i - 1], "eth0"), (self.bridge_ns, f"p{i}")):
            subprocess.run(
                ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, *tbf],
                check=True,
                capture_output=True,
                timeout=30,
            )

    def run(
        self,
        i: int,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdout: IO[bytes] | int | None = None,
        cwd: str | Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside host i (its own session, so it can be signalled alone)."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.names[i - 1], *argv],
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT if stdout is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
        self._procs.append(proc)
        return proc

    def close(self) -> None:
        """Kill every process started here (their sessions), then delete the namespaces."""
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        self._made.clear()
        _SUBNETS_USED.discard(self._subnet)
