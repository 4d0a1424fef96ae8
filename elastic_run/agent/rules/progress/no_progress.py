"""The no-progress rule (``--max-no-progress-restarts K``): a crash loop ends the job. Pure.

After a failure is reported, K failed attempts in a row that each reached no step beyond the
furthest step of every earlier attempt (``beats.py``'s ``count_attempt``: a job that hangs at step
10 every time makes none) end the job with exit 5 instead of spending more restarts, so that a
scheduler can tell a crash loop (do not requeue) from a job that used up its restarts while
making progress. K = 0 (the default) turns the rule off.
"""

from __future__ import annotations

from elastic_run.agent.rules.actions import Action, NoProgress
from elastic_run.agent.rules.observation import Observation, WorkersStatus

__all__ = ["judge"]


def judge(obs: Observation, now_ns: int) -> Action | None:
    """End the job when the failed attempts in a row without progress reached the bound.

    Args:
        obs: this turn's observation (after the failure was reported).
        now_ns: the monotonic time now (unused).

    Returns:
        ``NoProgress``, or None.
    """
    if obs.workers is not WorkersStatus.FAILED or obs.failure_counted is None:
        return None
    limit = obs.progress.max_no_progress_restarts
    streak = obs.progress.no_progress_restarts
    return NoProgress(streak) if limit > 0 and streak >= limit else None
