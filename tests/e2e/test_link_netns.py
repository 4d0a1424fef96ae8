"""The link check across hosts with their own links (issue 37, point 6): three network-namespace
hosts on a bridge (``tests/netns_hosts.py``), host h3's link rate-limited both ways by a token
bucket (``tc ... tbf``: this kernel has no netem). Each host runs one node of the check as an
agent would after a round formed (``link_scripts/link_node.py``: ``run_link_check`` over gloo on
the host's own ``eth0``, the store on h1, judged with ``--link-check warn``): every node names h3,
and only h3, in one warning line; nobody is excluded in warn mode.

No duration is asserted: the figures are printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import IO, Any

import pytest

from tests.helpers import REPO_ROOT
from tests.machine import require_program
from tests.netns_hosts import Hosts, require_hosts

pytestmark = pytest.mark.timeout(300)

NODE = REPO_ROOT / "tests" / "e2e" / "link_scripts" / "link_node.py"
RATE = "100mbit"  # 12.5 MB/s, where the bridge between namespaces moves hundreds of MB/s


@pytest.fixture(name="hosts")
def hosts_fixture() -> Iterator[Hosts]:
    require_hosts()
    require_program("tc", "iproute2")
    hosts = Hosts(3)
    try:
        hosts.limit(3, RATE)
        yield hosts
    finally:
        hosts.close()


def _read_until(stream: IO[bytes], prefix: str, seen: list[str]) -> str:
    for raw in stream:
        line = raw.decode(errors="replace").rstrip("\n")
        seen.append(line)
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no {prefix!r} line; the node printed: {seen}")


def test_warn_names_the_rate_limited_host_and_only_it(hosts: Hosts) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), GLOO_SOCKET_IFNAME="eth0")
    common = ["--world", "3", "--hosts", ",".join(hosts.addrs), "--mode", "warn"]
    first = hosts.run(
        1,
        [sys.executable, str(NODE), "--rank", "0", "--host-store", *common],
        env=env,
        stdout=subprocess.PIPE,
    )
    assert first.stdout is not None
    said0: list[str] = []
    port = _read_until(first.stdout, "store-port ", said0).split()[1]
    others = [
        hosts.run(
            i + 1,
            [sys.executable, str(NODE), "--rank", str(i), "--store-port", port, *common],
            env=env,
            stdout=subprocess.PIPE,
        )
        for i in (1, 2)
    ]
    outputs: list[list[str]] = []
    for proc, before in zip([first, *others], [said0, [], []], strict=True):
        out, _ = proc.communicate(timeout=240)
        lines = before + out.decode(errors="replace").splitlines()
        outputs.append(lines)
        assert proc.returncode == 0, lines
    slow_addr = hosts.addr(3)
    for rank, lines in enumerate(outputs):
        warnings = [ln for ln in lines if ln.startswith("WARNING link check")]
        print(f"node {rank} ({hosts.addr(rank + 1)}): {warnings}")
        assert len(warnings) == 1, lines
        assert f"node 2 ({slow_addr})" in warnings[0], warnings
        assert not any(hosts.addr(h) in warnings[0] for h in (1, 2)), warnings
        (report_line,) = [ln for ln in lines if ln.startswith("report ")]
        report: dict[str, Any] = json.loads(report_line.removeprefix("report "))
        print(f"  MB/s by node: {[round(b / 1e6, 1) for b in report['bandwidth_bytes_per_s']]}")
        assert report["slow"] == [2] and report["rechecked"] == [2]  # measured again: still slow
        assert not any("Error" in ln for ln in lines), lines
