"""A worker whose process outlives its script's end, end to end: real agents, real workers.

Each worker script (``outlive_scripts/outlive.py``) prints its last line and ends, then its
process blocks in the interpreter's shutdown: a non-daemon thread that never ends, or an atexit
handler that never returns. Cold (``python -u script``, found from its stacks) and warm (the
zygote says when the script ended): the agent kills it past ``--script-exit-timeout``, reports it
with its stacks (one line naming the rank and pid, then the stacks; ``stacks.txt``; the
``worker.outlived`` event), and counts its exit as the script's own: the job succeeds after a
normal end (also in a two-node gloo job, one node warm and one cold, the issue's case: every
worker logged its last line and no process exited), fails with the script's status after ``sys.exit(3)`` (warm) or an exception recorded
by ``@record`` (cold and warm). A worker that beat and then outlived its script is not judged
hung. A warm worker killed by a signal after its script ended (an atexit handler aborts, as
torch's gloo teardown now and then does) counts as its script's status, said once with a
``worker.died_after_script`` event; a cold one stays a failure, as under torchrun. No test
asserts on a duration: each waits for the agent's exit.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import cli_harness
import pytest
from cli_harness import Agent, Launch, only_run_dir, read_events

from tests.e2e.test_multinode import FAST_CONF, Job, make_job_fixture  # noqa: F401 - a fixture
from tests.helpers import no_process_left, wait_until

launch = cli_harness.launch

pytestmark = pytest.mark.timeout(240)

SCRIPT = str(Path(__file__).resolve().parent / "outlive_scripts" / "outlive.py")
RUN = 180.0
MODES = {"cold": "--no-warm-start", "warm": "--warm-start"}


def _run(
    launch: Launch,
    tmp_path: Path,
    mode: str,
    *args: str,
    nproc: int = 2,
    options: tuple[str, ...] = (),
    bound: str = "2",
) -> Agent:
    return launch(
        [
            "--standalone",
            MODES[mode],
            "--nproc-per-node",
            str(nproc),
            "--script-exit-timeout",
            bound,
            "--log-dir",
            str(tmp_path / "logs"),
            *options,
            SCRIPT,
            *args,
        ]
    )


def _outlived(agent: Agent, tmp_path: Path) -> list[dict[str, Any]]:
    """The fields of each ``worker.outlived`` event (and no worker was judged hung)."""
    events = read_events(only_run_dir(tmp_path / "logs"))
    assert not any(e["kind"] == "worker.hung" for e in events), agent.describe()
    if agent.stderr.count("start cold") or "warm start off" in agent.stderr:
        raise AssertionError(f"a warm run started cold\n{agent.describe()}")
    return [dict(e["fields"]) for e in events if e["kind"] == "worker.outlived"]


@pytest.mark.parametrize("how", ["thread", "atexit"])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_script_that_ended_but_whose_process_lives_on_is_stopped_and_succeeds(
    launch: Launch, tmp_path: Path, mode: str, how: str
) -> None:
    agent = _run(launch, tmp_path, mode, how)
    assert agent.wait(RUN) == 0, agent.describe()
    assert "LAST LINE rank=0" in agent.stdout and "LAST LINE rank=1" in agent.stdout
    outlived = _outlived(agent, tmp_path)
    assert sorted(fields["rank"] for fields in outlived) == [0, 1], agent.describe()
    blocked_in = "_shutdown" if how == "thread" else "block_at_exit"
    for fields in outlived:
        pid, rank = fields["pid"], fields["rank"]
        assert fields["exitcode"] == 0 and fields["exitcode_known"] == (mode == "warm")
        line = next(
            line
            for line in agent.stderr.splitlines()
            if f"rank {rank} (pid {pid}) outlived" in line
        )
        assert "--script-exit-timeout 2 s" in line and "stacks in" in line, agent.describe()
        stacks = Path(str(fields["stacks"])).read_text()
        assert blocked_in in stacks and f"pid {pid}" in stacks
        assert blocked_in in agent.stderr  # the stacks follow the line
    assert "every local worker succeeded" in agent.stderr
    assert no_process_left([fields["pid"] for fields in outlived])


def test_a_warm_script_that_exited_3_counts_as_exit_3(launch: Launch, tmp_path: Path) -> None:
    agent = _run(launch, tmp_path, "warm", "atexit", "3", nproc=1)
    assert agent.wait(RUN) == 1, agent.describe()
    (fields,) = _outlived(agent, tmp_path)
    assert fields["exitcode"] == 3
    assert "exit code 3" in agent.stderr and "outlived its script's end" in agent.stderr


@pytest.mark.parametrize("mode", list(MODES))
def test_a_recorded_exception_then_a_lingering_thread_is_a_failure(
    launch: Launch, tmp_path: Path, mode: str
) -> None:
    agent = _run(launch, tmp_path, mode, "raise", nproc=1)
    assert agent.wait(RUN) == 1, agent.describe()
    (fields,) = _outlived(agent, tmp_path)
    assert fields["exitcode"] == 1
    assert "RuntimeError: the script failed at its end" in agent.stderr, agent.describe()


@pytest.mark.parametrize("mode", list(MODES))
def test_a_worker_that_beat_then_outlived_its_script_is_not_hung(
    launch: Launch, tmp_path: Path, mode: str
) -> None:
    agent = launch(
        [
            "--standalone",
            MODES[mode],
            "--hang-timeout",
            "1",
            "--script-exit-timeout",
            "4",
            "--log-dir",
            str(tmp_path / "logs"),
            SCRIPT,
            "beat",
        ]
    )
    assert agent.wait(RUN) == 0, agent.describe()
    (fields,) = _outlived(agent, tmp_path)
    assert fields["exitcode"] == 0, agent.describe()


def test_a_two_node_gloo_job_whose_workers_all_linger_ends_with_exit_0(make_job: Any) -> None:
    job: Job = make_job(("c10d", ""))
    for name, warmth in (("a", "--warm-start"), ("b", "--no-warm-start")):
        job.start(
            name,
            nnodes="2",
            nproc=2,
            conf=FAST_CONF,
            host=name == "a",
            extra=(warmth, "--script-exit-timeout", "2"),
            script=(SCRIPT, "gloo"),
        )
    for name in ("a", "b"):
        assert job.wait_exit(name, RUN) == 0, job.report()
    for node in job.nodes.values():
        outlived = [e for e in node.events() if e["kind"] == "worker.outlived"]
        assert len(outlived) == 2, job.report()
        known = {e["fields"]["exitcode_known"] for e in outlived}
        assert known == {node.name == "a"}, job.report()  # a warm: the zygote said when
        assert node.output().count("LAST LINE rank=") == 2
    job.assert_no_survivors()


def _died(tmp_path: Path) -> list[dict[str, Any]]:
    events = read_events(only_run_dir(tmp_path / "logs"))
    return [dict(e["fields"]) for e in events if e["kind"] == "worker.died_after_script"]


def test_a_warm_worker_that_aborts_after_its_script_ended_counts_as_succeeded(
    launch: Launch, tmp_path: Path
) -> None:
    agent = _run(launch, tmp_path, "warm", "abort", options=("--max-restarts", "1"))
    assert agent.wait(RUN) == 0, agent.describe()
    died = _died(tmp_path)
    assert sorted(fields["rank"] for fields in died) == [0, 1], agent.describe()
    for fields in died:
        assert fields["exitcode"] == -6 and fields["counted"] == 0, agent.describe()
        line = f"rank {fields['rank']} (pid {fields['pid']}) was killed by SIGABRT after its "
        assert agent.stderr.count(line + "script ended with status 0") == 1, agent.describe()
    assert "restarting" not in agent.stderr and "every local worker succeeded" in agent.stderr
    assert no_process_left([fields["pid"] for fields in died])


def test_a_warm_worker_that_exited_3_then_aborted_counts_as_exit_3(
    launch: Launch, tmp_path: Path
) -> None:
    agent = _run(launch, tmp_path, "warm", "abort", "3", nproc=1)
    assert agent.wait(RUN) == 1, agent.describe()
    (fields,) = _died(tmp_path)
    assert fields["counted"] == 3 and "exit code 3" in agent.stderr, agent.describe()


def test_a_cold_worker_that_aborts_after_its_script_fails_as_under_torchrun(
    launch: Launch, tmp_path: Path
) -> None:
    agent = _run(launch, tmp_path, "cold", "abort", nproc=1)
    assert agent.wait(RUN) == 1, agent.describe()
    assert "LAST LINE rank=0" in agent.stdout and "SIGABRT" in agent.stderr, agent.describe()
    assert _died(tmp_path) == []


def test_a_warm_worker_its_agent_stopped_after_its_script_raised_is_no_shutdown_crash(
    launch: Launch, tmp_path: Path
) -> None:
    """The agent's own stop is said as such (``workers.stopped``: by the agent, why), never as a
    crash in the interpreter's shutdown (issue 28: a node loss read as ``died_after_script``)."""
    marker = tmp_path / "in-shutdown"
    agent = _run(launch, tmp_path, "warm", "marked", str(marker), nproc=1, bound="off")
    # The marker is written in the shutdown, after the worker told its end (status 1).
    wait_until(lambda: marker.exists() or agent.proc.poll() is not None, RUN)
    assert agent.proc.poll() is None, agent.describe()
    pid = int(marker.read_text())
    os.kill(agent.pid, signal.SIGTERM)
    assert agent.wait(RUN) == 128 + signal.SIGTERM, agent.describe()
    assert no_process_left([pid])
    events = read_events(only_run_dir(tmp_path / "logs"))
    assert _died(tmp_path) == [], agent.describe()
    assert "interpreter's shutdown" not in agent.stderr, agent.describe()
    (stopped,) = [dict(e["fields"]) for e in events if e["kind"] == "workers.stopped"]
    assert stopped["by"] == "agent" and stopped["reason"] == "signal", stopped
    assert stopped["signal"] == "SIGTERM", stopped
