"""Plain ``torchrun`` (the installed torch's) using our rendezvous through ``torchrun.handlers``.

Two torchrun agents on 127.0.0.1 run a two-worker gloo all-reduce: once with ``etcd-v3``
against a real etcd, once with ``elastic-run-c10d`` on a real TCPStore (hosted by the first
agent's backend). Nothing of ours runs the agents: only torch's launcher, loading our handlers
by their entry point names.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic_run.rendezvous.etcd.server import EtcdServer
from tests.helpers import REPO_ROOT, free_port
from tests.integration.etcd_fixtures import etcd_server_fixture  # noqa: F401 - a fixture

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
ALLREDUCE = REPO_ROOT / "tests" / "e2e" / "scripts" / "allreduce.py"
FAIL_BEFORE_INIT = REPO_ROOT / "tests" / "e2e" / "scripts" / "fail_before_init.py"
EXIT_S = 90.0


def test_torch_registers_our_handlers_under_their_own_names() -> None:
    code = (
        "from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as r\n"
        "print(sorted(r._registry))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    names = eval(out.stdout)  # noqa: S307 - a list of names printed by the line above
    assert {"etcd-v3", "elastic-run-c10d"} <= set(names)
    assert {"c10d", "etcd", "etcd-v2", "static"} <= set(names)  # torch's own, not shadowed


@pytest.fixture(name="agents")
def agents_fixture() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _run_two(
    agents: list[subprocess.Popen[bytes]],
    backend: str,
    endpoint: str,
    tmp: Path,
    extra: tuple[str, ...] = (),
    script: Path = ALLREDUCE,
) -> list[str]:
    run_id = f"tr-{uuid.uuid4().hex[:8]}"
    logs = [tmp / f"agent{i}.log" for i in range(2)]
    for log in logs:
        agents.append(
            subprocess.Popen(
                [
                    TORCHRUN,
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "1",
                    "--rdzv-backend",
                    backend,
                    "--rdzv-endpoint",
                    endpoint,
                    "--rdzv-id",
                    run_id,
                    "--local-addr",
                    "127.0.0.1",
                    *extra,
                    str(script),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log.open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def outputs() -> list[str]:
        return [log.read_text(errors="replace") for log in logs]

    for proc in agents:
        try:
            proc.wait(timeout=EXIT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"torchrun did not exit in {EXIT_S} s: {outputs()}") from None
        assert proc.returncode == 0, outputs()
    return outputs()


def _results(outputs: list[str]) -> list[dict[str, float]]:
    found = [
        json.loads(line.split("RESULT ", 1)[1])
        for out in outputs
        for line in out.splitlines()
        if "RESULT " in line
    ]
    return sorted(found, key=lambda r: (r["rank"], r["restart"]))


@pytest.mark.etcd
@pytest.mark.timeout(240)
def test_torchrun_runs_a_two_node_job_on_etcd_v3(
    etcd_server: EtcdServer, agents: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    outputs = _run_two(agents, "etcd-v3", etcd_server.endpoint, tmp_path)
    assert _results(outputs) == [
        {"rank": 0, "sum": 3.0, "restart": 0},
        {"rank": 1, "sum": 3.0, "restart": 0},
    ], outputs


@pytest.mark.timeout(240)
def test_torchrun_runs_a_two_node_job_on_elastic_run_c10d(
    agents: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    outputs = _run_two(agents, "elastic-run-c10d", f"127.0.0.1:{free_port()}", tmp_path)
    assert _results(outputs) == [
        {"rank": 0, "sum": 3.0, "restart": 0},
        {"rank": 1, "sum": 3.0, "restart": 0},
    ], outputs


@pytest.mark.timeout(240)
def test_torchrun_restarts_both_nodes_through_our_rendezvous_keeping_node_ranks(
    agents: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    # Rank 1 fails before joining the group on its first attempt; its agent re-rendezvouses
    # (a new round, through our handler), node 0's agent sees a node waiting and restarts its
    # worker (torch counts no restart for that). Node ranks are stable, so RANK 1 stays with
    # the agent whose restart count is now 1 and the second attempt succeeds on both.
    outputs = _run_two(
        agents,
        "elastic-run-c10d",
        f"127.0.0.1:{free_port()}",
        tmp_path,
        extra=("--max-restarts", "1"),
        script=FAIL_BEFORE_INIT,
    )
    assert _results(outputs) == [
        {"rank": 0, "sum": 3.0, "restart": 0},
        {"rank": 1, "sum": 3.0, "restart": 1},
    ], outputs
