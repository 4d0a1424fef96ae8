"""The elastic agent called as torch's docs call it: construct, run, fail, inspect the results.

From torch.distributed.elastic's agent page: ``LocalElasticAgent(spec, logs_specs,
start_method="spawn", exit_barrier_timeout=300, log_line_prefix_template=None)`` runs a
``WorkerSpec(role, local_world_size, rdzv_handler, entrypoint=..., args=...)``; a callable
entrypoint runs in each worker process started by ``start_method``, and ``run()`` returns a
``RunResult`` whose ``return_values`` are the workers' return values by GLOBAL rank (a binary
has none: the field "may be empty" or hold None) and whose ``failures`` hold a
``ProcessFailure`` per failed global rank (its error file as torch's ``@record`` writes it).
Workers created from the same multiprocessing context may share a queue passed as an argument.
Every test runs real worker processes on a real c10d TCPStore rendezvous.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastic_run.agent.api import RunResult, WorkerSpec, WorkerState
from elastic_run.agent.local import LocalElasticAgent
from elastic_run.agent.workers.logs_specs import DefaultLogsSpecs
from elastic_run.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.registry import get_rendezvous_handler
from tests.compat import agent_targets
from tests.forked_agents import cli_command
from tests.helpers import REPO_ROOT, free_port, is_alive, wait_until

pytestmark = pytest.mark.timeout(300)

ROLES = Path(__file__).with_name("agent_roles.py")
START_S = 120.0  # agents and workers importing torch on a loaded 2-core machine


def make_agent(
    tmp_path: Path,
    entrypoint: Any,
    args: tuple[Any, ...] = (),
    *,
    nproc: int = 2,
    start_method: str = "spawn",
    max_restarts: int = 0,
) -> LocalElasticAgent:
    params = RendezvousParameters(
        backend="c10d",
        endpoint="127.0.0.1:0",
        run_id=f"compat-{uuid.uuid4().hex[:8]}",
        min_nodes=1,
        max_nodes=1,
    )
    spec = WorkerSpec(
        role="trainer",
        local_world_size=nproc,
        rdzv_handler=get_rendezvous_handler(params),
        entrypoint=entrypoint,
        args=args,
        max_restarts=max_restarts,
        monitor_interval=0.05,
    )
    return LocalElasticAgent(spec, DefaultLogsSpecs(log_dir=str(tmp_path / "logs")), start_method)


@pytest.mark.parametrize("start_method", ["spawn", "fork", "forkserver"])
def test_a_callable_runs_in_each_worker_and_its_value_comes_back_by_global_rank(
    tmp_path: Path, start_method: str
) -> None:
    agent = make_agent(tmp_path, agent_targets.report, ("hello",), start_method=start_method)
    assert agent.get_worker_group().group_rank is None  # before the first rendezvous

    result = agent.run()

    assert result.state == WorkerState.SUCCEEDED and not result.is_failed()
    assert result.failures == {}
    assert sorted(result.return_values) == [0, 1]
    for rank, value in result.return_values.items():
        env = value["env"]
        assert value["tag"] == "hello"
        assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == "0" and env["ROLE_NAME"] == "trainer"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["MASTER_ADDR"] and env["MASTER_PORT"]
        assert value["pid"] != os.getpid()
        assert value["sid"] == value["pid"], "each worker runs in a session of its own"
    group = agent.get_worker_group()
    assert group.group_rank == 0 and group.group_world_size == 1
    assert group.state == WorkerState.SUCCEEDED


def test_local_rank_in_a_string_argument_is_replaced_per_worker(tmp_path: Path) -> None:
    result = make_agent(tmp_path, agent_targets.report, ("lr${local_rank}",)).run()
    assert {r: v["tag"] for r, v in result.return_values.items()} == {0: "lr0", 1: "lr1"}


def _stopped_besides(failures: dict[int, Any], failed_rank: int) -> None:
    """``failures`` is torch's: the rank that failed, and any worker still running then, which the
    agent's stop ended with a signal (a worker that had already succeeded is not a failure)."""
    assert failed_rank in failures, failures
    others = {r: f.exitcode for r, f in failures.items() if r != failed_rank}
    assert all(code in (-signal.SIGTERM, -signal.SIGKILL) for code in others.values()), others
    assert min(failures.items(), key=lambda item: item[1].timestamp)[0] == failed_rank


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_an_exception_in_the_callable_is_a_failure_with_torchs_error_file(
    tmp_path: Path, start_method: str
) -> None:
    result = make_agent(
        tmp_path, agent_targets.fail_on, ("1", "bad lr"), start_method=start_method
    ).run()

    assert result.is_failed() and result.state == WorkerState.FAILED
    assert result.return_values == {}
    assert list(result.failures) == [1]  # torch's MultiprocessContext: the rank that failed
    failure = result.failures[1]
    assert isinstance(failure, ProcessFailure)
    assert (failure.local_rank, failure.exitcode) == (1, 1)
    assert failure.signal_name() == "<N/A>"
    assert failure.message["message"] == "ValueError: bad lr"
    assert "bad lr" in failure.message["extraInfo"]["py_callstack"]
    assert json.loads(Path(failure.error_file).read_text()) == failure.error_file_data
    assert isinstance(failure.timestamp, (int, float)) and failure.timestamp > 0
    # torchrun's way of reporting it: raise ChildFailedError from the result
    error = ChildFailedError("agent_targets.fail_on", result.failures)
    assert error.get_first_failure()[0] == 1
    assert "ValueError: bad lr" in str(error)


def test_a_failed_callable_is_restarted_and_the_new_values_come_back(tmp_path: Path) -> None:
    result = make_agent(tmp_path, agent_targets.fail_first_attempt, max_restarts=1).run()
    assert result.state == WorkerState.SUCCEEDED
    assert result.return_values == {0: 1, 1: 1}  # both ran again, with restart count 1


def test_a_worker_killed_by_a_signal_is_a_failure_without_error_file(tmp_path: Path) -> None:
    result = make_agent(tmp_path, agent_targets.kill_self, (int(signal.SIGKILL),), nproc=1).run()
    failure = result.failures[0]
    assert failure.exitcode == -signal.SIGKILL
    assert failure.signal_name() == "SIGKILL"
    assert failure.error_file == "<N/A>"
    assert "Signal 9" in failure.message


def test_sys_exit_ends_a_callable_as_a_program(tmp_path: Path) -> None:
    assert make_agent(tmp_path, agent_targets.exit_with, (0,), nproc=1).run().return_values == {
        0: None
    }
    failed = make_agent(tmp_path, agent_targets.exit_with, (3,), nproc=1).run()
    assert failed.failures[0].exitcode == 3


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_a_queue_of_the_same_multiprocessing_context_reaches_every_worker(
    tmp_path: Path, start_method: str
) -> None:
    queue = multiprocessing.get_context(start_method).Queue()
    try:
        result = make_agent(
            tmp_path, agent_targets.put_on_queue, (queue,), start_method=start_method
        ).run()
        assert result.return_values == {0: 0, 1: 1}
        got = sorted(queue.get(timeout=30) for _ in range(2))
        assert [rank for rank, _ in got] == [0, 1]
    finally:
        queue.close()
        queue.join_thread()


def test_a_lambda_cannot_be_spawned_but_can_be_forked(tmp_path: Path) -> None:
    spawned = make_agent(tmp_path, lambda: 7, nproc=1).run()
    assert spawned.is_failed() and spawned.exit_code == 1
    assert "pickle" in spawned.reason.lower(), spawned.reason

    forked = make_agent(tmp_path, lambda: 7, nproc=1, start_method="fork").run()
    assert forked.return_values == {0: 7}


def test_a_return_value_that_cannot_be_sent_back_fails_its_worker(tmp_path: Path) -> None:
    result = make_agent(tmp_path, agent_targets.unpicklable, nproc=1).run()
    assert result.failures[0].exitcode == 1
    assert "pickle" in result.failures[0].message["message"].lower()


def test_an_unknown_start_method_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="start_method"):
        make_agent(tmp_path, agent_targets.report, start_method="thread")


def test_a_program_entrypoint_has_no_return_values_and_fails_with_its_exit_code(
    tmp_path: Path,
) -> None:
    ok = make_agent(tmp_path, sys.executable, ("-c", "print('hi')")).run()
    assert ok.state == WorkerState.SUCCEEDED
    assert ok.return_values == {0: None, 1: None}  # torch: binaries have no return value

    script = tmp_path / "fail.py"
    script.write_text(
        "import os\n"
        "from torch.distributed.elastic.multiprocessing.errors import record\n"
        "@record\n"
        "def main():\n"
        "    if os.environ['RANK'] == '0':\n"
        "        raise KeyError('no such key')\n"
        "main()\n"
    )
    failed = make_agent(tmp_path, sys.executable, ("-u", str(script))).run()
    _stopped_besides(failed.failures, 0)  # torch's SubprocessContext: and those it stopped
    failure = failed.failures[0]
    assert failure.exitcode == 1
    assert failure.message["message"] == "KeyError: 'no such key'"  # torch's own @record wrote it


# -- agents as their own processes -------------------------------------------------------


def start_agent(
    out: Path, endpoint: str, nnodes: int, method: str, target: str, *args: str
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT)
    log = (out / f"agent-{uuid.uuid4().hex[:6]}.log").open("w")
    try:
        return subprocess.Popen(
            [sys.executable, str(ROLES), str(out), endpoint, str(nnodes), "2", method, target]
            + list(args),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    finally:
        log.close()


@pytest.fixture
def agents() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


def logs_of(out: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(out.glob("agent-*.log")))


def test_two_agents_report_their_workers_by_global_rank(
    tmp_path: Path, agents: list[subprocess.Popen[bytes]]
) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    for _ in range(2):
        agents.append(start_agent(tmp_path, endpoint, 2, "spawn", "report", "two"))
    for proc in agents:
        assert proc.wait(timeout=START_S) == 0, logs_of(tmp_path)
    results = [json.loads(p.read_text()) for p in tmp_path.glob("result-*.json")]
    by_node = {r["group_rank"]: r for r in results}
    assert sorted(by_node) == [0, 1]
    assert sorted(by_node[0]["return_values"]) == ["0", "1"]
    assert sorted(by_node[1]["return_values"]) == ["2", "3"]
    for node in by_node.values():
        for rank, value in node["return_values"].items():
            assert value["env"]["RANK"] == rank and value["env"]["WORLD_SIZE"] == "4"


def _pids(out: Path) -> list[int]:
    return [int(x) for p in out.glob("pids-*") for x in p.read_text().split()]


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_no_function_worker_outlives_its_agent(
    tmp_path: Path, agents: list[subprocess.Popen[bytes]], start_method: str, how: str
) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    agent = start_agent(
        tmp_path, endpoint, 1, start_method, "with_grandchild_then_wait", str(tmp_path)
    )
    agents.append(agent)
    wait_until(
        lambda: len(list(tmp_path.glob("pids-*"))) == 2,
        START_S,
        message=lambda: logs_of(tmp_path),
    )
    pids = _pids(tmp_path)
    assert len(pids) == 4 and all(is_alive(p) for p in pids)

    agent.send_signal(getattr(signal, how))
    code = agent.wait(timeout=START_S)
    assert code == (-signal.SIGKILL if how == "SIGKILL" else 128 + signal.SIGTERM), logs_of(
        tmp_path
    )
    wait_until(lambda: not any(is_alive(p) for p in pids), 60, message="workers left alive")
    # The agent's return-value folder: gone with a SIGTERM; after a SIGKILL, left until the
    # next elastic-run on the host starts (and reclaims it, its owner being gone).
    results = Path(tempfile.gettempdir()).glob("elastic-run-results-*")
    mine = [p for p in results if (p / "elastic-run.owner").read_text() == f"pid {agent.pid}\n"]
    assert len(mine) == (1 if how == "SIGKILL" else 0), mine
    if mine:
        done = subprocess.run([*cli_command(), "--version"], capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert not mine[0].exists()


def test_run_result_is_torchs_shape() -> None:
    result = RunResult(WorkerState.SUCCEEDED)
    assert result.return_values == {} and result.failures == {} and not result.is_failed()
    assert RunResult(WorkerState.FAILED).is_failed()


def test_std_and_the_deprecated_fn_field_are_torchs() -> None:
    from torch.distributed.elastic.multiprocessing import Std as Theirs

    from elastic_run.agent.config import Std

    assert [(s.name, s.value) for s in Std] == [(s.name, s.value) for s in Theirs]
    assert Std.from_str("0:1,1:2") == {0: Std.OUT, 1: Std.ERR} and Theirs.from_str("3") == 3
    assert Std.from_str("3") == Std.ALL

    # torch's static rules: a rank and an endpoint with a port (nothing connects here).
    static = RendezvousParameters("static", "127.0.0.1:29500", "x", 1, 1, rank="0")
    handler = get_rendezvous_handler(static)
    spec = WorkerSpec("trainer", 1, handler, fn=agent_targets.report)
    assert spec.entrypoint is agent_targets.report
    assert spec.get_entrypoint_name() == "report"
