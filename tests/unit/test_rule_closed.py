"""The closed rule (``agent/rules/closed.py``): a closed job ends with its reason's code; a
failed join with its error's."""

from __future__ import annotations

import pytest

from elastic_run.agent.api import WorkerState
from elastic_run.agent.rules import closed
from elastic_run.agent.rules.actions import End
from tests.unit.observations import JOINING, RUNNING, flat


@pytest.mark.parametrize(
    ("reason", "code", "state"),
    [
        ("succeeded", 0, WorkerState.SUCCEEDED),
        ("failed", 1, WorkerState.FAILED),
        ("closed", 3, WorkerState.STOPPED),
    ],
)
def test_a_closed_job_ends_with_its_reasons_code(
    reason: str, code: int, state: WorkerState
) -> None:
    action = closed.judge(flat(RUNNING, closed=reason), 0)
    assert isinstance(action, End)
    assert (action.exit_code, action.state, action.closed) == (code, state, reason)


def test_an_open_job_is_not_ended() -> None:
    assert closed.judge(RUNNING, 0) is None


def test_a_failed_join_ends_with_its_errors_code() -> None:
    action = closed.failed_join(flat(JOINING, rendezvous_error=4), 0)
    assert isinstance(action, End) and action.exit_code == 4 and action.closed is None
    assert closed.failed_join(JOINING, 0) is None
