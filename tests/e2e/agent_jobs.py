"""Jobs of several real ``elastic-run`` agents on 127.0.0.1, for the e2e tests.

The workers report their pid in ``<out>/ready-<RANK>`` and then wait for ``<out>/go``, so a test
can look at a job while it is complete and healthy, then let it finish (or end it otherwise).
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from helpers import REPO_ROOT, wait_until

from tests.forked_agents import AgentProcess, cli_command, start_agent

__all__ = ["CLI", "WORKER", "Job", "cli_env", "start_job", "stop_job"]

CLI = cli_command()

WORKER = """\
import os, sys, time
from pathlib import Path
out = Path(sys.argv[1])
rank = os.environ["RANK"]
(out / f"ready-{rank}").write_text(str(os.getpid()))
while not (out / "go").exists():
    time.sleep(0.05)
"""


@dataclass
class Job:
    """A running job: its agents, where it reports, how to address its rendezvous."""

    run_id: str
    backend: str
    endpoint: str
    out: Path
    agents: list[AgentProcess]
    nprocs: list[int]

    @property
    def rdzv_args(self) -> list[str]:
        return ["--rdzv-backend", self.backend, "--rdzv-endpoint", self.endpoint]

    def ready_pids(self) -> dict[int, int]:
        found = {}
        for path in self.out.glob("ready-*"):
            text = path.read_text()
            if text:
                found[int(path.name.split("-")[1])] = int(text)
        return found

    def worker_pids(self) -> list[int]:
        return list(self.ready_pids().values())

    def log(self, index: int) -> str:
        return (self.out / f"agent{index}.log").read_text(errors="replace")


def cli_env() -> dict[str, str]:
    """The environment for the CLI: this one, with the repository importable, unbuffered (as
    ``cli_harness.clean_env``: one set of start-up variables, one agent template)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def start_job(
    tmp_path: Path,
    backend: str,
    endpoint: str,
    nprocs: list[int],
    nnodes: str | None = None,
    extra: list[str] | None = None,
    after_first: Callable[[Job], None] | None = None,
    script: str = WORKER,
) -> Job:
    """Start one agent per entry of ``nprocs``; return once every worker reported ready.

    ``after_first(job)`` runs after the first agent started and before the others do;
    ``script`` is the workers' script (it must write ``<out>/ready-<RANK>`` as ``WORKER`` does).
    """
    worker = tmp_path / "worker.py"
    worker.write_text(script)
    out = tmp_path / "out"
    out.mkdir()
    run_id = f"st-{uuid.uuid4().hex[:8]}"
    agents: list[AgentProcess] = []
    job = Job(run_id, backend, endpoint, out, agents, nprocs)
    for index, nproc in enumerate(nprocs):
        if index == 1 and after_first is not None:
            after_first(job)
        log = (out / f"agent{index}.log").open("wb")
        agents.append(
            start_agent(
                [
                    "--nnodes",
                    nnodes or str(len(nprocs)),
                    "--nproc-per-node",
                    str(nproc),
                    "--rdzv-backend",
                    backend,
                    "--rdzv-endpoint",
                    endpoint,
                    "--rdzv-id",
                    run_id,
                    "--local-addr",
                    "127.0.0.1",
                    "--log-dir",
                    str(tmp_path / f"logs{index}"),
                    "--no-live",
                    *(extra or []),
                    str(worker),
                    str(out),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=cli_env(),
            )
        )
    wait_until(
        lambda: len(job.ready_pids()) == sum(nprocs),
        90,
        message=lambda: f"workers did not start:\n{job.log(0)}\n---\n{job.log(1)}",
    )
    return job


def stop_job(job: Job) -> None:
    """Kill whatever of the job still runs: agents by process group, then the workers."""
    for agent in job.agents:
        if agent.poll() is None:
            try:
                os.killpg(agent.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            agent.wait(10)
    for pid in job.worker_pids():
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
