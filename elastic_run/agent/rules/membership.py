"""The membership rules: the round this node runs in is over, or should be. Pure.

While the workers run, the round ends (the workers stop and the node joins the next round,
spending no restart) when:

    this node's own heartbeat failed past the peers' budget -> Rejoin(liveness_lost)
    the round ended: a member was judged lost              -> Rejoin(member_lost)
    the round ended: another node saw nodes waiting        -> Rejoin(nodes_waiting)
    the round ended otherwise                              -> Rejoin(round_ended)
    nodes wait at the door, and the round has room         -> Rejoin(nodes_waiting)

"Room": the rendezvous counts only the waiting nodes a next round could admit (a round at its
maximum keeps its nodes; those beyond wait as spares, torch's redundancy list).
"""

from __future__ import annotations

from elastic_run.agent.rules.actions import Action, Rejoin
from elastic_run.agent.rules.observation import Observation

__all__ = ["liveness_lost", "nodes_waiting", "round_ended"]


def liveness_lost(obs: Observation, now_ns: int) -> Action | None:
    """Rejoin when this node's peers have (or may have) judged it gone.

    Args:
        obs: this turn's observation.
        now_ns: the monotonic time now (unused: the part judged it against the budget).

    Returns:
        ``Rejoin("liveness_lost")``, or None.
    """
    return Rejoin("liveness_lost") if obs.round.liveness_lost else None


def round_ended(obs: Observation, now_ns: int) -> Action | None:
    """Rejoin when the round ended elsewhere, saying why.

    Args:
        obs: this turn's observation.
        now_ns: the monotonic time now (unused).

    Returns:
        ``Rejoin`` with the round's end cause, or None while it runs.
    """
    view = obs.round
    if not view.round_over:
        return None
    if view.member_lost:
        return Rejoin("member_lost")
    return Rejoin("nodes_waiting" if view.end_cause == "nodes_waiting" else "round_ended")


def nodes_waiting(obs: Observation, now_ns: int) -> Action | None:
    """Rejoin to admit the nodes waiting at the door.

    Args:
        obs: this turn's observation.
        now_ns: the monotonic time now (unused).

    Returns:
        ``Rejoin("nodes_waiting")``, or None.
    """
    return Rejoin("nodes_waiting") if obs.round.nodes_waiting > 0 else None
