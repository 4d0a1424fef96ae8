"""gRPC's fork handlers: off, a process with a busy etcd client forks children safely.

Each case runs in a fresh interpreter: gRPC reads GRPC_ENABLE_FORK_SUPPORT when it loads.
``scripts/probe_grpc_fork.py`` measures the three settings side by side.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from etcd_fixtures import requires_etcd

REPO = Path(__file__).resolve().parents[2]

_SPAWNER = textwrap.dedent(
    """
    import ctypes, signal, subprocess, sys, threading
    from elastic_run.rendezvous.etcd.grpc_fork import disable_grpc_fork_handlers

    assert disable_grpc_fork_handlers()
    from elastic_run.rendezvous.api import RendezvousParameters
    from elastic_run.rendezvous.etcd.backend import create_etcd_backend
    from elastic_run.rendezvous.etcd.server import EtcdServer

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    server = EtcdServer()
    server.start()
    backend = create_etcd_backend(
        RendezvousParameters("etcd", server.endpoint, "fork", 1, 1, read_timeout="10")
    )
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            backend.heartbeat("n0")
            backend.set("k", b"v")
            backend.wait_for(["never"], 0.05)

    thread = threading.Thread(target=busy)
    thread.start()
    codes = []
    try:
        for _ in range(int(sys.argv[1])):
            proc = subprocess.Popen(
                ["true"],
                start_new_session=True,
                preexec_fn=lambda: libc.prctl(1, signal.SIGKILL, 0, 0, 0),
            )
            codes.append(proc.wait(timeout=30))
    finally:
        stop.set()
        thread.join(30)
        backend.close()
        server.stop()
    print("exit codes:", sorted(set(codes)), "of", len(codes))
    """
)


def _python(code: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    environ.update(env, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.etcd
@requires_etcd
@pytest.mark.timeout(300)
def test_children_forked_while_grpc_is_busy_all_start() -> None:
    # Without the handlers turned off, about 1 in 75 such children aborted or hung.
    done = _python(_SPAWNER, "300")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exit codes: [0] of 300" in done.stdout, done.stdout + done.stderr


def test_the_switch_must_come_before_grpc_loads() -> None:
    check = "from elastic_run.rendezvous.etcd.grpc_fork import disable_grpc_fork_handlers as off\n"
    first = _python(
        check + "import os, sys\n"
        "print(off(), off(), 'grpc' in sys.modules, os.environ['GRPC_ENABLE_FORK_SUPPORT'])"
    )
    assert first.stdout.split() == ["True", "True", "False", "false"], first.stderr
    late = _python("import grpc\n" + check + "print(off())")
    assert late.stdout.split() == ["False"], late.stderr
    assert "fork handlers could be turned off" in late.stderr
    chosen = _python(check + "import os\nprint(off(), os.environ['GRPC_ENABLE_FORK_SUPPORT'])",
                     GRPC_ENABLE_FORK_SUPPORT="true")  # fmt: skip
    assert chosen.stdout.split() == ["False", "true"], chosen.stderr
