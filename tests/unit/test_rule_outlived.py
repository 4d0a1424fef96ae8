"""The script-end rule (``agent/rules/progress/outlived.py``): a worker whose process outlives its
script's end past ``--script-exit-timeout`` is killed, with how long it outlived it."""

from __future__ import annotations

from dataclasses import replace

from elastic_run.agent.rules.actions import KillOutlived
from elastic_run.agent.rules.observation import Observation, ScriptEnded, WorkersStatus
from elastic_run.agent.rules.progress import outlived
from tests.unit.observations import RUNNING

S = 1_000_000_000
ENDED = ScriptEnded(local_rank=0, rank=3, pid=1234, ended_ns=10 * S)


def _obs(bound_s: float | None, *ends: ScriptEnded) -> Observation:
    progress = replace(RUNNING.progress, script_ends=ends, script_exit_timeout_s=bound_s)
    return replace(RUNNING, progress=progress)


def test_a_process_past_the_bound_is_killed_with_how_long_it_lived_on() -> None:
    action = outlived.judge(_obs(60.0, ENDED), 71 * S)
    assert action == KillOutlived(((ENDED, 61.0),))


def test_within_the_bound_or_off_it_lives() -> None:
    assert outlived.judge(_obs(60.0, ENDED), 70 * S) is None
    assert outlived.judge(_obs(None, ENDED), 10**15) is None
    failed = replace(_obs(60.0, ENDED), group=replace(RUNNING.group, status=WorkersStatus.FAILED))
    assert outlived.judge(failed, 10**15) is None
