"""The run loop's hooks for progress beats: what ``SimpleElasticAgent`` calls, doing nothing.

A mixin of :class:`~elastic_run.agent.loop.simple.SimpleElasticAgent`: the loop calls these at
the points where progress matters (each observation, a hang verdict, before the survivors of a
failed group are stopped, at the end of an attempt); ``LocalElasticAgent`` fills them in
(``agent/progress/duties.py``). An agent that watches no beats keeps these defaults.
"""

from __future__ import annotations

from elastic_run.agent.loop import state_machine as sm
from elastic_run.agent.loop.snapshot import JobProgress, WorkerProgress

__all__ = ["ProgressHooks"]


class ProgressHooks:
    """Default (inactive) progress hooks of the run loop."""

    def _worker_progress(self, local_rank: int) -> WorkerProgress | None:
        """This worker's progress for the snapshot (None: not watched)."""
        return None

    def _job_progress(self) -> JobProgress | None:
        """The job's step times for the snapshot (None: not known)."""
        return None

    def _beat_reading(self) -> tuple[int, int] | None:
        """The workers' beats as last read: (beats this attempt, the last one's monotonic ns);
        None: none yet, or not watched (the goodput account then sees no training)."""
        return None

    def _progress_observation(self, obs: sm.Observation) -> sm.Observation:
        """Add the progress verdicts (hung, the no-progress streak) to ``obs``."""
        return obs

    def _stop_hung(self) -> None:
        """Take the stacks and kill the workers judged hung."""

    def _before_failed_stop(self) -> None:
        """The survivors of a failed group are about to be stopped (take their stacks)."""

    def _attempt_ended(self, failed: bool) -> None:
        """The attempt's workers are stopped (``failed``: by a worker failure)."""
