"""Shared by the benchmarks: re-run the calling script in a loopback-only network namespace.

A TCPStore client's reverse DNS lookup of its peer can stall for about 5 s under concurrent
connects on a host with real interfaces; inside a fresh namespace with only ``lo`` it fails at
once, so the figures measure the launchers, not the resolver.
"""

from __future__ import annotations

import os
import shutil
import sys

_NETNS_MARK = "ELASTIC_RUN_BENCH_NETNS"


def reexec_in_netns(script: str) -> None:
    """Exec ``script`` again with the same arguments under ``unshare -n`` (root only; once)."""
    if os.environ.get(_NETNS_MARK) or os.geteuid() != 0 or shutil.which("unshare") is None:
        return
    inner = " ".join(["exec", *(f"'{a}'" for a in [sys.executable, script, *sys.argv[1:]])])
    env = dict(os.environ, **{_NETNS_MARK: "1"})
    os.execvpe("unshare", ["unshare", "-n", "sh", "-c", f"ip link set lo up && {inner}"], env)
