"""No etcd data left behind (issue 41): an etcd member's data folder goes with its owner, however
the owner ends, with real processes.

- ``elastic-run etcd``: SIGTERM and SIGINT remove its folder. Its whole process tree SIGKILLed
  at once (frozen first, so that nothing of it runs a line more, as under a cgroup kill or
  Slurm's KillWait) leaves the folder; the next ``elastic-run`` started on the host (here
  ``elastic-run --version``) removes it, and not the folder of an ``elastic-run etcd`` that runs.
- The embedded etcd member of a one-host job: the agent, its keeper and etcd SIGKILLed together
  leave the folder; the next ``elastic-run`` removes it, and keeps the folder of a job that runs,
  which its own keeper removes when that job ends.

The folders live in the session's private temp folder (tests/conftest.py), which the
processes here inherit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

import psutil
import pytest

from tests.forked_agents import cli_command
from tests.helpers import agent_env, free_port_pair, freeze, wait_until
from tests.machine import require_etcd

pytestmark = pytest.mark.timeout(240)

IDLE = """
import sys, time
from pathlib import Path
Path(sys.argv[1]).touch()
while not Path(sys.argv[2]).exists():
    time.sleep(0.05)
"""


def _etcd_folders(run_id: str = "") -> set[Path]:
    prefix = f"elastic-run-etcd-{run_id}-" if run_id else "elastic-run-etcd-"
    return {p for p in Path(tempfile.gettempdir()).glob(prefix + "*") if p.is_dir()}


def _start(args: list[str], tmp_path: Path, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*cli_command(), *args],
        env=agent_env(),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=(tmp_path / f"{name}.out").open("w"),
        stderr=subprocess.STDOUT,
        text=True,
    )


def _output(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"{name}.out").read_text(errors="replace")


def _kill_tree_at_once(root: subprocess.Popen[str]) -> list[int]:
    """Freeze the process and all its descendants, then SIGKILL them all: none runs again."""
    procs = [psutil.Process(root.pid), *psutil.Process(root.pid).children(recursive=True)]
    for proc in procs:
        freeze(proc.pid)
    for proc in procs:
        os.kill(proc.pid, signal.SIGKILL)
    root.wait(30)
    psutil.wait_procs(procs, timeout=30)
    return [p.pid for p in procs]


def _next_elastic_run() -> None:
    done = subprocess.run(
        [*cli_command(), "--version"], env=agent_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # the reclaim says nothing


def _etcd_server(tmp_path: Path, name: str) -> tuple[subprocess.Popen[str], Path]:
    before = _etcd_folders()
    proc = _start(["etcd"], tmp_path, name)
    wait_until(
        lambda: "--rdzv-endpoint" in _output(tmp_path, name) or proc.poll() is not None,
        60,
        message=lambda: _output(tmp_path, name),
    )
    assert proc.poll() is None, _output(tmp_path, name)
    (folder,) = _etcd_folders() - before
    assert f"logs in {folder}" in _output(tmp_path, name)
    return proc, folder


def test_elastic_run_etcd_leaves_no_folder_however_it_ends(tmp_path: Path) -> None:
    require_etcd()
    for sig in (signal.SIGTERM, signal.SIGINT):
        proc, folder = _etcd_server(tmp_path, sig.name)
        proc.send_signal(sig)
        assert proc.wait(60) == 0, _output(tmp_path, sig.name)
        assert not folder.exists(), sig.name

    live, live_folder = _etcd_server(tmp_path, "live")
    killed, killed_folder = _etcd_server(tmp_path, "killed")
    pids = _kill_tree_at_once(killed)
    assert len(pids) == 2  # elastic-run etcd and its etcd member
    assert killed_folder.is_dir()  # nothing of it ran to remove it
    _next_elastic_run()
    assert not killed_folder.exists()
    assert live_folder.is_dir() and live.poll() is None  # its owner lives: kept, untouched
    live.send_signal(signal.SIGTERM)
    assert live.wait(60) == 0
    assert not live_folder.exists()


def _embedded_job(tmp_path: Path, name: str) -> tuple[subprocess.Popen[str], str, Path]:
    run_id = f"left-{name}-{uuid.uuid4().hex[:6]}"
    port = free_port_pair()
    script = tmp_path / "idle.py"
    script.write_text(IDLE)
    args = [
        "--nnodes", "1", "--rdzv-backend", "embedded-etcd", "--rdzv-endpoint",
        f"127.0.0.1:{port}", "--rdzv-id", run_id, "--local-addr", "127.0.0.1",
        "--log-dir", str(tmp_path / f"logs-{name}"), "--no-live", "--no-warm-start",
        str(script), str(tmp_path / f"{name}.running"), str(tmp_path / f"{name}.go"),
    ]  # fmt: skip
    proc = _start(args, tmp_path, name)
    wait_until(
        lambda: (tmp_path / f"{name}.running").exists() or proc.poll() is not None,
        120,
        message=lambda: _output(tmp_path, name),
    )
    assert proc.poll() is None, _output(tmp_path, name)
    (folder,) = _etcd_folders(run_id)
    return proc, run_id, folder


def test_an_embedded_member_sigkilled_with_its_whole_tree_is_reclaimed_by_the_next_run(
    tmp_path: Path,
) -> None:
    require_etcd()
    live, _, live_folder = _embedded_job(tmp_path, "live")
    killed, _, killed_folder = _embedded_job(tmp_path, "killed")
    pids = _kill_tree_at_once(killed)
    assert len(pids) >= 4  # the agent, its keeper, etcd and the worker (and what else runs)
    assert killed_folder.is_dir() and (killed_folder / "data").is_dir()
    _next_elastic_run()
    assert not killed_folder.exists()
    assert live_folder.is_dir() and live.poll() is None
    (tmp_path / "live.go").touch()
    assert live.wait(120) == 0, _output(tmp_path, "live")
    wait_until(lambda: not live_folder.exists(), 30, "the live job's keeper to remove its folder")
