"""The stop rule: a terminating signal reached the agent (SIGTERM, SIGINT, ...). Pure.

Checked first in both phases: a signal ends the run whatever else is true, with exit 128+N
after the workers were stopped with the same signal (the handler only records it; see
``agent/loop/signals.py``).
"""

from __future__ import annotations

from elastic_run.agent.rules.actions import Action, Stop
from elastic_run.agent.rules.observation import Observation

__all__ = ["judge"]


def judge(obs: Observation, now_ns: int) -> Action | None:
    """Stop with the pending signal, if one is pending.

    Args:
        obs: this turn's observation.
        now_ns: the monotonic time now (unused: a signal acts at once).

    Returns:
        ``Stop(signal)``, or None.
    """
    return Stop(obs.signal) if obs.signal is not None else None
