"""The straggler rule: ranks that stay slower than ``--straggler-factor`` x the job's median. Pure.

On the node of group rank 0 the progress part reads every rank's step time now and then
(``step_times.py``); each reading is judged here once (``watch_stragglers``: a rank at or above the
factor for ``HOLD_S`` seconds is a straggler, said once, and again only after it came back under
the factor). The verdict changes nothing of the run: ``NoteStragglers`` records it (``status``
shows it) and says the new ones.
"""

from __future__ import annotations

from elastic_run.agent.rules.actions import Action, NoteStragglers
from elastic_run.agent.rules.observation import Observation
from elastic_run.agent.rules.progress.step_times import watch_stragglers

__all__ = ["judge"]


def judge(obs: Observation, now_ns: int) -> Action | None:
    """Judge the reading not judged yet.

    Args:
        obs: this turn's observation.
        now_ns: the monotonic time now (the reading's own time is what counts).

    Returns:
        ``NoteStragglers`` (with or without new stragglers), or None without a new reading.
    """
    progress = obs.progress
    reading = progress.steps
    if reading is None:
        return None
    watch, new = watch_stragglers(
        progress.stragglers,
        reading.steps,
        reading.times,
        factor=progress.straggler_factor,
        now_ns=reading.read_ns,
    )
    return NoteStragglers(watch, new, reading.round)
