"""SimpleElasticAgent: the run loop that executes the agent's state machine over a rendezvous.

Each turn the loop observes (the local workers, pending signals, this node's liveness, and at
most once a second, or when the rendezvous reports a change, one poll of the store), asks
``state_machine.decide`` what to do, and does it; the worker group's state is set only from
the action. Signals are recorded by their handler and acted on here (``signals.py``).

This class is the one owner of the loop's state: it observes, decides (``state_machine.py``) and
applies every action itself; each effect of an action (stop the workers, report a failure, close
the rendezvous, emit events, publish state) lives in the "applying" section below. Library errors
become actions too: a rendezvous that fails ends the run with its documented exit code; an agent
error (a worker that cannot be spawned) exits 1. The exit barrier gets a narrow ``RoundExit``.

The loop runs on the main thread: workers get a parent-death signal tied to the thread that
spawned them, which must live as long as the agent. Subclasses (``local.py``) start, watch and
stop the workers through torch's extension points: ``_start_workers``, ``_stop_workers``,
``_monitor_workers``, ``_shutdown``; ``_rendezvous``, ``_initialize_workers`` and
``_restart_workers`` are torch's too.
"""

from __future__ import annotations

import inspect
import logging
import signal
import socket
import threading
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Iterable
from dataclasses import replace
from types import FrameType
from typing import Any

from elastic_run.agent.api import ElasticAgent, RunResult, WorkerGroup, WorkerSpec, WorkerState
from elastic_run.agent.events import AgentEvent, EventSink
from elastic_run.agent.loop import goodput as gp
from elastic_run.agent.loop import state_machine as sm
from elastic_run.agent.loop.exit_barrier import RoundExit
from elastic_run.agent.loop.progress_hooks import ProgressHooks
from elastic_run.agent.loop.ranks import assign_ranks, share_workers_store, wait_keys
from elastic_run.agent.loop.signals import SignalLog, Waker
from elastic_run.agent.loop.snapshot import AgentSnapshot, WorkerSnapshot
from elastic_run.agent.workers.failures import FailureRecord
from elastic_run.errors import AgentError
from elastic_run.rendezvous.api import AgentRendezvous, InterruptibleRendezvous, RoundPoll
from elastic_run.rendezvous.errors import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousInterruptedError,
)

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
        self._published: AgentSnapshot | None = None  # written by the loop only
        self._workers_up = False  # the attempt's workers were started and not yet stopped
        self._goodput = gp.begin(time.monotonic())  # folded by the loop only
        self._goodput_from: float | None = None
        # Events handed in from other threads (the watchdog's, the publisher's...): the loop
        # emits them at its next turn (``emit_event``).
        self._posted: deque[AgentEvent] = deque()
        self._loop_thread: threading.Thread | None = None

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

    # -- for subclasses (the services a subclass starts call these, from any thread) -------

    @property
    def rendezvous(self) -> AgentRendezvous | None:
        """The handler's agent-facing calls, or None for a handler with torch's calls only."""
        return self._rdzv

    @property
    def shutdown_timeout(self) -> float:
        """Seconds the workers get between the stopping signal and SIGKILL."""
        return self._shutdown_timeout

    def advertised_addr(self) -> str:
        """The address this node gives its peers: ``--local-addr``, else the rendezvous's."""
        if self._spec.local_addr:
            return self._spec.local_addr
        if self._rdzv is not None:
            return self._rdzv.advertised_addr
        return socket.getfqdn()

    def wake(self) -> None:
        """Make the loop take its next turn now (a worker exited, a timer expired)."""
        self._waker.wake()

    def stop_signal_count(self) -> int:
        """How many stopping signals (SIGTERM, SIGINT, ...) the agent has received so far."""
        return self._signal_log.stop_count()

    def emit_event(self, kind: str, message: str, **fields: Any) -> None:
        """Emit an agent event from any thread.

        On the loop's thread (or when no loop runs) it is emitted at once. From another thread
        it is published to the store on that thread (a store that does not answer must not
        hold the loop) and handed to the loop, which is woken and gives it to the sinks and
        the goodput account before its own next event, with the time it was handed in: only
        the loop folds events and runs the sinks.
        """
        loop = self._loop_thread
        if loop is None or loop is threading.current_thread():
            self._emit(kind, message, **fields)
            return
        self._posted.append(AgentEvent(kind, message, fields))
        self._waker.wake()
        self._publish_event(kind, message, fields)

    def flush_events(self) -> None:
        """Emit now the events other threads handed in (``emit_event``) and the loop has not.

        The loop calls it before each of its own events and at each turn; a subclass calls it
        in its teardown once the threads that post are stopped, before it closes its sinks.
        """
        while self._posted:
            event = self._posted.popleft()
            self._fold_goodput(event.kind, event.fields)
            self._tell_sinks(event)

    def snapshot(self) -> AgentSnapshot:
        """The picture of the agent the loop published last (any thread; for the live view,
        ``/status`` and ``/metrics``). Reading it never computes, emits, publishes or judges:
        the loop builds a new immutable snapshot each turn and at every state change."""
        published = self._published
        return published if published is not None else self._first_snapshot()

    def _first_snapshot(self) -> AgentSnapshot:
        """The picture before the loop's first turn: nothing but the spec."""
        handler = self._spec.rdzv_handler
        return AgentSnapshot(
            run_id=handler.get_run_id(),
            backend=handler.get_backend(),
            endpoint=self._rdzv.endpoint if self._rdzv is not None else "",
            state=self._worker_group.state.value,
            round=self._worker_group.round,
            group_rank=-1,
            group_world_size=-1,
            world_size=-1,
            restarts=self._restarts,
            max_restarts=self._spec.max_restarts,
            workers=(),
            job_progress=None,
        )

    def _publish_snapshot(self) -> None:
        """Build the agent's picture on the loop's thread and publish it for the views."""
        group, spec = self._worker_group, self._spec
        handler = spec.rdzv_handler
        self._published = AgentSnapshot(
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
            goodput=gp.account(self._goodput, time.monotonic()),
        )

    def count_goodput_from(self, monotonic_s: float) -> None:
        """Start the goodput account at ``monotonic_s`` (the launcher's process start, so the
        account sees the interpreter's start too) instead of when ``run`` is called."""
        self._goodput_from = monotonic_s

    def goodput(self) -> gp.GoodputAccount:
        """Where this node's wall time went, as last published (final once ``run`` returned)."""
        account = self.snapshot().goodput
        return account if account is not None else gp.account(self._goodput, time.monotonic())

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
        self._publish_snapshot()
        try:
            info = handler.next_rendezvous()
        finally:
            self._in_rendezvous = False
            self._last_loop = time.monotonic()
            self._publish_snapshot()
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
                self.advertised_addr(),
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

    def _failures_after_stop(self, result: RunResult) -> dict[int, Any]:
        """The failures a failed run returns, its workers stopped. Default: ``result``'s (torch's
        callables: the workers that failed)."""
        return dict(result.failures)

    def _setup(self) -> None:
        """Start services that live as long as the run (watchdog, health). Default: none."""

    def _teardown(self) -> None:
        """Stop what ``_setup`` started. Idempotent."""

    # -- events ------------------------------------------------------------------------

    def _emit(self, kind: str, message: str, *, publish: bool = True, **fields: Any) -> None:
        """Hand an event to the sinks; publish it to the store unless ``publish`` is False
        (the caller publishes it later with ``_publish_event``: the store may not answer).
        Every event is folded into the goodput account first (its phases are the events'),
        after the events other threads handed in before it."""
        self.flush_events()
        self._fold_goodput(kind, fields)
        self._tell_sinks(AgentEvent(kind, message, fields))
        if publish:
            self._publish_event(kind, message, fields)

    def _tell_sinks(self, event: AgentEvent) -> None:
        for sink in self._sinks:
            try:
                sink(event)
            except Exception:  # a view must never break the agent
                log.exception("an event sink failed")

    def _fold_goodput(self, kind: str, fields: dict[str, Any]) -> None:
        now = time.monotonic()
        failed_at = None
        if kind == "worker.failed":
            self._fold_beats()  # beats of the workers that exited since the last tick count
            wall = fields.get("failed_at")
            if isinstance(wall, (int, float)):  # epoch seconds: dated on this host's clocks
                failed_at = now - max(0.0, time.time() - float(wall))
        self._goodput = gp.on_event(self._goodput, kind, now, fields, failed_at_s=failed_at)

    def _fold_beats(self) -> None:
        reading = self._beat_reading()
        if reading is not None:
            self._goodput = gp.beat(self._goodput, reading[0], reading[1] / 1e9)

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
        now = time.monotonic()
        self._goodput = gp.begin(min(now, self._goodput_from if self._goodput_from else now))
        self._loop_thread = threading.current_thread()
        previous = self._install_signal_handlers()
        try:
            result = self._run_to_end()
            self.flush_events()
            self._goodput = gp.close(self._goodput, time.monotonic())
            self._publish_snapshot()
            final = gp.account(self._goodput, time.monotonic())
            self._emit("goodput", gp.summary_line(final), publish=False, **final.to_json())
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
                self.flush_events()  # what the teardown's threads posted last
                self._loop_thread = None
        # After the teardown: to the sinks still open only (the events log is closed), neither
        # folded nor published (this node has left the rendezvous).
        self._tell_sinks(
            AgentEvent(
                "agent.exited",
                f"agent exits with code {result.exit_code}",
                {"exit_code": result.exit_code},
            )
        )
        return result

    # -- applying the decisions (each turn: observe, decide, apply) -----------------------

    def _run_to_end(self) -> RunResult:
        """Run the loop until the job ends for this node; return the result."""
        handler = self._spec.rdzv_handler
        group = self._worker_group
        try:
            self._setup()
            self._emit(
                "agent.started",
                f"agent up: {self._spec.local_world_size} workers, "
                f"{handler.get_backend()} rendezvous '{handler.get_run_id()}'",
                run_id=handler.get_run_id(),
                nproc_per_node=self._spec.local_world_size,
                backend=handler.get_backend(),
                endpoint=self._rdzv.endpoint if self._rdzv is not None else "",
            )
            again = False
            while True:
                try:
                    action = self._join_and_start(again)
                except _RoundEnded:
                    again = True  # the round ended while it was set up: join the next
                    continue
                if not isinstance(action, sm.Start):
                    return self._apply_end(action, RunResult(WorkerState.INIT))
                again = True
                while True:
                    self._wait_tick()
                    result = self._monitor_workers(group)
                    self._fold_beats()
                    self._publish_snapshot()
                    action = self._decide_turn(result)
                    if isinstance(action, sm.Wait):
                        continue
                    if isinstance(action, (sm.Restart, sm.Rejoin)):
                        self._apply_again(action, result)
                        break
                    return self._apply_end(action, result)
        except RendezvousError as exc:
            return self._fail_run(exc.exit_code, str(exc))
        except AgentError as exc:
            return self._fail_run(exc.exit_code, str(exc))

    def _join_and_start(self, again: bool) -> sm.Action:
        """Rendezvous and start the workers through torch's extension points (a subclass's
        ``_initialize_workers`` / ``_restart_workers`` take effect), then decide."""
        obs = sm.Observation(sm.Phase.JOINING)
        reason = ""
        try:
            if again:
                self._restart_workers(self._worker_group)
            else:
                self._initialize_workers(self._worker_group)
        except RendezvousInterruptedError:
            pass  # the signal is in the log: decide() stops
        except RendezvousClosedError as exc:
            reason = str(exc)
            obs = replace(obs, closed=self._closed_now())
        except RendezvousError as exc:
            reason = str(exc)
            obs = replace(obs, rendezvous_error=exc.exit_code)
        action = sm.decide(replace(obs, signal=self._signal_log.pending_stop()))
        if isinstance(action, sm.End) and reason and action.closed in (None, "closed"):
            return replace(action, reason=reason)
        return action

    def _closed_now(self) -> sm.ClosedReason:
        if self._rdzv is None:
            return "closed"
        try:
            return _closed_reason(self._rdzv.closed_reason()) or "closed"
        except RendezvousError:
            return "closed"

    def _decide_turn(self, result: RunResult) -> sm.Action:
        obs = self._observe(result)
        action = sm.decide(obs)
        if isinstance(action, sm.StopHung):
            self._stop_hung()  # the hung workers die: the next turn sees the group FAILED
            return sm.Wait(action.state)
        if not isinstance(action, sm.ReportFailure):
            return action
        self._set_state(action.state)
        counted = self._report_failure() if self._rdzv is not None else True
        failed = sorted(result.failures.values(), key=lambda f: f.timestamp)
        head = failed[0] if failed else None
        self._emit(
            "worker.failed",
            f"worker rank {head.global_rank} (local {head.local_rank}) failed: {head.how}"
            if head
            else "a worker failed",
            local_rank=head.local_rank if head else -1,
            rank=head.global_rank if head else -1,
            exitcode=head.exitcode if head else None,
            counted=counted,
            failed_at=round(head.timestamp, 6) if head else None,
        )
        finished = self._round_exit().peers_finished()
        return sm.decide(replace(obs, failure_counted=counted, peers_finished=finished))

    def _report_failure(self) -> bool:
        """End the round for this node's failure; True when it counts (``report_failure``).

        When it would end the job (the restarts are used up), the rendezvous is asked to look
        for a lost member first, if its ``report_failure`` takes ``last_restart`` (an
        ``AgentRendezvous`` written before it did is called as before).
        """
        assert self._rdzv is not None
        report = self._rdzv.report_failure
        try:
            takes_last = "last_restart" in inspect.signature(report).parameters
        except (TypeError, ValueError):
            takes_last = False
        if takes_last and self._restarts >= self._spec.max_restarts:
            return report(last_restart=True)
        return report()

    def _why_not_counted(self) -> str:
        lost = self._rdzv is not None and self._rdzv.poll().member_lost
        return "a member of the round was lost" if lost else "another node failed first"

    def _apply_again(self, action: sm.Restart | sm.Rejoin, result: Any) -> None:
        """Stop the workers so that the loop can rendezvous again."""
        spec = self._spec
        if isinstance(action, sm.Restart):
            after = self._restarts + (1 if action.counted else 0)
            self._emit(
                "restart",
                f"restarting the workers ({after}/{spec.max_restarts} restarts"
                f"{' spent' if action.counted else ', not counted: ' + self._why_not_counted()})",
                restarts=after,
                max_restarts=spec.max_restarts,
                counted=action.counted,
            )
        else:
            # Cut off from the store: nothing on the way to stopping the workers may wait on it
            # (a read or a publication would wait out the link's deadline, read_timeout on etcd).
            cut_off = action.reason == "liveness_lost"
            fields = {} if cut_off else self._round_end_fields()
            waiting = self._poll.nodes_waiting
            who = ", ".join(fields.get("lost", ())) or fields.get("ended_by", "")
            text = _rejoin_text(action.reason, waiting)
            if who and action.reason in ("member_lost", "round_ended"):
                text += f" ({who})"
            if cut_off and self._rdzv is not None:
                report = self._rdzv.liveness()
                text += f": no successful heartbeat for {report.since_ok_s:.1f} s"
                if report.error:
                    text += f" ({report.error})"
            text += _REJOIN_SUFFIX
            fields.update(reason=action.reason, waiting=waiting)
            self._emit("membership.changed", text, publish=not cut_off, **fields)
        self._set_state(action.state)
        if isinstance(action, sm.Restart):
            self._before_failed_stop()
        self._stop_workers(self._worker_group)
        if isinstance(action, sm.Restart):
            self._say_stopped("failure", *_first_failure(result))
        else:
            self._say_stopped(action.reason, text.removesuffix(_REJOIN_SUFFIX))
        if isinstance(action, sm.Rejoin) and action.reason == "liveness_lost":
            self._publish_event("membership.changed", text, fields)
        self._attempt_ended(failed=isinstance(action, sm.Restart))
        if isinstance(action, sm.Rejoin) and action.reason != "liveness_lost":
            self._say_finished()
        if isinstance(action, sm.Rejoin) and self._rdzv is not None:
            if action.reason in ("nodes_waiting", "liveness_lost"):
                # This node ends the round: record why, so the others tell the same story.
                try:
                    self._rdzv.leave_round(action.reason)
                except RendezvousError as exc:
                    log.warning("could not record why this node left the round: %s", exc)

    def _say_finished(self) -> None:
        """Warn when nodes of the round being left finished: they wait at the exit barrier and never
        rejoin, so the next round forms without them, or (below the minimum) waits for the join
        timeout. Read once the workers are stopped: the store may be slow to answer now."""
        finished = self._round_exit().finished_so_far()
        if finished:
            log.warning(
                "%d node%s of the round this node leaves finished and will not rejoin: the next "
                "round forms without %s, or waits for the join timeout if too few nodes remain",
                finished,
                "s" if finished != 1 else "",
                "them" if finished != 1 else "it",
            )

    def _round_end_fields(self) -> dict[str, Any]:
        """Who ended this node's round and why (event fields); none when it cannot be read."""
        if self._rdzv is None:
            return {}
        try:
            end = self._rdzv.round_end()
        except RendezvousError as exc:
            log.warning("could not read why the round ended: %s", exc)
            return {}
        if end is None:
            return {}
        fields: dict[str, Any] = {"cause": end.cause, "ended_by": end.ended_by}
        if end.lost:
            fields["lost"] = list(end.lost)
        return fields

    def _apply_end(self, action: sm.Action, result: RunResult) -> RunResult:
        """Apply an action that ends the run; return the run's result."""
        spec = self._spec
        if isinstance(action, sm.Stop):
            name = signal.Signals(action.signal).name
            self._emit("signal", f"received {name}: stopping the workers", signal=name)
            self._shutdown(signal.Signals(action.signal), int(self._shutdown_timeout))
            self._say_stopped("signal", f"received {name}", signal=name)
            self._set_state(action.state)
            self._publish_state("STOPPED", f"received {name}")
            return RunResult(action.state, exit_code=action.exit_code, reason=f"stopped by {name}")
        if isinstance(action, (sm.Fail, sm.NoProgress)):
            self._before_failed_stop()
            self._stop_workers(self._worker_group)
            if isinstance(action, sm.NoProgress):
                self._say_stopped("no_progress", "no progress over the restarts allowed")
            else:
                self._say_stopped("failure", *_first_failure(result))
            reason = (
                f"worker failure and {spec.max_restarts} restart"
                f"{'' if spec.max_restarts == 1 else 's'} used up"
            )
            if isinstance(action, sm.Fail) and action.finished:
                reason = (
                    f"worker failure after {action.finished} node"
                    f"{' had' if action.finished == 1 else 's had'} finished the round (a finished "
                    "node does not run its workers again: no restart)"
                )
            if isinstance(action, sm.NoProgress):
                reason = (
                    f"no progress: {action.restarts} restart{'' if action.restarts == 1 else 's'} "
                    "in a row ended without a progress beat (--max-no-progress-restarts)"
                )
            self._close_rendezvous("failed")
            self._set_state(action.state)
            self._publish_state("FAILED", reason)
            self._emit(
                "failed", f"the job failed: {reason}", reason=reason, exit_code=action.exit_code
            )
            self._leave_last()  # the store's host waits until the others have read `closed`
            return RunResult(
                action.state,
                failures=self._failures_after_stop(result),
                exit_code=action.exit_code,
                reason=reason,
            )
        if isinstance(action, sm.Finish):
            self._set_state(action.state)
            self._publish_state("SUCCEEDED")
            self._emit("succeeded", "every local worker succeeded")
            self._exit_barrier()
            return RunResult(
                action.state, return_values=result.return_values, exit_code=action.exit_code
            )
        if isinstance(action, sm.End):
            self._stop_workers(self._worker_group)
            if action.closed is not None:
                self._say_stopped("closed", action.reason, closed=action.closed)
            else:
                self._say_stopped("rendezvous_error", action.reason)
            self._set_state(action.state)
            if action.closed is not None:
                self._leave_last()
                self._emit("closed", action.reason, reason=action.closed)
            else:
                self._emit(
                    "failed", action.reason, reason=action.reason, exit_code=action.exit_code
                )
            return RunResult(action.state, exit_code=action.exit_code, reason=action.reason)
        raise AssertionError(f"not an ending action: {action}")

    def _fail_run(self, exit_code: int, reason: str) -> RunResult:
        self._stop_workers(self._worker_group)
        self._say_stopped("error", reason)
        self._set_state(WorkerState.FAILED)
        self._emit("failed", reason, reason=reason, exit_code=exit_code)
        return RunResult(WorkerState.FAILED, exit_code=exit_code, reason=reason)

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
        self.flush_events()
        for sig in self._signal_log.take_forwarded():
            self._forward_signal(sig)
            name = signal.Signals(sig).name
            self._emit("signal", f"forwarded {name} to the workers", signal=name, forwarded=True)

    def _start_attempt(self, group: WorkerGroup) -> None:
        self._attempt += 1
        pids = self._start_workers(group)
        self._workers_up = True
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

    def _say_stopped(
        self, reason: str, why: str, fields: dict[str, Any] | None = None, **more: Any
    ) -> None:
        """Say once per attempt that this node's agent stopped its workers, and why.

        Args:
            reason: ``member_lost``, ``nodes_waiting``, ``round_ended``, ``liveness_lost``,
                ``failure``, ``no_progress``, ``signal``, ``closed``, ``rendezvous_error`` or
                ``error``.
            why: the same for people.
            fields: more event fields (the failed rank...).
            more: more event fields (the signal...).
        """
        if not self._workers_up:
            return  # nothing ran (an end during a rendezvous), or already said
        self._workers_up = False
        self._emit(
            "workers.stopped",
            f"this node's agent stopped its workers: {why}",
            by="agent",
            reason=reason,
            **(fields or {}),
            **more,
        )

    def _set_state(self, state: WorkerState) -> None:
        self._worker_group.state = state
        self._publish_snapshot()

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
        self._round_exit().wait_for_all(self._exit_barrier_timeout)

    def _round_exit(self) -> RoundExit:
        """The exit barrier's view of this node's round, with the loop calls it needs."""
        group = self._worker_group
        return RoundExit(
            store=group.store,
            group_rank=group.group_rank,
            group_world_size=group.group_world_size,
            hosting=self._rdzv.is_hosting if self._rdzv is not None else False,
            interrupted=self._interrupted,
            closed_now=lambda: self._poll_store().closed,
            close=lambda reason: self._close_rendezvous(_closed_reason(reason) or "closed"),
            leave_rendezvous=self._spec.rdzv_handler.shutdown,
        )

    def _interrupted(self) -> None:
        if self._signal_log.pending_stop() is not None:
            raise RendezvousInterruptedError("interrupted by a signal")

    def _leave_last(self) -> None:
        """Say this node leaves the round; the node that hosts the store waits for the others."""
        self._round_exit().leave_last()


def _closed_reason(text: str | None) -> sm.ClosedReason | None:
    if text is None:
        return None
    if text == "succeeded":
        return "succeeded"
    if text == "failed":
        return "failed"
    return "closed"


_REJOIN_SUFFIX = ": stopping the workers to re-rendezvous"


def _first_failure(result: Any) -> tuple[str, dict[str, Any]]:
    """The first failure of a failed group, for ``workers.stopped``: (text, fields)."""
    failures = sorted(getattr(result, "failures", {}).values(), key=lambda f: f.timestamp)
    if not failures:
        return "the worker group failed", {}
    rank = failures[0].global_rank
    return f"worker rank {rank} failed", {"rank": rank}


def _rejoin_text(reason: sm.RejoinReason, waiting: int) -> str:
    if reason == "nodes_waiting":
        return f"{waiting} node{'s' if waiting != 1 else ''} waiting to join"
    return {
        "liveness_lost": "this node lost its liveness (its heartbeat failed)",
        "member_lost": "a member of the round was lost",
        "round_ended": "the round ended on another node",
    }[reason]
