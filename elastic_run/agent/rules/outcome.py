"""The outcome rules: what the local workers' end means for the run. Pure.

A failed group is first reported to the rendezvous (``ReportFailure``): the first node to
report a failure of the round ends it, and only that failure counts against
``--max-restarts`` (the others restart without spending one). With the answer (``counted``,
``peers_finished``) the rules decide again:

    nodes of the round had finished before the failure -> Fail(finished)   exit 1
    counted, and the restarts are used up              -> Fail             exit 1
    otherwise                                          -> Restart(counted)

(``no_progress.py`` comes between the report and these: a crash loop ends with exit 5.) A
finished node waits at the exit barrier and never runs its workers again, so a round with it
cannot form again: a failure after that ends the job (``agent/loop/exit_barrier.py`` decides who
came first). Every local worker exited 0 -> Finish (exit barrier, exit 0).
"""

from __future__ import annotations

from elastic_run.agent.rules.actions import Action, Fail, Finish, ReportFailure, Restart
from elastic_run.agent.rules.observation import Observation, WorkersStatus

__all__ = ["report", "restart", "succeeded"]


def report(obs: Observation, now_ns: int) -> Action | None:
    """Report a failed group that was not reported yet.

    Args:
        obs: this turn's observation.
        now_ns: the monotonic time now (unused).

    Returns:
        ``ReportFailure``, or None.
    """
    if obs.workers is WorkersStatus.FAILED and obs.failure_counted is None:
        return ReportFailure()
    return None


def restart(obs: Observation, now_ns: int) -> Action | None:
    """Restart a reported failure, or end the job when it cannot go on.

    Args:
        obs: this turn's observation.
        now_ns: the monotonic time now (unused).

    Returns:
        ``Fail(finished)``, ``Fail()``, ``Restart(counted)``, or None (the group did not fail).
    """
    if obs.workers is not WorkersStatus.FAILED or obs.failure_counted is None:
        return None
    if obs.peers_finished > 0:
        return Fail(finished=obs.peers_finished)
    if obs.failure_counted and obs.restarts >= obs.max_restarts:
        return Fail()
    return Restart(counted=obs.failure_counted)


def succeeded(obs: Observation, now_ns: int) -> Action | None:
    """Finish once every local worker succeeded.

    Args:
        obs: this turn's observation.
        now_ns: the monotonic time now (unused).

    Returns:
        ``Finish``, or None.
    """
    return Finish() if obs.workers is WorkersStatus.SUCCEEDED else None
