"""Observations for the rules' tests, from flat facts: ``flat(RUNNING, closed="closed")``.

The loop's observation is one record per part (``agent/rules/observation.py``); a test of a
rule states facts, and this builds the records that carry them. ``hung=True`` puts one silent
worker among the suspects with no grace left, which the hang rule stops at once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from elastic_run.agent.loop import state_machine as sm
from elastic_run.agent.rules.progress.beats import HungWorker, Silence

__all__ = ["HUNG", "JOINING", "RUNNING", "flat", "flat_observations"]

RUNNING = sm.Observation(sm.Phase.RUNNING, max_restarts=3)
JOINING = sm.Observation(sm.Phase.JOINING)
HUNG = HungWorker(0, 0, 4242, Silence(60.0, 30.0, learned=True), None, None)

_ROUND = {
    "closed",
    "rendezvous_error",
    "liveness_lost",
    "round_over",
    "member_lost",
    "end_cause",
    "nodes_waiting",
}
_PROGRESS = {"no_progress_restarts", "max_no_progress_restarts"}


def flat(base: sm.Observation, **facts: Any) -> sm.Observation:
    """``base`` with ``facts`` set wherever each one lives.

    Args:
        base: the observation to start from.
        facts: ``workers`` (a WorkersStatus), the round's facts (closed, liveness_lost,
            round_over, member_lost, end_cause, nodes_waiting, rendezvous_error), progress's
            (hung, no_progress_restarts, max_no_progress_restarts) and the loop's own.
    """
    group = base.group
    round_ = base.round
    progress = base.progress
    loop: dict[str, Any] = {}
    for key, value in facts.items():
        if key == "workers":
            group = replace(group, status=value)
        elif key in _ROUND:
            round_ = replace(round_, **{key: value})
        elif key == "hung":
            progress = replace(progress, suspects=(HUNG,) if value else ())
        elif key in _PROGRESS:
            progress = replace(progress, **{key: value})
        else:
            loop[key] = value
    return replace(base, group=group, round=round_, progress=progress, **loop)


def _build(**facts: Any) -> sm.Observation:
    phase = facts.pop("phase")
    return flat(sm.Observation(phase), **facts)


def flat_observations(**strategies: Any) -> st.SearchStrategy[sm.Observation]:
    """A strategy of observations built from flat facts, each drawn from its strategy."""
    return st.builds(_build, **strategies)
