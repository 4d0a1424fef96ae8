"""What the run loop saw in one turn: one frozen record per part, and the whole. Pure.

Each part of the agent answers the loop once per turn with its own record, built once from what
it read (the processes, the beats, the store) and never judged again on the way:

- :class:`GroupView`: the local worker group (``agent/workers/group.py``): each worker's state
  and exit code, exits amended once (a script's end counted as its status), the failures built
  once (root cause first), whether the agent itself stopped them;
- :class:`ProgressView`: progress (``agent/progress/duties.py``): the workers silent past their
  hang timeout with their stacks, the scripts that ended while their process lives, the job's
  step times not yet judged, the no-progress streak, and the pictures the snapshot shows;
- :class:`RoundView`: the rendezvous (``agent/loop/rendezvous_part.py``): closed, the round
  ended (and why), nodes waiting, this node's own liveness.

:class:`Observation` holds the three with the loop's own facts (phase, pending signal, restart
count); the rules (``agent/rules/``) read it with ``now`` and say what to do; the snapshot the
views read is built from the same records.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from elastic_run.agent.api import WorkerState
from elastic_run.agent.loop.snapshot import JobProgress, WorkerProgress
from elastic_run.agent.rules.progress.beats import HungWorker
from elastic_run.agent.rules.progress.step_times import JobSteps, RankTime, StragglerWatch

if TYPE_CHECKING:
    from elastic_run.agent.workers.failures import FailureRecord

__all__ = [
    "ClosedReason",
    "GroupView",
    "Notice",
    "Observation",
    "Phase",
    "ProgressView",
    "RejoinReason",
    "RoundView",
    "ScriptEnded",
    "StepsReading",
    "WorkerView",
    "WorkersStatus",
]

ClosedReason = Literal["closed", "succeeded", "failed"]
RejoinReason = Literal["liveness_lost", "member_lost", "round_ended", "nodes_waiting"]


class Phase(enum.Enum):
    """Where the loop is: joining a round, or running its workers."""

    JOINING = "joining"
    RUNNING = "running"


class WorkersStatus(enum.Enum):
    """The local workers as a whole."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class WorkerView:
    """One local worker as the group saw it this turn.

    Attributes:
        local_rank: its rank on this node.
        rank: its global rank (-1 before the first round).
        pid: its process (None: not started).
        state: ``INIT``, ``HEALTHY``, ``SUCCEEDED``, ``FAILED`` or ``STOPPED`` (by its agent).
        exitcode: its exit code once it exited (amended: a script's end counts as its status).
    """

    local_rank: int
    rank: int
    pid: int | None
    state: str
    exitcode: int | None = None


@dataclass(frozen=True)
class GroupView:
    """The local worker group this turn.

    Attributes:
        status: running, succeeded (every worker exited 0) or failed (one exited non-zero).
        workers: each worker, by local rank.
        failures: the failed workers, root cause (earliest) first.
        return_values: a callable entrypoint's return values by global rank (None for a
            program), once every worker succeeded.
        stopped_by_agent: the agent stopped these workers (their exits are its signal's).
        watchdog_expiries: workers of this attempt the file-timer watchdog killed.
        state: the group's state as torch's ``_monitor_workers`` names it (HEALTHY, UNHEALTHY,
            FAILED, SUCCEEDED): the loop sets the worker group's state to it each turn, as
            torch's loop does.
    """

    status: WorkersStatus = WorkersStatus.RUNNING
    workers: tuple[WorkerView, ...] = ()
    failures: tuple[FailureRecord, ...] = ()
    return_values: Mapping[int, Any] = field(default_factory=dict)
    stopped_by_agent: bool = False
    watchdog_expiries: int = 0
    state: WorkerState = WorkerState.HEALTHY

    @property
    def running(self) -> tuple[int, ...]:
        """The local ranks still running."""
        return tuple(w.local_rank for w in self.workers if w.pid is not None and w.exitcode is None)

    @classmethod
    def of_state(cls, state: WorkerState, **fields: Any) -> GroupView:
        """A view from a worker group's state alone (a torch-style ``_monitor_workers``).

        Args:
            state: the state ``_monitor_workers`` returned.
            fields: the other attributes.
        """
        status = {
            WorkerState.FAILED: WorkersStatus.FAILED,
            WorkerState.UNHEALTHY: WorkersStatus.FAILED,  # torch restarts an unhealthy group
            WorkerState.SUCCEEDED: WorkersStatus.SUCCEEDED,
        }.get(state, WorkersStatus.RUNNING)
        return cls(status=status, state=state, **fields)


@dataclass(frozen=True)
class Notice:
    """Something a part saw that the loop only says (an event), deciding nothing.

    Attributes:
        kind: the event's kind (``worker.died_after_script``).
        message: its line.
        fields: its fields.
    """

    kind: str
    message: str
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ScriptEnded:
    """A worker whose script is over while its process lives (``script_end.py``).

    Attributes:
        local_rank: its local rank.
        rank: its global rank.
        pid: its process.
        ended_ns: when its script ended (monotonic; for a cold worker, when it was first seen).
    """

    local_rank: int
    rank: int
    pid: int
    ended_ns: int


@dataclass(frozen=True)
class StepsReading:
    """The job's step times as this node (group rank 0) last read them, not yet judged.

    Attributes:
        round: the round they were read for.
        times: every rank's time.
        steps: their summary (the median, the slowest).
        read_ns: when they were read (monotonic).
    """

    round: int
    times: tuple[RankTime, ...]
    steps: JobSteps
    read_ns: int


@dataclass(frozen=True)
class ProgressView:
    """Progress this turn, and the verdicts' evidence (the rules decide).

    Attributes:
        suspects: workers silent past their hang timeout, with where they were (stacks taken).
        suspect_since_ns: when the first of them was found silent (0: none is).
        collective_grace_s: how long workers that all wait in a collective are left to the node
            of the peer they wait for.
        no_progress_restarts: failed attempts in a row without progress, this one included were
            it to fail now (``--max-no-progress-restarts``).
        max_no_progress_restarts: the bound (0: off).
        script_ends: workers whose script ended while their process lives.
        script_exit_timeout_s: how long such a worker may live on (None: forever).
        steps: the job's step times read and not yet judged (group rank 0 only).
        stragglers: which ranks straggle so far (carried from turn to turn).
        straggler_factor: ``--straggler-factor``.
        workers: each local worker's progress picture, by local rank.
        job: the job's step times as last published.
        beat_reading: (beats, last beat's monotonic ns) of the worker that beat last, or None.
        notices: what the part saw since the last turn that the loop only says.
    """

    suspects: tuple[HungWorker, ...] = ()
    suspect_since_ns: int = 0
    collective_grace_s: float = 0.0
    no_progress_restarts: int = 0
    max_no_progress_restarts: int = 0
    script_ends: tuple[ScriptEnded, ...] = ()
    script_exit_timeout_s: float | None = None
    steps: StepsReading | None = None
    stragglers: StragglerWatch = field(default_factory=StragglerWatch)
    straggler_factor: float = 0.0
    workers: Mapping[int, WorkerProgress] = field(default_factory=dict)
    job: JobProgress | None = None
    beat_reading: tuple[int, int] | None = None
    notices: tuple[Notice, ...] = ()


@dataclass(frozen=True)
class RoundView:
    """The rendezvous this turn, from this node's side.

    Attributes:
        closed: why the job is closed, None while open.
        rendezvous_error: the exit code of a failed join (JOINING phase), None if none.
        liveness_lost: this node's own heartbeat failed for the peers' whole budget.
        round_over: the round this node is a member of has ended.
        member_lost: it ended because a member was judged dead.
        end_cause: why it ended, as recorded by the node that ended it.
        nodes_waiting: nodes waiting at the door that the round has room for.
    """

    closed: ClosedReason | None = None
    rendezvous_error: int | None = None
    liveness_lost: bool = False
    round_over: bool = False
    member_lost: bool = False
    end_cause: str | None = None
    nodes_waiting: int = 0


@dataclass(frozen=True)
class Observation:
    """What the loop saw this turn.

    Attributes:
        phase: joining a round or running the workers.
        signal: the terminating signal pending (None: none).
        group: the local workers (RUNNING phase).
        progress: progress and its evidence.
        round: the rendezvous.
        restarts: restarts the job has spent.
        max_restarts: restarts allowed.
        failure_counted: after ReportFailure: whether this node's failure ended the round
            first; None before reporting.
        peers_finished: after ReportFailure: nodes of the round whose workers had all
            succeeded before this node's failure (they wait at the exit barrier).
    """

    phase: Phase
    signal: int | None = None
    group: GroupView = field(default_factory=GroupView)
    progress: ProgressView = field(default_factory=ProgressView)
    round: RoundView = field(default_factory=RoundView)
    restarts: int = 0
    max_restarts: int = 0
    failure_counted: bool | None = None
    peers_finished: int = 0

    @property
    def workers(self) -> WorkersStatus:
        """The local workers as a whole."""
        return self.group.status
