"""The hang rule (``agent/rules/progress/hung.py``): from the silent workers and ``now``, which
are hung: one seen outside a collective at once; workers that all wait in one after the grace."""

from __future__ import annotations

from dataclasses import replace

from elastic_run.agent.progress.stack_report import Where
from elastic_run.agent.rules.actions import StopHung
from elastic_run.agent.rules.observation import Observation, WorkersStatus
from elastic_run.agent.rules.progress import hung
from elastic_run.agent.rules.progress.beats import HungWorker, Silence
from tests.unit.observations import RUNNING

S = 1_000_000_000


def _suspect(local_rank: int, in_collective: bool | None) -> HungWorker:
    where = (
        None
        if in_collective is None
        else Where("all_reduce" if in_collective else "train_step", None, in_collective)
    )
    return HungWorker(local_rank, local_rank, 100 + local_rank, Silence(40, 30, True), where, None)


def _obs(*suspects: HungWorker, since_s: float = 0.0, grace_s: float = 10.0) -> Observation:
    progress = replace(
        RUNNING.progress,
        suspects=suspects,
        suspect_since_ns=int(since_s * S),
        collective_grace_s=grace_s,
    )
    return replace(RUNNING, progress=progress)


def test_a_worker_outside_a_collective_is_hung_at_once() -> None:
    outside, waiting = _suspect(0, False), _suspect(1, True)
    assert hung.judge(_obs(outside, waiting), 0) == StopHung((outside,))


def test_workers_that_all_wait_in_a_collective_are_left_the_grace() -> None:
    a, b = _suspect(0, True), _suspect(1, None)
    obs = _obs(a, b, since_s=5.0, grace_s=10.0)
    assert hung.judge(obs, int(14.9 * S)) is None
    assert hung.judge(obs, 15 * S) == StopHung((a, b))


def test_nothing_silent_or_a_group_that_ended_is_not_judged() -> None:
    assert hung.judge(RUNNING, 10**12) is None
    failed = replace(
        _obs(_suspect(0, False)), group=replace(RUNNING.group, status=WorkersStatus.FAILED)
    )
    assert hung.judge(failed, 0) is None
