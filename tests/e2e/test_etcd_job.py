"""A two-node job on a real 3-member etcd cluster goes on when the cluster loses a member.

One member is SIGKILLed while the second agent is still to join (the rendezvous completes
through the others), and, once that member is back, another one is SIGKILLed while the workers
run (heartbeats and the exit barrier go on through the survivors). The job ends with exit 0 on
both nodes and leaves no process behind.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic_run.rendezvous.etcd.server import EtcdServer
from tests.machine import require_etcd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agent_jobs import Job, start_job, stop_job  # noqa: E402
from helpers import no_process_left, wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(name="cluster")
def cluster_fixture() -> Iterator[EtcdServer]:
    require_etcd()
    server = EtcdServer(members=3)
    server.start(timeout_s=60)
    try:
        yield server
    finally:
        server.stop()


def test_job_survives_losing_an_etcd_member(cluster: EtcdServer, tmp_path: Path) -> None:
    endpoints = ",".join(cluster.endpoints)

    def kill_a_member_while_joining(job: Job) -> None:
        wait_until(lambda: "rendezvous.joining" in job.log(0), 60, message=lambda: job.log(0))
        cluster.kill_member(0)

    job = start_job(
        tmp_path,
        "etcd",
        endpoints,
        nprocs=[1, 1],
        extra=["--rdzv-conf", "read_timeout=10"],
        after_first=kill_a_member_while_joining,
    )
    try:
        assert not cluster.is_member_running(0)
        cluster.restart_member(0)
        cluster.kill_member(1)
        (job.out / "go").touch()
        for index, agent in enumerate(job.agents):
            assert agent.wait(90) == 0, job.log(index)
        assert no_process_left(job.worker_pids())
        for index in range(2):
            assert "agent exits with code 0" in job.log(index)
    finally:
        stop_job(job)
