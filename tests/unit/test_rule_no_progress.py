"""The no-progress rule (``agent/rules/progress/no_progress.py``): K failed attempts in a row
without progress end the job with exit 5, once the failure was reported."""

from __future__ import annotations

from elastic_run.agent.rules.actions import NoProgress
from elastic_run.agent.rules.observation import WorkersStatus
from elastic_run.agent.rules.progress import no_progress
from tests.unit.observations import RUNNING, flat

FAILED = flat(RUNNING, workers=WorkersStatus.FAILED, failure_counted=True)


def test_k_attempts_without_progress_end_the_job() -> None:
    action = no_progress.judge(flat(FAILED, no_progress_restarts=2, max_no_progress_restarts=2), 0)
    assert action == NoProgress(2) and action.exit_code == 5


def test_fewer_than_k_or_off_or_unreported_do_not() -> None:
    assert (
        no_progress.judge(flat(FAILED, no_progress_restarts=1, max_no_progress_restarts=2), 0)
        is None
    )
    assert no_progress.judge(flat(FAILED, no_progress_restarts=9), 0) is None
    unreported = flat(
        FAILED, failure_counted=None, no_progress_restarts=9, max_no_progress_restarts=1
    )
    assert no_progress.judge(unreported, 0) is None
