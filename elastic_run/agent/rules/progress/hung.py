"""The hang rule: which silent workers are hung now. Pure.

The progress part finds the workers silent past their hang timeout (``beats.py``'s ``judge``) and
takes their stacks; this rule decides from them and ``now`` (:func:`~beats.hung_now`): a worker
seen outside a collective is hung at once; workers that all wait inside a collective are left to
the node of the peer they wait for, and judged here only after a grace (at least three times this
node's last stack capture: the peer's node pays a capture too before it acts). A hung worker is
killed (``StopHung``) and from then on is a failed worker (reported, restarted under
``--max-restarts``). Checked after the membership rules: a lost or departing peer also silences
the workers (they wait for it in a collective), and re-rendezvousing is then the cure.
"""

from __future__ import annotations

from elastic_run.agent.rules.actions import Action, StopHung
from elastic_run.agent.rules.observation import Observation, WorkersStatus
from elastic_run.agent.rules.progress.beats import hung_now

__all__ = ["judge"]


def judge(obs: Observation, now_ns: int) -> Action | None:
    """Stop the silent workers the evidence singles out.

    Args:
        obs: this turn's observation.
        now_ns: the monotonic time now.

    Returns:
        ``StopHung`` with the hung workers, or None.
    """
    progress = obs.progress
    if obs.workers is not WorkersStatus.RUNNING or not progress.suspects:
        return None
    waiting = {
        s.local_rank: (s.where.in_collective if s.where is not None else None)
        for s in progress.suspects
    }
    chosen = set(hung_now(waiting, progress.suspect_since_ns, now_ns, progress.collective_grace_s))
    hung = tuple(s for s in progress.suspects if s.local_rank in chosen)
    return StopHung(hung) if hung else None
