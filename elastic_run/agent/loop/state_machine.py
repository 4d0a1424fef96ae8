"""The agent's decisions: what the run loop observed -> what it does next. Pure.

``decide(observation) -> action`` over frozen dataclasses; no clock, store, process or signal
here. The run loop (``simple.py``) observes, calls ``decide``, and executes the action; it
sets the worker group's state only from the action's ``state``.

While joining a round (``Phase.JOINING``), first match wins:

    a terminating signal is pending                     -> Stop(signal)        STOPPED  128+N
    the rendezvous is closed: succeeded                 -> End(0)              SUCCEEDED
    the rendezvous is closed: failed                    -> End(1)              FAILED
    the rendezvous is closed: by a user                 -> End(3)              STOPPED
    the rendezvous failed (timeout, unreachable, state) -> End(its code)       FAILED
    the round completed                                 -> Start               HEALTHY

While the workers run (``Phase.RUNNING``), first match wins:

    a terminating signal is pending                     -> Stop(signal)        STOPPED  128+N
    workers FAILED, failure not yet reported            -> ReportFailure       FAILED
    workers FAILED, K failed attempts in a row without
      progress (--max-no-progress-restarts K)           -> NoProgress          FAILED   5
    workers FAILED after a node of the round finished   -> Fail(finished)      FAILED   1
    workers FAILED, counted, restarts used up           -> Fail                FAILED   1
    workers FAILED                                      -> Restart(counted)    STOPPED
    workers SUCCEEDED                                   -> Finish              SUCCEEDED 0
    the rendezvous is closed                            -> End(as above)
    this node's own heartbeat failed past the budget    -> Rejoin(liveness_lost)
    the round ended: a member was lost                  -> Rejoin(member_lost)
    the round ended: another node saw nodes waiting     -> Rejoin(nodes_waiting)
    the round ended otherwise                           -> Rejoin(round_ended)
    nodes wait at the door                              -> Rejoin(nodes_waiting)
    a local worker is judged hung                       -> StopHung            HEALTHY
    otherwise                                           -> Wait                HEALTHY

"Counted": the first node to report a failure of the round ends it, and only that failure
counts against ``max_restarts`` (the other nodes restart without spending one). ``Restart`` and
``Rejoin`` both stop the workers and rendezvous again; only ``Restart(counted=True)`` spends a
restart. The restart count is the job's: every worker of a round sees the same value.

"Hung": silent past its hang timeout (``hang.py``), checked after the rendezvous rows.
``StopHung`` takes the local workers' stacks and kills the hung ones; the next turn sees the
group FAILED, so a hung worker is a failed worker from there on (reported, restarted under
``--max-restarts``). "Finished": a node whose workers all succeeded waits at the exit barrier
and never runs them again, so a round with it cannot form again; a failure after that ends the
job (``exit_barrier.py`` decides who came first). ``NoProgress``
ends the job like ``Fail`` but with its own exit code, so that a scheduler can tell a crash
loop (do not requeue) from a job that used up its restarts while making progress. "Without
progress": the attempt reached no step beyond the furthest step of every earlier attempt
(``progress/hang.py``'s ``count_attempt``: a job that hangs at step 10 every time makes none).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from elastic_run.agent.api import WorkerState

__all__ = [
    "EXIT_CLOSED",
    "EXIT_FAILED",
    "EXIT_NO_PROGRESS",
    "EXIT_SUCCEEDED",
    "Action",
    "ClosedReason",
    "End",
    "Fail",
    "Finish",
    "NoProgress",
    "Observation",
    "Phase",
    "Rejoin",
    "RejoinReason",
    "ReportFailure",
    "Restart",
    "Start",
    "Stop",
    "StopHung",
    "Wait",
    "WorkersStatus",
    "decide",
]

ClosedReason = Literal["closed", "succeeded", "failed"]
RejoinReason = Literal["liveness_lost", "member_lost", "round_ended", "nodes_waiting"]

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_CLOSED = 3
EXIT_NO_PROGRESS = 5


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
class Observation:
    """What the loop saw this turn.

    Attributes:
        phase: joining a round or running the workers.
        signal: the terminating signal pending (None: none).
        workers: the local workers (RUNNING phase).
        failure_counted: after ReportFailure: whether this node's failure ended the round
            first; None before reporting.
        restarts: restarts the job has spent.
        max_restarts: restarts allowed.
        closed: why the job is closed, None while open.
        rendezvous_error: the exit code of a failed rendezvous (JOINING phase), None if none.
        liveness_lost: this node's own heartbeat failed for the peers' whole budget.
        round_over: the round this node is a member of has ended.
        member_lost: it ended because a member was judged dead.
        end_cause: why it ended, as recorded by the node that ended it.
        nodes_waiting: nodes waiting at the door of the round.
        hung: a local worker is judged hung (silent past its hang timeout).
        no_progress_restarts: failed attempts in a row without progress (no step beyond the
            furthest an earlier attempt reached), each after a restart, this one included when
            it failed without progress.
        max_no_progress_restarts: stop at this many (0: never).
        peers_finished: after ReportFailure: nodes of the round whose workers had all
            succeeded before this node's failure (they wait at the exit barrier).
    """

    phase: Phase
    signal: int | None = None
    workers: WorkersStatus = WorkersStatus.RUNNING
    failure_counted: bool | None = None
    restarts: int = 0
    max_restarts: int = 0
    closed: ClosedReason | None = None
    rendezvous_error: int | None = None
    liveness_lost: bool = False
    round_over: bool = False
    member_lost: bool = False
    end_cause: str | None = None
    nodes_waiting: int = 0
    hung: bool = False
    no_progress_restarts: int = 0
    max_no_progress_restarts: int = 0
    peers_finished: int = 0


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
class StopHung:
    """Take the local workers' stacks and kill the hung ones (they then count as failed)."""

    state: WorkerState = WorkerState.HEALTHY


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
    | Fail
    | Restart
    | Finish
    | StopHung
    | End
    | Rejoin
)


def _closed(reason: ClosedReason) -> End:
    if reason == "succeeded":
        text = "the job already finished on the other nodes"
        return End(EXIT_SUCCEEDED, text, WorkerState.SUCCEEDED, reason)
    if reason == "failed":
        text = "the job failed on another node (its restarts are used up)"
        return End(EXIT_FAILED, text, WorkerState.FAILED, reason)
    return End(EXIT_CLOSED, "the rendezvous was closed", WorkerState.STOPPED, reason)


def decide(obs: Observation) -> Action:
    """The next action for ``obs``. See the module docstring for the tables."""
    if obs.signal is not None:
        return Stop(obs.signal)
    if obs.phase is Phase.JOINING:
        if obs.closed is not None:
            return _closed(obs.closed)
        if obs.rendezvous_error is not None:
            return End(obs.rendezvous_error, "the rendezvous failed", WorkerState.FAILED)
        return Start()
    if obs.workers is WorkersStatus.FAILED:
        if obs.failure_counted is None:
            return ReportFailure()
        limit = obs.max_no_progress_restarts
        if limit > 0 and obs.no_progress_restarts >= limit:
            return NoProgress(obs.no_progress_restarts)
        if obs.peers_finished > 0:
            return Fail(finished=obs.peers_finished)
        if obs.failure_counted and obs.restarts >= obs.max_restarts:
            return Fail()
        return Restart(counted=obs.failure_counted)
    if obs.workers is WorkersStatus.SUCCEEDED:
        return Finish()
    if obs.closed is not None:
        return _closed(obs.closed)
    if obs.liveness_lost:
        return Rejoin("liveness_lost")
    if obs.round_over:
        if obs.member_lost:
            return Rejoin("member_lost")
        return Rejoin("nodes_waiting" if obs.end_cause == "nodes_waiting" else "round_ended")
    if obs.nodes_waiting > 0:
        return Rejoin("nodes_waiting")
    if obs.hung:
        # After the rendezvous rows: a lost or departing peer also silences the workers
        # (they wait for it in a collective), and re-rendezvousing is then the cure.
        return StopHung()
    return Wait()
