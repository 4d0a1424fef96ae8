"""The outcome rules (``agent/rules/outcome.py``): report a failure first, then fail or restart
with the answer; finish once every worker succeeded."""

from __future__ import annotations

from elastic_run.agent.rules import outcome
from elastic_run.agent.rules.actions import Fail, Finish, ReportFailure, Restart
from elastic_run.agent.rules.observation import WorkersStatus
from tests.unit.observations import RUNNING, flat

FAILED = flat(RUNNING, workers=WorkersStatus.FAILED)


def test_a_failure_is_reported_once() -> None:
    assert outcome.report(FAILED, 0) == ReportFailure()
    assert outcome.report(flat(FAILED, failure_counted=False), 0) is None
    assert outcome.report(RUNNING, 0) is None


def test_a_reported_failure_restarts_fails_or_waits_for_the_report() -> None:
    assert outcome.restart(FAILED, 0) is None  # not reported yet
    assert outcome.restart(flat(FAILED, failure_counted=True, restarts=0), 0) == Restart(True)
    assert outcome.restart(flat(FAILED, failure_counted=False, restarts=3), 0) == Restart(False)
    assert outcome.restart(flat(FAILED, failure_counted=True, restarts=3), 0) == Fail()
    finished = flat(FAILED, failure_counted=False, peers_finished=1)
    assert outcome.restart(finished, 0) == Fail(finished=1)


def test_success_finishes() -> None:
    assert outcome.succeeded(flat(RUNNING, workers=WorkersStatus.SUCCEEDED), 0) == Finish()
    assert outcome.succeeded(RUNNING, 0) is None
