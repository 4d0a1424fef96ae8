"""Extending the agent as torch's docs say: subclass SimpleElasticAgent or LocalElasticAgent.

torch's agent page: extend ``SimpleElasticAgent`` and implement ``_start_workers(worker_group)
-> dict[int, Any]`` (local rank -> worker id), ``_stop_workers(worker_group)``,
``_monitor_workers(worker_group) -> RunResult`` and ``_shutdown(death_sig=SIGTERM,
timeout=30)``; ``_rendezvous(worker_group)`` assigns the group's ranks; ``run(role)`` drives
them and ``get_worker_group()`` returns the group. A group that is FAILED or UNHEALTHY is
restarted while restarts remain. These subclasses are written from that description alone,
with real worker processes and a real c10d store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from elastic_run.agent.api import RunResult, WorkerGroup, WorkerSpec, WorkerState
from elastic_run.agent.local import LocalElasticAgent
from elastic_run.agent.loop.simple import SimpleElasticAgent
from elastic_run.agent.workers.logs_specs import DefaultLogsSpecs
from elastic_run.elastic.multiprocessing.errors import ProcessFailure
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.registry import get_rendezvous_handler
from tests.compat import agent_targets

pytestmark = pytest.mark.timeout(180)


def spec_for(entrypoint: Any, args: tuple[Any, ...] = (), max_restarts: int = 0) -> WorkerSpec:
    params = RendezvousParameters("c10d", "127.0.0.1:0", f"subclass-{uuid.uuid4().hex[:8]}", 1, 1)
    return WorkerSpec(
        role="default",
        local_world_size=2,
        rdzv_handler=get_rendezvous_handler(params),
        entrypoint=entrypoint,
        args=args,
        max_restarts=max_restarts,
        monitor_interval=0.05,
    )


class PopenAgent(SimpleElasticAgent):
    """A custom agent: each worker is ``python -c CODE`` with RANK and WORLD_SIZE set."""

    def __init__(self, spec: WorkerSpec, out: Path) -> None:
        super().__init__(spec, exit_barrier_timeout=30)
        self.out = out
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.starts = 0
        self.stops = 0

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        self.starts += 1
        (code,) = worker_group.spec.args
        for worker in worker_group.workers:
            env = dict(os.environ)
            env["RANK"] = str(worker.global_rank)
            env["WORLD_SIZE"] = str(worker.world_size)
            env["ATTEMPT"] = str(self.starts)
            env["OUT"] = str(self.out)
            self.procs[worker.local_rank] = subprocess.Popen(
                [str(worker_group.spec.entrypoint), "-c", code], env=env
            )
        return {lr: p.pid for lr, p in self.procs.items()}

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        self.stops += 1
        self._shutdown()

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(death_sig)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        codes = {lr: p.poll() for lr, p in self.procs.items()}
        failed = {lr: c for lr, c in codes.items() if c not in (None, 0)}
        if failed:
            return RunResult(
                WorkerState.FAILED,
                failures={
                    worker_group.workers[lr].global_rank: ProcessFailure(
                        lr, self.procs[lr].pid, code, "<N/A>"
                    )
                    for lr, code in failed.items()
                },
            )
        if all(c == 0 for c in codes.values()):
            return RunResult(
                WorkerState.SUCCEEDED,
                return_values={w.global_rank: None for w in worker_group.workers},
            )
        return RunResult(WorkerState.HEALTHY)


WRITE_RANK = (
    "import os, pathlib\n"
    "pathlib.Path(os.environ['OUT'], 'rank-' + os.environ['RANK']).write_text("
    "os.environ['WORLD_SIZE'])\n"
)


def test_a_simple_elastic_agent_subclass_runs_its_own_workers(tmp_path: Path) -> None:
    agent = PopenAgent(spec_for(sys.executable, (WRITE_RANK,)), tmp_path)
    assert agent.get_worker_group().group_rank is None

    result = agent.run()

    assert result.state == WorkerState.SUCCEEDED
    assert result.return_values == {0: None, 1: None}
    assert sorted(p.name for p in tmp_path.glob("rank-*")) == ["rank-0", "rank-1"]
    assert (tmp_path / "rank-1").read_text() == "2"
    assert agent.get_worker_group().group_rank == 0
    assert agent.get_worker_group().state == WorkerState.SUCCEEDED


FAIL_FIRST = "import os, sys\nsys.exit(3 if os.environ['ATTEMPT'] == '1' else 0)\n"


def test_a_failing_group_is_stopped_and_started_again_through_the_subclass(
    tmp_path: Path,
) -> None:
    agent = PopenAgent(spec_for(sys.executable, (FAIL_FIRST,), max_restarts=1), tmp_path)
    result = agent.run()
    assert result.state == WorkerState.SUCCEEDED
    assert agent.starts == 2 and agent.stops >= 1

    agent = PopenAgent(spec_for(sys.executable, ("import sys; sys.exit(3)",)), tmp_path)
    failed = agent.run()
    assert failed.is_failed()
    # the workers that had exited when the group was seen failing (one, or both)
    assert failed.failures and set(failed.failures) <= {0, 1}
    assert {f.exitcode for f in failed.failures.values()} == {3}


class RecordingAgent(LocalElasticAgent):
    """A LocalElasticAgent whose overrides record each call and defer to torch's behaviour.

    With ``release``, the first healthy check reports the group UNHEALTHY and creates the
    file its workers wait for.
    """

    def __init__(
        self, spec: WorkerSpec, logs_specs: DefaultLogsSpecs, release: Path | None = None
    ) -> None:
        super().__init__(spec, logs_specs, "spawn", 30)
        self.calls: list[str] = []
        self.ranks_at_start: list[list[int]] = []
        self.release = release

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        self.calls.append("rendezvous")
        super()._rendezvous(worker_group)
        assert worker_group.group_rank == 0 and worker_group.group_world_size == 1

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        self.calls.append("start")
        self.ranks_at_start.append([w.global_rank for w in worker_group.workers])
        ids = super()._start_workers(worker_group)
        assert sorted(ids) == [0, 1]
        return ids

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = super()._monitor_workers(worker_group)
        if self.release is not None and result.state == WorkerState.HEALTHY:
            self.release.write_text("go")
            self.release = None
            self.calls.append("unhealthy")
            return RunResult(WorkerState.UNHEALTHY)
        return result

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        self.calls.append("stop")
        super()._stop_workers(worker_group)

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        self.calls.append(f"shutdown:{death_sig.name}")
        super()._shutdown(death_sig, timeout)

    def _initialize_workers(self, worker_group: WorkerGroup) -> None:
        self.calls.append("initialize")
        super()._initialize_workers(worker_group)

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        self.calls.append("restart")
        super()._restart_workers(worker_group)


def test_local_elastic_agent_overrides_are_called_with_torchs_arguments(tmp_path: Path) -> None:
    agent = RecordingAgent(spec_for(agent_targets.report, ("x",)), DefaultLogsSpecs(str(tmp_path)))
    result = agent.run()
    assert result.state == WorkerState.SUCCEEDED
    assert sorted(result.return_values) == [0, 1]
    assert agent.calls[:3] == ["initialize", "rendezvous", "start"]
    assert agent.ranks_at_start == [[0, 1]]


def test_an_unhealthy_group_is_restarted_as_torch_does(tmp_path: Path) -> None:
    go = tmp_path / "go"
    agent = RecordingAgent(
        spec_for(agent_targets.wait_for_file, (str(go),), max_restarts=1),
        DefaultLogsSpecs(str(tmp_path / "logs")),
        release=go,
    )
    result = agent.run()
    assert result.state == WorkerState.SUCCEEDED
    assert result.return_values == {0: "0", 1: "1"}
    after = agent.calls[agent.calls.index("unhealthy") :]
    # As torch's loop: the group is restarted through _restart_workers, which stops it once
    # and initializes it again (rendezvous, start).
    assert after[:7] == [
        "unhealthy",
        "restart",
        "stop",
        "shutdown:SIGTERM",
        "initialize",
        "rendezvous",
        "start",
    ], after
