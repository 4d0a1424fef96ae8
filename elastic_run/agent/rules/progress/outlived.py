"""The script-end rule: a worker whose process outlives its script's end is stopped. Pure.

The progress part learns when each worker's script ended (``script_end.py``: a warm worker says
so, a cold one is seen in its stacks); once its process has lived on past
``--script-exit-timeout`` (60 s; ``off``: never) this rule has it killed (``KillOutlived``), its
exit then counted as its script's own status (the script did finish).
"""

from __future__ import annotations

from elastic_run.agent.rules.actions import Action, KillOutlived
from elastic_run.agent.rules.observation import Observation, WorkersStatus
from elastic_run.agent.rules.progress.script_end import overdue_s

__all__ = ["judge"]


def judge(obs: Observation, now_ns: int) -> Action | None:
    """Kill the workers past the bound, each with how long it outlived its script.

    Args:
        obs: this turn's observation.
        now_ns: the monotonic time now.

    Returns:
        ``KillOutlived``, or None.
    """
    progress = obs.progress
    if obs.workers is not WorkersStatus.RUNNING:
        return None
    due = tuple(
        (ended, lived)
        for ended in progress.script_ends
        if (lived := overdue_s(ended.ended_ns, now_ns, progress.script_exit_timeout_s)) is not None
    )
    return KillOutlived(due) if due else None
