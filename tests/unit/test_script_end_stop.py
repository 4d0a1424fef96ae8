"""A worker its own agent stopped is never reported as dying after its script.

The warm worker below ended its script with status 1 (a collective broke when a peer died), then
its agent stopped the attempt (SIGTERM) to re-rendezvous. torch's ``_restart_workers`` stops the
workers a second time before it rejoins; that second call must not move the stop's start past
the exits it already caused, or the exit reads as a crash in the interpreter's shutdown.
"""

from __future__ import annotations

import signal

from elastic_run.agent.progress.script_end_watch import ScriptEndWatch
from elastic_run.agent.workers.group import AgentStop
from elastic_run.agent.workers.processes import WorkerExit

PID = 4242


class _Ended:
    """The warm starts' word: this worker's script ended with status 1."""

    def script_end(self, pid: int) -> tuple[int, int] | None:
        return (1, 0) if pid == PID else None

    def is_warm(self, pid: int) -> bool:
        return pid == PID


def _watch() -> ScriptEndWatch:
    watch = ScriptEndWatch(bound_s=60.0)
    watch.start_attempt([(0, 0)], {})
    watch.started({0: PID}, _Ended())
    return watch


def test_an_exit_by_the_agents_stop_keeps_its_signal_after_a_second_stop() -> None:
    watch = _watch()
    stop = AgentStop(frozenset({signal.SIGTERM, signal.SIGKILL}), at=100.0)
    killed = WorkerExit(local_rank=0, pid=PID, exitcode=-int(signal.SIGTERM), finished_at=101.0)
    stop = stop.again((signal.SIGTERM, signal.SIGKILL), 105.0)  # _restart_workers stops again

    assert stop.at == 100.0
    assert watch.amend({0: killed}, stop) == {0: killed}
    assert watch.died_after_script() == []


def test_a_signal_before_the_stop_is_still_a_crash_after_the_script() -> None:
    watch = _watch()
    aborted = WorkerExit(local_rank=0, pid=PID, exitcode=-int(signal.SIGABRT), finished_at=99.0)
    stop = AgentStop(frozenset({signal.SIGTERM, signal.SIGKILL}), at=100.0)

    amended = watch.amend({0: aborted}, stop)
    assert amended[0].exitcode == 1  # counted as the script's own status
    assert [d.pid for d in watch.died_after_script()] == [PID]
