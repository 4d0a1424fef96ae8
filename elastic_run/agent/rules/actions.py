"""What the run loop does next: the actions the rules return. Pure.

Each action carries the worker group's state the loop sets from it. The loop applies an
action with its parts (``agent/loop/simple.py``): the ending ones (Stop, Fail, NoProgress,
Finish, End) end the run with their exit code; Restart and Rejoin stop the workers and join the
next round (only ``Restart(counted=True)`` spends a restart); ReportFailure asks the rendezvous
whether this node's failure counts, and the rules decide again with the answer; the progress
effects (StopHung, KillOutlived, NoteStragglers) are handed to the progress part, and the loop
waits for its next turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_run.agent.api import WorkerState
from elastic_run.agent.rules.observation import ClosedReason, RejoinReason, ScriptEnded
from elastic_run.agent.rules.progress.beats import HungWorker
from elastic_run.agent.rules.progress.step_times import RankTime, StragglerWatch

__all__ = [
    "EXIT_CLOSED",
    "EXIT_EXCLUDED",
    "EXIT_FAILED",
    "EXIT_NO_PROGRESS",
    "EXIT_SUCCEEDED",
    "Action",
    "End",
    "Exclude",
    "Fail",
    "Finish",
    "KillOutlived",
    "NoProgress",
    "NoteStragglers",
    "ProgressEffect",
    "Rejoin",
    "ReportFailure",
    "Restart",
    "Start",
    "Stop",
    "StopHung",
    "Wait",
]

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_CLOSED = 3
EXIT_NO_PROGRESS = 5
EXIT_EXCLUDED = 6


@dataclass(frozen=True)
class Wait:
    """Nothing to do: wait for the next turn."""

    state: WorkerState = WorkerState.HEALTHY


@dataclass(frozen=True)
class Start:
    """The round completed: start the workers."""

    state: WorkerState = WorkerState.HEALTHY


@dataclass(frozen=True)
class Stop:
    """A signal: stop the workers with it and exit 128+N."""

    signal: int
    state: WorkerState = WorkerState.STOPPED

    @property
    def exit_code(self) -> int:
        """128 + the signal number."""
        return 128 + self.signal


@dataclass(frozen=True)
class ReportFailure:
    """Tell the rendezvous this node's workers failed (it answers whether it counts)."""

    state: WorkerState = WorkerState.FAILED


@dataclass(frozen=True)
class Fail:
    """The job failed: its restarts are used up, or ``finished`` nodes of the round had
    finished before this failure (the round cannot form again). Close as failed, exit 1."""

    finished: int = 0
    exit_code: int = EXIT_FAILED
    state: WorkerState = WorkerState.FAILED


@dataclass(frozen=True)
class Restart:
    """Stop the workers and rendezvous again; ``counted``: this restart spends one."""

    counted: bool
    state: WorkerState = WorkerState.STOPPED


@dataclass(frozen=True)
class NoProgress:
    """Attempts keep failing without progress: close the rendezvous as failed, exit 5."""

    restarts: int
    exit_code: int = EXIT_NO_PROGRESS
    state: WorkerState = WorkerState.FAILED


@dataclass(frozen=True)
class Exclude:
    """This node's failures single it out: stop its workers, leave the job, exit 6 (the others
    re-form without it). ``reason``: why, for people."""

    reason: str
    exit_code: int = EXIT_EXCLUDED
    state: WorkerState = WorkerState.FAILED


@dataclass(frozen=True)
class StopHung:
    """Kill the workers judged hung (their stacks are on disk); they then count as failed."""

    workers: tuple[HungWorker, ...]
    state: WorkerState = WorkerState.HEALTHY


@dataclass(frozen=True)
class KillOutlived:
    """Kill the workers that outlived their script's end past the bound; each one's exit
    counts as its script's own status."""

    workers: tuple[tuple[ScriptEnded, float], ...]
    state: WorkerState = WorkerState.HEALTHY


@dataclass(frozen=True)
class NoteStragglers:
    """Record the job's stragglers as judged from a reading (``watch``), and say the new ones
    (each with its ratio to the median)."""

    watch: StragglerWatch
    new: tuple[tuple[RankTime, float], ...]
    round: int
    state: WorkerState = WorkerState.HEALTHY


ProgressEffect = StopHung | KillOutlived | NoteStragglers


@dataclass(frozen=True)
class Finish:
    """Every local worker succeeded: exit barrier, close as succeeded, exit 0."""

    exit_code: int = EXIT_SUCCEEDED
    state: WorkerState = WorkerState.SUCCEEDED


@dataclass(frozen=True)
class End:
    """The job ended elsewhere (closed) or the rendezvous failed: stop and exit.

    Attributes:
        exit_code: what the agent exits with.
        reason: one line for people.
        state: the worker group's final state.
        closed: why the job is closed, or None when the rendezvous failed instead.
    """

    exit_code: int
    reason: str
    state: WorkerState
    closed: ClosedReason | None = None


@dataclass(frozen=True)
class Rejoin:
    """Stop the workers and rendezvous again without spending a restart."""

    reason: RejoinReason
    state: WorkerState = WorkerState.STOPPED


Action = (
    Wait
    | Start
    | Stop
    | ReportFailure
    | NoProgress
    | Exclude
    | Fail
    | Restart
    | Finish
    | StopHung
    | KillOutlived
    | NoteStragglers
    | End
    | Rejoin
)
