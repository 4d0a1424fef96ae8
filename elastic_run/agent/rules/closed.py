"""The closed rule: the job ended outside this node, or its rendezvous failed. Pure.

A closed rendezvous ends the run with the reason the closing node recorded: ``succeeded``
(exit 0: the others finished), ``failed`` (exit 1: another node used up the restarts) or a
user's ``elastic-run close`` (exit 3). A failed join (a timeout, an unreachable backend, a bad
state) ends it with that error's exit code (3 or 4).
"""

from __future__ import annotations

from elastic_run.agent.api import WorkerState
from elastic_run.agent.rules.actions import EXIT_CLOSED, EXIT_FAILED, EXIT_SUCCEEDED, Action, End
from elastic_run.agent.rules.observation import ClosedReason, Observation

__all__ = ["ended", "failed_join", "judge"]


def ended(reason: ClosedReason) -> End:
    """The ending for a job closed with ``reason``.

    Args:
        reason: ``succeeded``, ``failed`` or ``closed``.

    Returns:
        The ``End`` action, with its exit code and its line.
    """
    if reason == "succeeded":
        text = "the job already finished on the other nodes"
        return End(EXIT_SUCCEEDED, text, WorkerState.SUCCEEDED, reason)
    if reason == "failed":
        text = "the job failed on another node (its restarts are used up)"
        return End(EXIT_FAILED, text, WorkerState.FAILED, reason)
    return End(EXIT_CLOSED, "the rendezvous was closed", WorkerState.STOPPED, reason)


def judge(obs: Observation, now_ns: int) -> Action | None:
    """End the run when the rendezvous is closed.

    Args:
        obs: this turn's observation.
        now_ns: the monotonic time now (unused).

    Returns:
        ``End`` with the close's reason, or None while open.
    """
    return ended(obs.round.closed) if obs.round.closed is not None else None


def failed_join(obs: Observation, now_ns: int) -> Action | None:
    """End the run when joining the round failed (JOINING phase).

    Args:
        obs: this turn's observation.
        now_ns: the monotonic time now (unused).

    Returns:
        ``End`` with the error's exit code, or None.
    """
    code = obs.round.rendezvous_error
    if code is None:
        return None
    return End(code, "the rendezvous failed", WorkerState.FAILED)
