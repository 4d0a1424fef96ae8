"""SimpleElasticAgent: the run loop that executes the agent's state machine over a rendezvous.

Each turn the loop observes (the local workers, pending signals, this node's liveness, and at
most once a second, or when the rendezvous reports a change, one poll of the store), asks
``state_machine.decide`` what to do, and does it; the worker group's state is set only from
the action. Signals are recorded by their handler and acted on here (``signals.py``).

The loop runs on the main thread: workers get a parent-death signal tied to the thread that
spawned them, which must live as long as the agent. Subclasses (``local.py``) start, watch and
stop the workers through torch's extension points: ``_start_workers``, ``_stop_workers``,
``_monitor_workers``, ``_shutdown``; ``_rendezvous``, ``_initialize_workers`` and
``_restart_workers`` are torch's too.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import replace
from types import FrameType
from typing import Any

from elastic_run.agent import state_machine as sm
from elastic_run.agent.api import ElasticAgent, RunResult, WorkerGroup, WorkerSpec, WorkerState
from elastic_run.agent.events import AgentEvent, EventSink
from elastic_run.agent.exit_barrier import exit_barrier, leave_last
from elastic_run.agent.failures import FailureRecord
from elastic_run.agent.progress_hooks import ProgressHooks
from elastic_run.agent.ranks import assign_ranks, share_workers_store, wait_keys
from elastic_run.agent.signals import SignalLog, Waker
from elastic_run.agent.snapshot import AgentSnapshot, WorkerSnapshot
from elastic_run.rendezvous.api import AgentRendezvous, InterruptibleRendezvous, RoundPoll
from elastic_run.rendezvous.errors import RendezvousError, RendezvousInterruptedError

__all__ = ["DEFAULT_SIGNALS", "SimpleElasticAgent", "wait_keys"]

log = logging.getLogger(__name__)

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# Events also published to the rendezvous backend for `elastic-run status`.
_PUBLISHED = frozenset(
    {
        "rendezvous.complete",
        "worker.failed",
        "worker.hung",
        "worker.outlived",
        "worker.died_after_script",
        "straggler",
        "watchdog.expired",
        "membership.changed",
        "restart",
        "succeeded",
        "failed",
        "closed",
        "signal",
    }
)
_POLL_INTERVAL_S = 1.0


class _RoundEnded(Exception):
    """Internal: the round ended while the agent set it up; rendezvous again."""


class SimpleElasticAgent(ElasticAgent, ProgressHooks):
    """The elastic run loop; subclasses start, watch and stop the workers.

    Args:
        spec: what to run.
        exit_barrier_timeout: how long a node that finished waits for the others (s).
        shutdown_timeout: the grace period between the stop signal and SIGKILL (s).
        signals: the signals the agent handles and forwards.
        on_event: receives every event (the CLI's view, the JSON lines log).
    """

    def __init__(
        self,
        spec: WorkerSpec,
        exit_barrier_timeout: float = 300,
        shutdown_timeout: float = 30,
        *,
        signals: Iterable[int] = DEFAULT_SIGNALS,
        on_event: EventSink | None = None,
    ) -> None:
        self._spec = spec
        self._worker_group = WorkerGroup(spec)
        self._exit_barrier_timeout = float(exit_barrier_timeout)
        self._shutdown_timeout = float(shutdown_timeout)
        self._signals = tuple(signals)
        self._sinks: list[EventSink] = [on_event] if on_event is not None else []
        self._restarts = 0
        self._attempt, self._joined_at = -1, float("-inf")
        self._waker = Waker()
        self._signal_log = SignalLog()
        handler = spec.rdzv_handler
        self._rdzv: AgentRendezvous | None = (
            handler if isinstance(handler, AgentRendezvous) else None
        )
        if isinstance(handler, InterruptibleRendezvous):
            handler.set_interrupt(lambda: self._signal_log.pending_stop() is not None)
        self._changed = threading.Event()
        self._polled_at = float("-inf")
        self._poll = RoundPoll()
        self._in_rendezvous = False
        self._last_loop = time.monotonic()
        self._workers_store: Any = None

    # -- the ElasticAgent interface ---------------------------------------------------

    def get_worker_group(self, role: str = "default") -> WorkerGroup:
        """Return this node's worker group."""
        return self._worker_group

    @property
    def restarts(self) -> int:
        """The job's restart count as of this node's round (TORCHELASTIC_RESTART_COUNT)."""
        return self._restarts

    @property
    def attempt(self) -> int:
        """The number of the current attempt on this node (0 for the first start)."""
        return self._attempt

    def add_event_sink(self, sink: EventSink) -> None:
        """Send every event to ``sink`` as well."""
        self._sinks.append(sink)

    def snapshot(self) -> AgentSnapshot:
        """A read-only picture of the agent (for the live view and /status)."""
        group, spec = self._worker_group, self._spec
        handler = spec.rdzv_handler
        return AgentSnapshot(
            run_id=handler.get_run_id(),
            backend=handler.get_backend(),
            endpoint=self._rdzv.endpoint if self._rdzv is not None else "",
            state="RENDEZVOUS" if self._in_rendezvous else group.state.value,
            round=group.round,
            group_rank=group.group_rank if group.group_rank is not None else -1,
            group_world_size=group.group_world_size or -1,
            world_size=group.workers[0].world_size if group.workers else -1,
            restarts=self._restarts,
            max_restarts=spec.max_restarts,
            workers=tuple(
                WorkerSnapshot(
                    local_rank=w.local_rank,
                    rank=w.global_rank,
                    pid=w.id,
                    state=self._worker_state(w.local_rank),
                    exitcode=self._worker_exitcode(w.local_rank),
                    progress=self._worker_progress(w.local_rank),
                )
                for w in group.workers
            ),
            job_progress=self._job_progress(),
        )

    def loop_alive_since(self) -> float:
        """Monotonic time of the loop's last turn (a rendezvous in progress counts as now)."""
        return time.monotonic() if self._in_rendezvous else self._last_loop

    # -- torch's extension points ------------------------------------------------------

    @abstractmethod
    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        """Start the group's workers with the ranks it carries; return their ids by local rank."""

    @abstractmethod
    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        """Stop every worker (SIGTERM, SIGKILL after the shutdown timeout). Idempotent."""

    @abstractmethod
    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        """Return the group's state now: HEALTHY, SUCCEEDED, or FAILED with its failures."""

    @abstractmethod
    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        """Stop the workers with ``death_sig``, SIGKILL after ``timeout`` s. Idempotent."""

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        """Join the next round; set the group's ranks, store and master address."""
        spec, handler, rdzv = self._spec, self._spec.rdzv_handler, self._rdzv
        if rdzv is not None:
            rdzv.set_local_info(spec.local_world_size, spec.role)
            rdzv.set_change_callback(self._on_rdzv_change)
        self._publish_state("RENDEZVOUS")
        self._emit(
            "rendezvous.joining",
            f"joining the rendezvous (attempt {self._attempt + 1})",
            attempt=self._attempt + 1,
        )
        self._in_rendezvous = True
        try:
            info = handler.next_rendezvous()
        finally:
            self._in_rendezvous = False
            self._last_loop = time.monotonic()
        self._changed.clear()
        self._polled_at, self._joined_at = float("-inf"), time.monotonic()
        group = worker_group
        group.store, group.round = info.store, info.round
        group.group_rank, group.group_world_size = info.rank, info.world_size
        assignment = rdzv.assignment if rdzv is not None else None
        if assignment is not None:
            self._restarts = assignment.restart_count
        assign_ranks(group, assignment, lambda: self._signal_log.pending_stop() is not None)
        self._workers_store = None  # the previous round's workers' store goes away here
        if info.bootstrap_store_info is not None:
            addr, port = (
                info.bootstrap_store_info.master_addr,
                info.bootstrap_store_info.master_port,
            )
        else:
            addr, port, self._workers_store = share_workers_store(
                info.store,
                info.rank,
                self._advertised_addr(),
                self._give_up_waiting,
            )
        group.master_addr, group.master_port = addr, port
        w0 = group.workers[0]
        self._emit(
            "rendezvous.complete",
            f"round {info.round} complete: node {info.rank} of {info.world_size}, "
            f"ranks {w0.global_rank}..{w0.global_rank + len(group.workers) - 1} "
            f"of {w0.world_size}",
            round=info.round,
            group_rank=info.rank,
            group_world_size=info.world_size,
            world_size=w0.world_size,
            master_addr=addr,
            master_port=port,
            restart_count=self._restarts,
        )

    def _initialize_workers(self, worker_group: WorkerGroup) -> None:
        """Rendezvous, then start the workers (torch's)."""
        self._rendezvous(worker_group)
        self._start_attempt(worker_group)

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        """Stop the workers, then rendezvous and start them again (torch's)."""
        self._stop_workers(worker_group)
        self._initialize_workers(worker_group)

    # -- optional hooks -------------------------------------------------------------------

    def _worker_state(self, local_rank: int) -> str:
        return self._worker_group.state.value

    def _worker_exitcode(self, local_rank: int) -> int | None:
        return None

    def _forward_signal(self, sig: int) -> None:
        """Send ``sig`` to every running worker (a preemption notice). Default: nothing."""

    def _setup(self) -> None:
        """Start services that live as long as the run (watchdog, health). Default: none."""

    def _teardown(self) -> None:
        """Stop what ``_setup`` started. Idempotent."""

    # -- events ------------------------------------------------------------------------

    def _emit(self, kind: str, message: str, *, publish: bool = True, **fields: Any) -> None:
        """Hand an event to the sinks; publish it to the store unless ``publish`` is False
        (the caller publishes it later with ``_publish_event``: the store may not answer)."""
        event = AgentEvent(kind, message, fields)
        for sink in self._sinks:
            try:
                sink(event)
            except Exception:  # a view must never break the agent
                log.exception("an event sink failed")
        if publish:
            self._publish_event(kind, message, fields)

    def _publish_event(self, kind: str, message: str, fields: dict[str, Any]) -> None:
        if kind in _PUBLISHED and self._rdzv is not None:
            self._rdzv.publish_event(kind, message, fields)

    def _publish_state(self, state: str, message: str = "") -> None:
        if self._rdzv is not None:
            self._rdzv.publish_state(state, self._restarts, message)

    # -- signals -------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signal_log.record(signum)  # only record and wake: the loop acts
        self._waker.wake()

    def _install_signal_handlers(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous
        for sig in self._signals:
            previous[sig] = signal.signal(sig, self._on_signal)
        return previous

    def _on_rdzv_change(self) -> None:
        self._changed.set()
        self._waker.wake()

    def _give_up_waiting(self) -> None:
        """Raise when a wait during set-up must end: a signal, or the round ended."""
        if self._signal_log.pending_stop() is not None:
            raise RendezvousInterruptedError("interrupted by a signal")
        poll = self._poll_store()
        if poll.closed is not None or poll.round_over:
            raise _RoundEnded()

    # -- the loop ------------------------------------------------------------------------

    def run(self, role: str = "default") -> RunResult:
        """Run this node's part of the job until it succeeds, fails, closes or is signalled.

        Returns:
            The result; ``exit_code`` is what the CLI exits with.
        """
        from elastic_run.agent.executor import run_to_end

        previous = self._install_signal_handlers()
        try:
            result = run_to_end(self)
        finally:
            try:
                self._shutdown(signal.SIGKILL, 0)
                self._teardown()
                try:
                    self._spec.rdzv_handler.shutdown()
                except RendezvousError as exc:
                    log.warning("leaving the rendezvous failed: %s", exc)
                self._workers_store = None
            finally:
                for sig, old in previous.items():
                    signal.signal(sig, old)
                self._waker.close()
        self._emit(
            "agent.exited", f"agent exits with code {result.exit_code}", exit_code=result.exit_code
        )
        return result

    def _poll_store(self) -> RoundPoll:
        """The rendezvous's view: ours keeps it current (no I/O here); a torch-style handler is
        asked at most once a second."""
        if self._rdzv is not None:
            self._poll = self._rdzv.poll()
            return self._poll
        now = time.monotonic()
        if not self._changed.is_set() and now - self._polled_at < _POLL_INTERVAL_S:
            return self._poll
        self._changed.clear()
        self._polled_at = now
        handler = self._spec.rdzv_handler
        closed = "closed" if handler.is_closed() else None
        self._poll = RoundPoll(closed=closed, nodes_waiting=handler.num_nodes_waiting())
        return self._poll

    def _observe(self, result: RunResult) -> sm.Observation:
        for rank, failure in list(result.failures.items()):
            if not isinstance(failure, FailureRecord):  # a torch-style subclass's ProcessFailure
                result.failures[rank] = FailureRecord.of(
                    failure, rank, self._spec.role, socket.gethostname()
                )
        status = {
            WorkerState.FAILED: sm.WorkersStatus.FAILED,
            WorkerState.UNHEALTHY: sm.WorkersStatus.FAILED,  # torch restarts an unhealthy group
            WorkerState.SUCCEEDED: sm.WorkersStatus.SUCCEEDED,
        }.get(result.state, sm.WorkersStatus.RUNNING)
        obs = self._progress_observation(
            sm.Observation(
                sm.Phase.RUNNING,
                signal=self._signal_log.pending_stop(),
                workers=status,
                restarts=self._restarts,
                max_restarts=self._spec.max_restarts,
            )
        )
        if status is not sm.WorkersStatus.RUNNING or obs.signal is not None:
            return obs
        poll = self._poll_store()
        report = self._rdzv.liveness() if self._rdzv is not None else None
        # Counted from this round's join at most: the join itself reached the store. Judged at
        # the last tick within the budget (peers may judge this node gone once it has passed),
        # a tick being at most a quarter of the budget.
        since = min(report.since_ok_s, time.monotonic() - self._joined_at) if report else 0.0
        early = min(self._spec.monitor_interval, report.budget_s / 4) if report else 0.0
        lost = report is not None and since + early >= report.budget_s
        return replace(
            obs,
            closed=_closed_reason(poll.closed),
            liveness_lost=lost,
            round_over=poll.round_over,
            member_lost=poll.member_lost,
            end_cause=poll.end_cause,
            nodes_waiting=poll.nodes_waiting,
        )

    def _wait_tick(self) -> None:
        self._waker.wait(self._spec.monitor_interval)
        self._last_loop = time.monotonic()
        for sig in self._signal_log.take_forwarded():
            self._forward_signal(sig)
            name = signal.Signals(sig).name
            self._emit("signal", f"forwarded {name} to the workers", signal=name, forwarded=True)

    def _start_attempt(self, group: WorkerGroup) -> None:
        self._attempt += 1
        pids = self._start_workers(group)
        self._set_state(sm.Start().state)
        self._publish_state("HEALTHY")
        self._emit(
            "workers.started",
            f"started {len(group.workers)} workers (attempt {self._attempt}, "
            f"restart count {self._restarts})",
            pids=[pids.get(w.local_rank) for w in group.workers],
            ranks=[w.global_rank for w in group.workers],
            attempt=self._attempt,
        )

    def _set_state(self, state: WorkerState) -> None:
        self._worker_group.state = state

    def _advertised_addr(self) -> str:
        if self._spec.local_addr:
            return self._spec.local_addr
        if self._rdzv is not None:
            return self._rdzv.advertised_addr
        return socket.getfqdn()

    def _close_rendezvous(self, reason: sm.ClosedReason) -> None:
        try:
            if self._rdzv is not None:
                self._rdzv.set_closed(reason)
            else:
                self._spec.rdzv_handler.set_closed()
        except RendezvousError as exc:
            log.warning("closing the rendezvous failed: %s", exc)

    def _exit_barrier(self) -> None:
        """Wait for every node of the round to finish (or the job to close), then close the
        rendezvous as succeeded (see ``exit_barrier.py``)."""
        exit_barrier(self)

    def _interrupted(self) -> None:
        if self._signal_log.pending_stop() is not None:
            raise RendezvousInterruptedError("interrupted by a signal")

    def _leave_last(self) -> None:
        """Say this node leaves the round; the node that hosts the store waits for the others."""
        leave_last(self)


def _closed_reason(text: str | None) -> sm.ClosedReason | None:
    if text is None:
        return None
    if text == "succeeded":
        return "succeeded"
    if text == "failed":
        return "failed"
    return "closed"
