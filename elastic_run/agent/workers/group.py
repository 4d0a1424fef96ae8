"""This node's worker group as one part of the agent: its processes, and one view of them a turn.

:class:`LocalWorkerGroup` owns an attempt's processes (``processes.py``) from their start to
their stop, and answers the run loop each turn with one frozen
:class:`~elastic_run.agent.rules.observation.GroupView`: each worker's state and exit code, the
exits amended once (a worker whose script had ended counts with its script's status: the
progress part knows that, through :class:`ExitNotes`), the failures built once per process
(root cause first), and whether the agent stopped the workers itself. It is the one owner of
"the agent stopped these workers": the stop's signals and start (:class:`AgentStop`) are
recorded here and handed to the notes, so an exit by one of them is the agent's stop, never a
crash.

Threads: everything runs on the agent's loop, except :meth:`note_expiry` (the watchdog's thread,
before the loop wakes) and ``on_exit`` (a waiter thread: it only wakes the loop).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from elastic_run.agent.api import RunResult, WorkerGroup, WorkerState
from elastic_run.agent.rules.observation import GroupView, WorkersStatus, WorkerView
from elastic_run.agent.workers.failures import (
    NOT_AVAILABLE,
    FailureRecord,
    WorkerErrorInfo,
    read_error_file,
)
from elastic_run.agent.workers.guardian import Guardian
from elastic_run.agent.workers.processes import WorkerExit, WorkerLaunch, WorkerProcesses

__all__ = ["AgentStop", "ExitNotes", "LocalWorkerGroup", "NoNotes", "run_result"]


@dataclass(frozen=True)
class AgentStop:
    """The agent's own stop of the attempt's workers.

    Attributes:
        signals: the signals it stops them with (the first, then SIGKILL).
        at: when the stop began, epoch seconds.
    """

    signals: frozenset[int]
    at: float

    def again(self, signals: Iterable[int], at: float) -> AgentStop:
        """The same stop, asked again (torch's ``_restart_workers`` stops first): it began at
        the first call, which the workers' exits may predate the second one's."""
        return AgentStop(self.signals | frozenset(int(s) for s in signals), min(self.at, at))

    def explains(self, exit_: WorkerExit) -> bool:
        """Whether ``exit_`` is this stop's doing (a signal of it, after it began)."""
        return (
            exit_.exitcode < 0
            and -exit_.exitcode in self.signals
            and exit_.finished_at >= (self.at)
        )


class ExitNotes(Protocol):
    """What the progress part knows of the workers' ends (``agent/progress/duties.py``)."""

    def amend(
        self, exits: Mapping[int, WorkerExit], stop: AgentStop | None
    ) -> dict[int, WorkerExit]:
        """The exits, each one after its script's end counted as the script's status."""

    def failure_error(self, pid: int) -> WorkerErrorInfo | None:
        """The error of a worker the agent killed (hung, outlived), else None."""

    def stacks_file(self, local_rank: int) -> Path | None:
        """The worker's ``stacks.txt`` of this attempt, when one was written."""


class NoNotes:
    """Notes of an agent that watches no progress: exits as they are."""

    def amend(
        self, exits: Mapping[int, WorkerExit], stop: AgentStop | None
    ) -> dict[int, WorkerExit]:
        """The exits unchanged."""
        return dict(exits)

    def failure_error(self, pid: int) -> WorkerErrorInfo | None:
        """None: the agent killed no worker for a verdict of its own."""
        return None

    def stacks_file(self, local_rank: int) -> Path | None:
        """None: no stacks are taken."""
        return None


@dataclass(frozen=True)
class _Expiry:
    scope_id: str
    where: str


class LocalWorkerGroup:
    """The processes of this node's workers, attempt after attempt.

    Args:
        role: the workers' role (in their failure records).
        host: this node's host name (in their failure records).
        guardian: the guardian the workers' sessions are registered with.
        on_exit: called from a waiter thread when a worker exits (wakes the loop).
        notes: what progress knows of the workers' ends.
        return_value: a callable entrypoint's return value by local rank (None: a program).
    """

    def __init__(
        self,
        *,
        role: str,
        host: str,
        guardian: Guardian,
        on_exit: Callable[[], None],
        notes: ExitNotes | None = None,
        return_value: Callable[[int], Any] | None = None,
    ) -> None:
        self._role = role
        self._host = host
        self._guardian = guardian
        self._on_exit = on_exit
        self._notes: ExitNotes = notes if notes is not None else NoNotes()
        self._return_value = return_value
        self._procs: WorkerProcesses | None = None
        self._launched: dict[int, WorkerLaunch] = {}
        self._stop: AgentStop | None = None
        self._expiries: dict[int, _Expiry] = {}
        self._failures: dict[int, FailureRecord] = {}  # by pid: built once
        self._last = GroupView()
        self._group: WorkerGroup | None = None

    # -- the attempt -------------------------------------------------------------------

    def start(self, launches: Sequence[WorkerLaunch]) -> dict[int, int]:
        """Start an attempt's workers; return their pids by local rank.

        Raises:
            AgentError: a worker cannot be spawned.
        """
        self._expiries = {}
        self._failures = {}
        self._stop = None
        procs = WorkerProcesses(launches, on_exit=self._on_exit, guardian=self._guardian)
        self._procs = procs
        self._launched = {launch.local_rank: launch for launch in launches}
        procs.start()
        return dict(procs.pids)

    @property
    def pids(self) -> dict[int, int]:
        """This attempt's pids by local rank (empty before the first start)."""
        return dict(self._procs.pids) if self._procs is not None else {}

    def is_worker_pid(self, pid: int) -> bool:
        """Whether ``pid`` is one of this attempt's workers (any thread)."""
        procs = self._procs
        return procs is not None and pid in procs.pids.values()

    @property
    def stop_began(self) -> AgentStop | None:
        """The agent's stop of this attempt, once it began."""
        return self._stop

    def stop(self, signals: Iterable[int], timeout_s: float, escalate: Callable[[], bool]) -> None:
        """Stop every worker: the first signal, SIGKILL after ``timeout_s``. Idempotent.

        Args:
            signals: the stopping signal, then SIGKILL.
            timeout_s: the grace before SIGKILL.
            escalate: True when the grace must end at once (a second signal arrived).
        """
        procs = self._procs
        if procs is None:
            return
        signals = tuple(signals)
        now = time.time()
        stop = self._stop
        self._stop = (
            stop.again(signals, now)
            if stop is not None
            else AgentStop(frozenset(int(s) for s in signals), now)
        )
        first = signals[0]
        procs.stop(int(first), float(timeout_s), escalate=escalate)

    def begin_stop(self, signals: Iterable[int]) -> float | None:
        """Send the stopping signal to every worker now and return at once; :meth:`stop` with
        the same signals completes the stop (its grace counted from here).

        Args:
            signals: the stopping signal, then SIGKILL (the stop is recorded as the agent's).

        Returns:
            When the signal went (epoch seconds), or None when nothing was sent (no workers,
            or a stop began already).
        """
        procs = self._procs
        if procs is None or self._stop is not None:
            return None
        signals = tuple(signals)
        # Recorded first: an exit by this signal is the agent's stop, never a crash.
        self._stop = AgentStop(frozenset(int(s) for s in signals), time.time())
        return procs.begin_stop(int(signals[0]))

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to every running worker (a preemption notice)."""
        if self._procs is not None:
            self._procs.send_signal(sig)

    def note_expiry(self, pid: int, scope_id: str, where: str) -> None:
        """The watchdog killed ``pid`` (its timer ``scope_id`` expired; ``where`` it was).

        Called from the watchdog's thread before it wakes the loop.
        """
        self._expiries[pid] = _Expiry(scope_id, where)

    # -- each turn ---------------------------------------------------------------------

    def observe(self, group: WorkerGroup) -> GroupView:
        """The group now: one poll of the processes, exits amended once, failures built once.

        Args:
            group: the worker group (its workers' global ranks).
        """
        self._group = group
        procs = self._procs
        if procs is None:
            self._last = GroupView(
                workers=tuple(
                    WorkerView(w.local_rank, w.global_rank, None, "INIT") for w in group.workers
                )
            )
            return self._last
        exits = self._notes.amend(procs.poll(), self._stop)
        pids = procs.pids
        stopped = self._stop is not None
        views = []
        for worker in group.workers:
            lr = worker.local_rank
            exit_ = exits.get(lr)
            if exit_ is None:
                state = ("STOPPED" if stopped else "HEALTHY") if lr in pids else "INIT"
            elif exit_.exitcode == 0:
                state = "SUCCEEDED"
            else:
                state = "STOPPED" if stopped else "FAILED"
            views.append(
                WorkerView(
                    lr, worker.global_rank, pids.get(lr), state, exit_.exitcode if exit_ else None
                )
            )
        failed = [e for e in exits.values() if e.exitcode != 0]
        if failed:
            records = sorted(
                (self._failure(group, e) for e in failed),
                key=lambda f: (f.timestamp, f.global_rank),
            )
            status, values = WorkersStatus.FAILED, {}
        elif group.workers and len(exits) == len(group.workers):
            records = []
            status = WorkersStatus.SUCCEEDED
            values = {
                group.workers[lr].global_rank: (
                    self._return_value(lr) if self._return_value is not None else None
                )
                for lr in exits
            }
        else:
            records, status, values = [], WorkersStatus.RUNNING, {}
        state = {
            WorkersStatus.FAILED: WorkerState.FAILED,
            WorkersStatus.SUCCEEDED: WorkerState.SUCCEEDED,
        }.get(status, WorkerState.HEALTHY)
        self._last = GroupView(
            status, tuple(views), tuple(records), values, stopped, len(self._expiries), state
        )
        return self._last

    @property
    def last(self) -> GroupView:
        """The view :meth:`observe` returned last."""
        return self._last

    def failures_after_stop(self, view: GroupView) -> tuple[FailureRecord, ...]:
        """The failures a failed run reports, its workers stopped.

        Programs: as torch's ``SubprocessContext`` reports them, the workers that failed and
        those the stop then ended with a non-zero status (a signal's ``-N``). Callables: the
        workers that failed, as torch's ``MultiprocessContext``.

        Args:
            view: the turn that failed.
        """
        if self._return_value is not None or self._group is None:
            return view.failures
        after = self.observe(self._group)
        if after.status is not WorkersStatus.FAILED:
            return view.failures
        known = {f.global_rank for f in view.failures}
        return view.failures + tuple(f for f in after.failures if f.global_rank not in known)

    def _failure(self, group: WorkerGroup, exit_: WorkerExit) -> FailureRecord:
        known = self._failures.get(exit_.pid)
        if known is not None and known.exitcode == exit_.exitcode:
            return known
        launch = self._launched[exit_.local_rank]
        error = read_error_file(launch.error_file) or self._notes.failure_error(exit_.pid)
        expiry = self._expiries.get(exit_.pid)
        if error is None and expiry is not None:
            error = WorkerErrorInfo(
                message=f"the watchdog timer '{expiry.scope_id}' expired and killed the worker"
                + (f" ({expiry.where})" if expiry.where else "")
            )
        timestamp = exit_.finished_at
        if error is not None and error.timestamp is not None:
            timestamp = min(timestamp, error.timestamp)
        record = FailureRecord(
            local_rank=exit_.local_rank,
            global_rank=group.workers[exit_.local_rank].global_rank,
            role=self._role,
            pid=exit_.pid,
            exitcode=exit_.exitcode,
            timestamp=timestamp,
            host=self._host,
            error_file=str(launch.error_file) if launch.error_file.exists() else NOT_AVAILABLE,
            log_dir=launch.log_dir,
            error=error,
            stacks_file=self._notes.stacks_file(exit_.local_rank),
        )
        self._failures[exit_.pid] = record
        return record


def run_result(view: GroupView) -> RunResult:
    """torch's ``_monitor_workers`` answer for a view: HEALTHY, SUCCEEDED or FAILED.

    Args:
        view: the group's view.

    Returns:
        The result, failures and return values by global rank.
    """
    if view.status is WorkersStatus.FAILED:
        return RunResult(WorkerState.FAILED, failures={f.global_rank: f for f in view.failures})
    if view.status is WorkersStatus.SUCCEEDED:
        return RunResult(WorkerState.SUCCEEDED, return_values=dict(view.return_values))
    return RunResult(
        WorkerState.HEALTHY if view.workers and view.workers[0].pid else WorkerState.INIT
    )
