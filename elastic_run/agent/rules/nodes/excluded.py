"""The node verdict: a node whose own failures single it out leaves the job. Pure.

Checked when this node's failure was counted (it ended its round first: it is the root cause).
The node is excluded when ``--max-node-failures K`` (default 2) of the failures charged to it
are node evidence and they happened with different ranks. A failure is node evidence unless
its rank failed on another node before (it followed the rank: a rank-dependent bug, the
script's). After a first failure the node is suspect and asks for other ranks in the next
round (``NodeRecord.avoid_rank``), so a bad host fails again with other ranks while a bad rank
fails again on another node: the two tell themselves apart. A single transient failure never
excludes (K is at least 2), and nobody is excluded when the failures are spread over nodes.

An excluded node stops its workers, leaves the round (the others re-form at once) and exits 6,
so a batch script can requeue without it.
"""

from __future__ import annotations

from elastic_run.agent.rules.actions import Action, Exclude
from elastic_run.agent.rules.nodes.history import Fault, FaultHistory, follows_rank
from elastic_run.agent.rules.observation import Observation, WorkersStatus

__all__ = ["evidence", "judge", "reason"]


def evidence(own: FaultHistory, others: tuple[FaultHistory, ...]) -> tuple[Fault, ...]:
    """The failures charged to this node that follow the node, not a rank."""
    return tuple(f for f in own.faults if follows_rank(f, others) is None)


def reason(faults: tuple[Fault, ...]) -> str:
    """``root cause of 2 failed rounds with different ranks (rank 5 SIGSEGV at step 12; ...)``"""
    return (
        f"root cause of {len(faults)} failed rounds with different ranks "
        f"({'; '.join(f.text() for f in faults)})"
    )


def judge(obs: Observation, now_ns: int) -> Action | None:
    """Exclude this node when its counted failures single it out.

    Args:
        obs: this turn's observation (after the failure was reported).
        now_ns: the monotonic time now (unused).

    Returns:
        ``Exclude`` with the reason, or None.
    """
    nodes = obs.nodes
    if obs.workers is not WorkersStatus.FAILED or not obs.failure_counted or nodes.own is None:
        return None
    found = evidence(nodes.own, nodes.others)
    if len(found) < nodes.max_failures or len({f.rank for f in found}) < 2:
        return None
    return Exclude(reason(found))
