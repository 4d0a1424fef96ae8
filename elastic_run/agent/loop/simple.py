"""SimpleElasticAgent: the run loop, observe -> decide -> apply, over the agent's parts.

Each turn the loop asks each of its parts for one frozen record (``parts.py``): the worker group
(a :class:`~elastic_run.agent.rules.observation.GroupView`), progress (a ``ProgressView``) and the
rendezvous (a ``RoundView``, from ``rendezvous_part.py``); it publishes the snapshot the views
read, built from those records; ``state_machine.decide`` asks the rules (``agent/rules/``) what to
do; and the loop applies the action. The worker group's state is set only from the action.
Signals are recorded by their handler and acted on here (``signals.py``).

This class is the one owner of the loop's state; each effect of an action (stop the workers,
report a failure, close the rendezvous, emit events, publish state) lives in the "applying"
section below, and the progress rules' effects go back to the progress part. Library errors
become actions too: a rendezvous that fails ends the run with its documented exit code; an agent
error (a worker that cannot be spawned) exits 1. The exit barrier gets a narrow ``RoundExit``.

The loop runs on the main thread: workers get a parent-death signal tied to the thread that
spawned them, which must live as long as the agent. torch's extension points are kept: a
subclass starts, watches and stops its workers through ``_start_workers``, ``_stop_workers``,
``_monitor_workers`` and ``_shutdown``; ``_rendezvous``, ``_initialize_workers`` and
``_restart_workers`` are torch's too. ``LocalElasticAgent`` gives the loop its own worker and
progress parts instead of the defaults.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import threading
import time
import traceback
from abc import abstractmethod
from collections import deque
from collections.abc import Iterable
from dataclasses import replace
from types import FrameType
from typing import Any

from elastic_run.agent.api import ElasticAgent, RunResult, WorkerGroup, WorkerSpec, WorkerState
from elastic_run.agent.config import DEFAULT_SIGNALS
from elastic_run.agent.events import AgentEvent, EventSink
from elastic_run.agent.loop import goodput as gp
from elastic_run.agent.loop import state_machine as sm
from elastic_run.agent.loop.exit_barrier import RoundExit
from elastic_run.agent.loop.node_ledger import NodeLedger
from elastic_run.agent.loop.parts import (
    LinkCheckPart,
    MonitoredWorkers,
    NodeCheckPart,
    NoProgressWatch,
    ProgressPart,
    WorkerPart,
)
from elastic_run.agent.loop.ranks import (
    assign_ranks,
    load_torch_distributed,
    share_workers_store,
    wait_keys,
)
from elastic_run.agent.loop.rendezvous_part import RendezvousPart, closed_reason
from elastic_run.agent.loop.signals import SignalLog, Waker
from elastic_run.agent.loop.snapshot import AgentSnapshot, WorkerSnapshot
from elastic_run.agent.rules.nodes.history import Fault, follows_rank
from elastic_run.agent.rules.observation import GroupView, ProgressView, RoundView, WorkerView
from elastic_run.agent.rules.registry import published_events
from elastic_run.agent.settings import table as settings
from elastic_run.errors import AgentError
from elastic_run.metrics import prof, put_metric
from elastic_run.rendezvous.api import (
    AgentRendezvous,
    Assignment,
    InterruptibleRendezvous,
    RoundPoll,
)
from elastic_run.rendezvous.errors import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousInterruptedError,
)
from elastic_run.torch_events import Event, EventMetadataValue, EventSource

__all__ = ["DEFAULT_SIGNALS", "SimpleElasticAgent", "wait_keys"]

log = logging.getLogger(__name__)

# Events the loop itself emits that are also published to the rendezvous backend for
# `elastic-run status`; the rules' own are in their registry entries.
_LOOP_PUBLISHED = frozenset(
    {
        "rendezvous.complete",
        "worker.failed",
        "watchdog.expired",
        "membership.changed",
        "restart",
        "succeeded",
        "failed",
        "closed",
        "signal",
        "worker.died_after_script",
        "node.suspect",
        "node.checked",
        "node.check_failed",
        "failure.followed_rank",
        "link.slow",
    }
)
_PUBLISHED = _LOOP_PUBLISHED | published_events()


class _RoundEnded(Exception):
    """Internal: the round ended while the agent set it up; rendezvous again."""


class _Unfit(Exception):
    """Internal: the node check found this node unfit to rejoin; it leaves the job."""

    def __init__(self, action: sm.Exclude) -> None:
        super().__init__(action.reason)
        self.action = action


class SimpleElasticAgent(ElasticAgent):
    """The elastic run loop; subclasses start, watch and stop the workers.

    Args:
        spec: what to run.
        exit_barrier_timeout: how long a node that finished waits for the others (s).
        shutdown_timeout: the grace period between the stop signal and SIGKILL (s).
        signals: the signals the agent handles and forwards.
        on_event: receives every event (the CLI's view, the JSON lines log).
        workers: the worker group part (default: torch's ``_monitor_workers`` asked each turn).
        progress: the progress part (default: no beats watched).
        max_node_failures: the failures charged to this node, with different ranks, that
            exclude it (``--max-node-failures``; at least 2).
        node_check: checks this node before its first join and before it rejoins as a suspect
            (None: no check).
        link_check: times the round's links after a round of several nodes formed, when its
            size changed (None: no check).
    """

    def __init__(
        self,
        spec: WorkerSpec,
        exit_barrier_timeout: float = settings.EXIT_BARRIER_TIMEOUT.default,
        shutdown_timeout: float = settings.SHUTDOWN_TIMEOUT.default,
        *,
        signals: Iterable[int] = DEFAULT_SIGNALS,
        on_event: EventSink | None = None,
        workers: WorkerPart | None = None,
        progress: ProgressPart | None = None,
        max_node_failures: int = settings.MAX_NODE_FAILURES.default,
        node_check: NodeCheckPart | None = None,
        link_check: LinkCheckPart | None = None,
    ) -> None:
        self._spec = spec
        self._worker_group = WorkerGroup(spec)
        self._exit_barrier_timeout = float(exit_barrier_timeout)
        self._shutdown_timeout = float(shutdown_timeout)
        self._signals = tuple(signals)
        self._sinks: list[EventSink] = [on_event] if on_event is not None else []
        self._restarts = 0
        self._attempt = -1
        self._waker = Waker()
        self._signal_log = SignalLog()
        self._round = RendezvousPart(spec.rdzv_handler, self._waker.wake)
        self._workers: WorkerPart = (
            workers if workers is not None else MonitoredWorkers(self._monitor_workers, spec.role)
        )
        self._progress: ProgressPart = progress if progress is not None else NoProgressWatch()
        self._ledger = NodeLedger(self._round.agent, socket.gethostname(), max_node_failures)
        self._node_check = node_check
        self._link_check = link_check
        self._link_checked_world = 1  # the round size the links were last checked at
        self._links_timed = False  # a link check of this node's ran to its end
        self._followed: list[str] = []  # failures that followed their rank (the script's)
        self._excluded: tuple[str, ...] = ()  # the other nodes excluded, as read at the end
        self._bad_ids: frozenset[str] = frozenset()  # their ids, and this node's when excluded
        handler = spec.rdzv_handler
        if isinstance(handler, InterruptibleRendezvous):
            handler.set_interrupt(lambda: self._signal_log.pending_stop() is not None)
        self._in_rendezvous = False
        self._pending: tuple[sm.Restart | sm.Rejoin, str] | None = None  # stopped, not said
        self._shut_down = False  # the workers were shut down for a signal
        self._started_at: float | None = None
        self._last_loop = time.monotonic()
        self._workers_store: Any = None
        self._group_view = GroupView()  # this turn's records: the loop's alone
        self._progress_view = ProgressView()
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

    @property
    def _remaining_restarts(self) -> int:
        """torch's count: the restarts this job may still spend."""
        return max(0, self._spec.max_restarts - self._restarts)

    def get_event_failed(self) -> Event:
        """torch's agent event of a failed run (its state, this node's facts, the traceback of
        the exception being handled, if any)."""
        return self._construct_event("FAILED", raw_error=traceback.format_exc())

    def get_event_succeeded(self) -> Event:
        """torch's agent event of a succeeded run."""
        return self._construct_event("SUCCEEDED")

    def _construct_event(self, state: str, raw_error: str | None = None) -> Event:
        group, spec = self._worker_group, self._spec
        metadata: dict[str, EventMetadataValue] = {
            "run_id": spec.rdzv_handler.get_run_id(),
            "global_rank": None,
            "group_rank": group.group_rank,
            "worker_id": None,
            "role": spec.role,
            "hostname": socket.getfqdn(),
            "state": state,
            "total_run_time": int(self._run_time_s),
            "rdzv_backend": spec.rdzv_handler.get_backend(),
            "raw_error": raw_error,
            "metadata": json.dumps(
                {
                    "group_world_size": group.group_world_size,
                    "entry_point": spec.get_entrypoint_name(),
                }
            ),
            "agent_restarts": self._restarts,
            "duration_ms": None,
        }
        return Event(f"torchelastic.worker.status.{state}", EventSource.AGENT, metadata=metadata)

    def _record_metrics(self, result: RunResult) -> None:
        """torch's run metrics (``put_metric``): the run, its success or failure with or
        without restarts, and the flakiness (100: failed; else the share of restarts spent)."""
        role, spent = self._spec.role, self._restarts > 0
        failed = result.is_failed()
        most = self._spec.max_restarts
        flakiness = 100.0 if failed else 100.0 - 100.0 * (self._remaining_restarts + 1) / (most + 1)
        put_metric(f"workers.{role}.flakiness", int(flakiness))
        put_metric(f"workers.{role}.run_total", 1)
        for name, holds in (
            ("run_success_with_retries", not failed and spent),
            ("run_success_no_retries", not failed and not spent),
            ("run_failed_with_retries", failed and spent),
            ("run_failed_no_retries", failed and not spent),
        ):
            put_metric(f"workers.{role}.{name}", 1 if holds else 0)

    def add_event_sink(self, sink: EventSink) -> None:
        """Send every event to ``sink`` as well."""
        self._sinks.append(sink)

    # -- for subclasses (the services a subclass starts call these, from any thread) -------

    @property
    def rendezvous(self) -> AgentRendezvous | None:
        """The handler's agent-facing calls, or None for a handler with torch's calls only."""
        return self._round.agent

    @property
    def shutdown_timeout(self) -> float:
        """Seconds the workers get between the stopping signal and SIGKILL."""
        return self._shutdown_timeout

    def advertised_addr(self) -> str:
        """The address this node gives its peers: ``--local-addr``, else the rendezvous's."""
        if self._spec.local_addr:
            return self._spec.local_addr
        if self._round.agent is not None:
            return self._round.agent.advertised_addr
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
            endpoint=self._round.endpoint,
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
        """Build the agent's picture from this turn's records and publish it for the views."""
        group, spec = self._worker_group, self._spec
        handler = spec.rdzv_handler
        view, progress = self._group_view, self._progress_view
        self._published = AgentSnapshot(
            run_id=handler.get_run_id(),
            backend=handler.get_backend(),
            endpoint=self._round.endpoint,
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
                    rank=w.rank,
                    pid=w.pid,
                    state=w.state,
                    exitcode=w.exitcode,
                    progress=progress.workers.get(w.local_rank),
                )
                for w in view.workers
            ),
            job_progress=progress.job,
            goodput=gp.with_bad_nodes(gp.account(self._goodput, time.monotonic()), self._bad_ids),
            watchdog_expiries=view.watchdog_expiries,
            node_health=self._node_health(),
            excluded_nodes=self._excluded,
        )

    def _node_health(self) -> str:
        """``ok``, ``suspect (1 of 2: ...)`` or ``excluded: ...`` (``spare`` while waiting as one)."""
        own = self._ledger.own
        if own is None:
            return "ok"
        return own.state(self._ledger.max_failures)

    def count_goodput_from(self, monotonic_s: float) -> None:
        """Start the goodput account at ``monotonic_s`` (the launcher's process start, so the
        account sees the interpreter's start too) instead of when ``run`` is called."""
        self._goodput_from = monotonic_s

    def goodput(self) -> gp.GoodputAccount:
        """Where this node's wall time went, as last published (final once ``run`` returned)."""
        account = self.snapshot().goodput
        return account if account is not None else gp.account(self._goodput, time.monotonic())

    @property
    def _run_time_s(self) -> float:
        """Seconds since ``run`` was called (0 before)."""
        started = self._started_at
        return time.monotonic() - started if started is not None else 0.0

    def loop_alive_since(self) -> float:
        """Monotonic time of the loop's last turn (a rendezvous in progress counts as now)."""
        return time.monotonic() if self._in_rendezvous else self._last_loop

    # -- torch's extension points ------------------------------------------------------

    @abstractmethod
    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        """Start the group's workers with the ranks it carries; return their ids by local rank."""

    def _begin_stop_workers(self, worker_group: WorkerGroup) -> float | None:
        """Send the workers their stopping signal now, without waiting (ours, beside torch's
        points: ``_stop_workers`` completes the stop). Return when the signal went (epoch
        seconds), or None when nothing was sent. Default: nothing (``_stop_workers`` does it all)."""
        return None

    @abstractmethod
    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        """Stop every worker (SIGTERM, SIGKILL after the shutdown timeout). Idempotent."""

    @abstractmethod
    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        """Return the group's state now: HEALTHY, SUCCEEDED, or FAILED with its failures."""

    @abstractmethod
    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        """Stop the workers with ``death_sig``, SIGKILL after ``timeout`` s. Idempotent."""

    @prof
    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        """Join the next round; set the group's ranks, store and master address."""
        spec, handler, rdzv = self._spec, self._spec.rdzv_handler, self._round.agent
        self._round.joining(spec.local_world_size, spec.role)
        if rdzv is not None:
            rdzv.note_links_untimed(self._link_check is not None and not self._links_timed)
        if self._link_check is not None:
            self._link_check.prepare()
        self._publish_state("RENDEZVOUS")
        self._emit(
            "rendezvous.joining",
            f"joining the rendezvous (attempt {self._attempt + 1})",
            attempt=self._attempt + 1,
        )
        self._in_rendezvous = True
        self._publish_snapshot()
        # Loaded before the node's heartbeat lives: the import holds the GIL for seconds (10 s
        # on a loaded host), and the heartbeat's threads (an etcd lease keeper) starve meanwhile.
        load_torch_distributed()
        try:
            info = handler.next_rendezvous()
        finally:
            self._in_rendezvous = False
            self._last_loop = time.monotonic()
            self._publish_snapshot()
        self._round.joined()
        group = worker_group
        group.store, group.round = info.store, info.round
        group.group_rank, group.group_world_size = info.rank, info.world_size
        assignment = rdzv.assignment if rdzv is not None else None
        if assignment is not None:
            self._restarts = assignment.restart_count
        self._assign_worker_ranks(group, assignment)
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
        self._check_links(info.rank, info.world_size, addr, port, info.round)
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

    @prof
    def _assign_worker_ranks(
        self, worker_group: WorkerGroup, assignment: Assignment | None
    ) -> None:
        """Give each worker its global and role ranks from the round (torch's profiled step;
        its arguments are the group and our rendezvous's assignment, not torch's store)."""
        assign_ranks(worker_group, assignment, lambda: self._signal_log.pending_stop() is not None)

    @prof
    def _initialize_workers(self, worker_group: WorkerGroup) -> None:
        """Rendezvous, then start the workers (torch's)."""
        self._rendezvous(worker_group)
        self._start_attempt(worker_group)

    @prof
    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        """Stop the workers, then rendezvous and start them again (torch's): the group is
        STOPPED in between, and the loop says why it stopped them before it rejoins."""
        self._stop_workers(worker_group)
        worker_group.state = WorkerState.STOPPED
        self._after_stop()
        own = self._ledger.own
        if own is not None and own.faults and own.excluded is None:
            unfit = self._unfit("before this suspect node rejoins")
            if unfit is not None:
                raise _Unfit(unfit)
        self._initialize_workers(worker_group)

    # -- services a subclass runs for the length of the run ------------------------------

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
        reading = self._progress_view.beat_reading
        if reading is not None:
            self._goodput = gp.beat(self._goodput, reading[0], reading[1] / 1e9)

    def _publish_event(self, kind: str, message: str, fields: dict[str, Any]) -> None:
        if kind in _PUBLISHED:
            self._round.publish_event(kind, message, fields)

    def _publish_state(self, state: str, message: str = "") -> None:
        self._round.publish_state(state, self._restarts, message)

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

    def _give_up_waiting(self) -> None:
        """Raise when a wait during set-up must end: a signal, or the round ended."""
        if self._signal_log.pending_stop() is not None:
            raise RendezvousInterruptedError("interrupted by a signal")
        poll = self._round.poll()
        if poll.closed is not None or poll.round_over:
            raise _RoundEnded()

    # -- the loop ------------------------------------------------------------------------

    @prof
    def run(self, role: str = "default") -> RunResult:
        """Run this node's part of the job until it succeeds, fails, closes or is signalled.

        Returns:
            The result; ``exit_code`` is what the CLI exits with.
        """
        now = time.monotonic()
        self._started_at = now
        self._goodput = gp.begin(min(now, self._goodput_from if self._goodput_from else now))
        self._loop_thread = threading.current_thread()
        previous = self._install_signal_handlers()
        try:
            result = self._run_to_end()
            self._excluded = self._ledger.excluded_nodes()  # before leaving: the store's there
            self._bad_ids = self._ledger.excluded_ids()
            self._record_metrics(result)
            self.flush_events()
            self._goodput = gp.close(self._goodput, time.monotonic())
            self._publish_snapshot()
            final = gp.with_bad_nodes(gp.account(self._goodput, time.monotonic()), self._bad_ids)
            self._emit("goodput", gp.summary_line(final), publish=False, **final.to_json())
        finally:
            try:
                if not self._shut_down:  # torch's: the signal's shutdown, else this one
                    self._shutdown(timeout=int(self._shutdown_timeout))
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
        try:
            self._setup()
            self._emit(
                "agent.started",
                f"agent up: {self._spec.local_world_size} workers, "
                f"{handler.get_backend()} rendezvous '{handler.get_run_id()}'",
                run_id=handler.get_run_id(),
                nproc_per_node=self._spec.local_world_size,
                backend=handler.get_backend(),
                endpoint=self._round.endpoint,
                node=str(self._round.agent.node_id) if self._round.agent is not None else "",
                host=socket.gethostname(),
            )
            unfit = self._unfit("before joining")
            if unfit is not None:
                return self._apply_end(unfit)
            again = False
            while True:
                try:
                    action = self._join_and_start(again)
                except _RoundEnded:
                    again = True  # the round ended while it was set up: join the next
                    continue
                if not isinstance(action, sm.Start):
                    return self._apply_end(action)
                again = True
                while True:
                    self._wait_tick()
                    obs, now_ns = self._observe()
                    action = self._decide_turn(obs, now_ns)
                    if isinstance(action, sm.Wait):
                        continue
                    if isinstance(action, (sm.StopHung, sm.KillOutlived, sm.NoteStragglers)):
                        self._progress.apply(action, self._emit_posted)
                        continue
                    if isinstance(action, (sm.Restart, sm.Rejoin)):
                        self._apply_again(action)
                        break
                    return self._apply_end(action)
        except RendezvousError as exc:
            return self._fail_run(exc.exit_code, str(exc))
        except AgentError as exc:
            return self._fail_run(exc.exit_code, str(exc))

    def _emit_posted(self, kind: str, message: str, fields: dict[str, Any]) -> None:
        """The progress part's events, emitted on the loop (``(kind, message, fields)``)."""
        self.emit_event(kind, message, **fields)

    def _join_and_start(self, again: bool) -> sm.Action:
        """Rendezvous and start the workers through torch's extension points (a subclass's
        ``_initialize_workers`` / ``_restart_workers`` take effect), then decide."""
        round_view = RoundView()
        reason = ""
        try:
            if again:
                self._restart_workers(self._worker_group)
            else:
                self._initialize_workers(self._worker_group)
        except _Unfit as unfit:
            return unfit.action
        except RendezvousInterruptedError:
            pass  # the signal is in the log: the rules stop
        except RendezvousClosedError as exc:
            reason = str(exc)
            round_view = RoundView(closed=self._round.closed_now())
        except RendezvousError as exc:
            reason = str(exc)
            round_view = RoundView(rendezvous_error=exc.exit_code)
        obs = sm.Observation(
            sm.Phase.JOINING, signal=self._signal_log.pending_stop(), round=round_view
        )
        action = sm.decide(obs, time.monotonic_ns())
        if isinstance(action, sm.End) and reason and action.closed in (None, "closed"):
            return replace(action, reason=reason)
        return action

    def _observe(self) -> tuple[sm.Observation, int]:
        """Ask every part for this turn's record; publish the snapshot built from them."""
        now_ns = time.monotonic_ns()
        group = self._workers.observe(self._worker_group)
        self._worker_group.state = group.state  # torch's loop: the monitor's answer
        role = self._spec.role
        put_metric(f"workers.{role}.remaining_restarts", self._remaining_restarts)
        put_metric(f"workers.{role}.{group.state.name.lower()}", 1)
        progress = self._progress.observe(group, now_ns)
        self._group_view, self._progress_view = group, progress
        for notice in progress.notices:
            self._emit(notice.kind, notice.message, **notice.fields)
        self._fold_beats()
        self._publish_snapshot()
        signal_ = self._signal_log.pending_stop()
        obs = sm.Observation(
            sm.Phase.RUNNING,
            signal=signal_,
            group=group,
            progress=progress,
            nodes=self._ledger.view(),
            restarts=self._restarts,
            max_restarts=self._spec.max_restarts,
        )
        if group.status is not sm.WorkersStatus.RUNNING or signal_ is not None:
            return obs, now_ns  # the rendezvous is not read: the rules above it decide
        return replace(obs, round=self._round.observe(self._spec.monitor_interval)), now_ns

    def _wait_tick(self) -> None:
        self._waker.wait(self._spec.monitor_interval)
        self._last_loop = time.monotonic()
        self.flush_events()
        for sig in self._signal_log.take_forwarded():
            self._workers.send_signal(sig)
            name = signal.Signals(sig).name
            self._emit("signal", f"forwarded {name} to the workers", signal=name, forwarded=True)

    def _start_attempt(self, group: WorkerGroup) -> None:
        self._attempt += 1
        pids = self._start_workers(group)
        for local_rank, worker_id in pids.items():  # torch's: each worker's id from the start
            group.workers[local_rank].id = worker_id
        self._workers_up = True
        self._group_view = GroupView(
            workers=tuple(
                WorkerView(w.local_rank, w.global_rank, pids.get(w.local_rank), "HEALTHY")
                for w in group.workers
            ),
            watchdog_expiries=0,
        )
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

    def _decide_turn(self, obs: sm.Observation, now_ns: int) -> sm.Action:
        action = sm.decide(obs, now_ns)
        if not isinstance(action, sm.ReportFailure):
            return action
        self._set_state(action.state)
        decided_at = time.time()  # the round's end decided: before the look, the store, the notice
        counted = self._round.report_failure(last_restart=self._restarts >= self._spec.max_restarts)
        head = obs.group.failures[0] if obs.group.failures else None
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
            decided_at=round(decided_at, 6),
        )
        finished = self._round_exit().peers_finished()
        fault = self._fault_of(obs) if counted else None
        if fault is not None:
            self._ledger.charge(fault)
        nodes = self._ledger.read_others()
        action = sm.decide(
            replace(obs, failure_counted=counted, peers_finished=finished, nodes=nodes), now_ns
        )
        if fault is not None and not isinstance(action, sm.Exclude):
            before = follows_rank(fault, nodes.others)
            if before is not None:
                text = (
                    f"the failure of rank {fault.rank} followed its rank from node "
                    f"{before.host or before.node_id}: the script's, not this node's"
                )
                self._followed.append(text)
                self._emit("failure.followed_rank", text, rank=fault.rank, node=before.node_id)
            else:
                self._suspected(fault)
        return action

    def _fault_of(self, obs: sm.Observation) -> Fault | None:
        """The failure this node is charged with: its root-cause worker's."""
        if not obs.group.failures:
            return None
        head = obs.group.failures[0]
        message = head.error.message if head.error is not None else ""
        cause = "worker_failed"
        if message.startswith("hung:"):
            cause = "hung"
        elif "watchdog timer" in message:
            cause = "watchdog"
        name = head.signal_name()
        how = f"exit code {head.exitcode}" if head.exitcode >= 0 else name
        picture = obs.progress.workers.get(head.local_rank)
        return Fault(
            round=self._worker_group.round,
            rank=head.global_rank,
            group_rank=self._worker_group.group_rank or 0,
            cause=cause,
            how="hung" if cause == "hung" else how,
            step=picture.step if picture is not None else -1,
        )

    def _suspected(self, fault: Fault) -> None:
        """This node was charged with a failure and stays: say so, and ask for other ranks in
        the next round (a second failure with other ranks is the node's, one that follows
        the rank to another node is the script's)."""
        own = self._ledger.own
        if own is None:
            return
        agent = self._round.agent
        if agent is not None and fault.group_rank >= 0:
            agent.avoid_rank(fault.group_rank)
        self._emit(
            "node.suspect",
            f"node {self._ledger.host} is {own.state(self._ledger.max_failures)}",
            node=own.node_id,
            host=self._ledger.host,
            failures=len(own.faults),
            max_failures=self._ledger.max_failures,
            evidence=fault.text(),
            group_rank=fault.group_rank,
        )

    def _apply_again(self, action: sm.Restart | sm.Rejoin) -> None:
        """Stop the workers so that the loop can rendezvous again.

        The round's end is known here (this node's failure, or the store confirmed it), so the
        workers get their stopping signal first, before any event or store request: the other
        nodes' workers are stopped within milliseconds of the decision, the bookkeeping runs
        while they exit, and torch's ``_restart_workers`` waits for them.
        """
        spec = self._spec
        text = ""
        if isinstance(action, sm.Restart):
            # The survivors' stacks first: the signals end them.
            self._progress.before_failed_stop(self._group_view.running)
        signalled_at = self._begin_stop_workers(self._worker_group)
        stamps: dict[str, Any] = {}
        if signalled_at is not None:
            stamps["signalled_at"] = round(signalled_at, 6)
        if isinstance(action, sm.Restart):
            after = self._restarts + (1 if action.counted else 0)
            own = self._ledger.own
            ended_by = (
                (own.node_id if own is not None else "")
                if action.counted
                else str(self._round.round_end_fields().get("ended_by", ""))
            )
            self._emit(
                "restart",
                f"restarting the workers ({after}/{spec.max_restarts} restarts"
                f"{' spent' if action.counted else ', not counted: ' + self._round.why_not_counted()})",
                restarts=after,
                max_restarts=spec.max_restarts,
                counted=action.counted,
                ended_by=ended_by,
                **stamps,
            )
        else:
            # Cut off from the store: nothing on the way to stopping the workers may wait on it
            # (a read or a publication would wait out the link's deadline, read_timeout on etcd).
            cut_off = action.reason == "liveness_lost"
            fields = {} if cut_off else self._round.round_end_fields()
            poll = self._round.last_poll
            waiting = poll.nodes_waiting
            who = ", ".join(fields.get("lost", ())) or fields.get("ended_by", "")
            text = _rejoin_text(action.reason, waiting)
            if who and action.reason in ("member_lost", "round_ended"):
                text += f" ({who})"
            if cut_off:
                text += self._round.liveness_text()
            text += _REJOIN_SUFFIX
            fields.update(reason=action.reason, waiting=waiting)
            if poll.learned_by is not None:
                fields["learned_by"] = poll.learned_by
                if poll.notice_from:
                    fields["notice_from"] = poll.notice_from
            # Where the time went, epoch seconds: the notice came, the store confirmed it (or
            # this node's own look or verdict), the workers were signalled.
            if poll.notice_at is not None:
                fields["notice_at"] = round(poll.notice_at, 6)
            if poll.learned_at is not None:
                fields["learned_at"] = round(poll.learned_at, 6)
            fields.update(stamps)
            self._emit("membership.changed", text, publish=not cut_off, **fields)
            if action.reason == "nodes_waiting":
                # This node ends the round for the nodes waiting, now rather than once its
                # workers are down: the others are told at once (the first to decide tells).
                self._round.leave_round(action.reason)
        self._publish_snapshot()
        # The group's state stays the monitor's until torch's _restart_workers sets STOPPED.
        # The stop itself is torch's ``_restart_workers`` (the loop's next join), which hands
        # back to ``_after_stop`` to say why once the workers are down.
        self._pending = (action, text)

    def _after_stop(self) -> None:
        """The workers of the attempt that ended are stopped: say why, count the attempt, and
        (for a node that ends the round) record why in the rendezvous."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        action, text = pending
        if isinstance(action, sm.Restart):
            self._say_stopped("failure", *_first_failure(self._group_view))
        else:
            self._say_stopped(action.reason, text.removesuffix(_REJOIN_SUFFIX))
        if isinstance(action, sm.Rejoin) and action.reason == "liveness_lost":
            self._publish_event("membership.changed", text, {"reason": action.reason})
        self._progress.attempt_ended(isinstance(action, sm.Restart))
        if isinstance(action, sm.Rejoin) and action.reason != "liveness_lost":
            self._say_finished()
        if isinstance(action, sm.Rejoin) and action.reason == "liveness_lost":
            # This node ends the round: record why, so the others tell the same story (once
            # its workers are down: cut off from the store, the write may wait out its link).
            self._round.leave_round(action.reason)

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

    def _apply_end(self, action: sm.Action) -> RunResult:
        """Apply an action that ends the run; return the run's result."""
        spec = self._spec
        if isinstance(action, sm.Stop):
            name = signal.Signals(action.signal).name
            self._emit("signal", f"received {name}: stopping the workers", signal=name)
            self._shutdown(signal.Signals(action.signal), int(self._shutdown_timeout))
            self._shut_down = True
            self._say_stopped("signal", f"received {name}", signal=name)
            self._set_state(action.state)
            self._publish_state("STOPPED", f"received {name}")
            return RunResult(action.state, exit_code=action.exit_code, reason=f"stopped by {name}")
        if isinstance(action, sm.Exclude):
            return self._apply_exclude(action)
        if isinstance(action, (sm.Fail, sm.NoProgress)):
            view = self._group_view
            self._progress.before_failed_stop(view.running)
            self._stop_workers(self._worker_group)
            if isinstance(action, sm.NoProgress):
                self._say_stopped("no_progress", "no progress over the restarts allowed")
            else:
                self._say_stopped("failure", *_first_failure(view))
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
            if self._followed:
                reason += f" ({self._followed[-1]})"
            if isinstance(action, sm.NoProgress):
                reason = (
                    f"no progress: {action.restarts} restart{'' if action.restarts == 1 else 's'} "
                    "in a row ended without a progress beat (--max-no-progress-restarts)"
                )
            self._round.close("failed")
            self._set_state(action.state)
            self._publish_state("FAILED", reason)
            self._emit(
                "failed", f"the job failed: {reason}", reason=reason, exit_code=action.exit_code
            )
            self._leave_last()  # the store's host waits until the others have read `closed`
            return RunResult(
                action.state,
                failures={f.global_rank: f for f in self._workers.failures_after_stop(view)},
                exit_code=action.exit_code,
                reason=reason,
            )
        if isinstance(action, sm.Finish):
            self._set_state(action.state)
            self._publish_state("SUCCEEDED")
            self._emit("succeeded", "every local worker succeeded")
            self._exit_barrier()
            return RunResult(
                action.state,
                return_values=dict(self._group_view.return_values),
                exit_code=action.exit_code,
            )
        if isinstance(action, sm.End):
            if action.closed == "succeeded" and self._attempt < 0:
                action = replace(
                    action,
                    reason="this node waited as a spare and was not needed: the job succeeded "
                    "on the other nodes",
                )
            self._stop_workers(self._worker_group)
            if action.closed is not None:
                self._say_stopped(
                    "closed", action.reason, _learned(self._round.last_poll), closed=action.closed
                )
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

    def _apply_exclude(self, action: sm.Exclude) -> RunResult:
        """Leave the job as unhealthy: stop the workers, record why, leave the round (the others
        re-form at once without this node), exit 6. When the others cannot go on without it
        (fewer than MIN other nodes alive: the round's, those at its door, the round before's
        still beating; and no spare waiting), the job is closed as failed."""
        line = f"node {self._ledger.host} excluded: {action.reason}"
        own = self._ledger.own
        self._ledger.exclude(action.reason)
        self._emit(
            "node.excluded",
            line,
            node=own.node_id if own is not None else "",
            host=self._ledger.host,
            reason=action.reason,
        )
        group = self._worker_group
        poll = self._round.last_poll
        # Counted from the store, not from this round: a round may have formed while members of
        # the one before still stopped their workers (they rejoin), and spares wait at the door.
        left = self._round.others_alive(fallback=(group.group_world_size or 1) - 1)
        fails = group.group_rank is not None and left < self._min_nodes() and poll.spares == 0
        if not fails:
            # The others re-form without this node at once (they are told as it ends the round),
            # while its own workers stop.
            self._round.leave_round("node_excluded")
        self._progress.before_failed_stop(self._group_view.running)
        self._stop_workers(self._worker_group)
        self._say_stopped("excluded", line)
        if fails:
            self._round.close("failed")
            self._emit(
                "failed",
                f"the job failed: {line}; {left} node(s) left, fewer than the minimum",
                reason=line,
                exit_code=action.exit_code,
            )
            self._round.leave_round("node_excluded")
        self._set_state(action.state)
        self._publish_state("EXCLUDED", line)
        agent = self._round.agent
        if agent is not None and agent.is_hosting and group.group_rank is not None:
            self._serve_until_closed(line)
        return RunResult(action.state, exit_code=action.exit_code, reason=line)

    def _serve_until_closed(self, line: str) -> None:
        """An excluded node that hosts the rendezvous store keeps serving it (its workers
        stopped, out of every round) until the job ends: leaving would take the store, and the
        job, with it. A signal ends the wait."""
        self._emit(
            "node.serving",
            f"{line}; this node hosts the rendezvous store: it keeps serving it until the job "
            "ends, then exits 6",
        )
        try:
            self._spec.rdzv_handler.shutdown()  # out of the job: no heartbeat, no round
        except RendezvousError as exc:
            log.warning("leaving the rendezvous failed: %s", exc)
        while self._signal_log.pending_stop() is None and not self._round.is_closed_now():
            self._waker.wait(_SERVE_LOOK_S)
        self._waker.wait(_SERVE_GRACE_S)  # the others read the close before the store goes

    def _check_links(self, rank: int, world: int, addr: str, port: int, round_: int) -> None:
        """After a round of several nodes formed, when it holds a node whose links were never
        timed (the seal says so alike to every member; a torch-style rendezvous: when the
        round's size changed since the last check): time its links, name the slow nodes;
        raise ``_Unfit`` when this node must leave. A round that only lost nodes times
        nothing again: its links were all timed."""
        if self._link_check is None or world < 2:
            return
        rdzv = self._round.agent
        assignment = rdzv.assignment if rdzv is not None else None
        if assignment is not None:
            if assignment.links_untimed == 0:
                return
        elif world == self._link_checked_world:
            return
        found = self._link_check.measure(
            rank,
            world,
            addr,
            port,
            f"link-check/{round_}/{self._restarts}",
            self._round.last_poll.spares,
            self._give_up_waiting,
        )
        # Done, or failed for good (a peer that never came is not waited for again): a
        # check cut short by the round's end stays to do.
        self._link_checked_world = world
        self._links_timed = True
        if not found.completed:
            return
        self._emit(
            "link.checked",
            f"link check of {world} nodes in {found.took_s:.2f} s: "
            + (f"{len(found.named)} slow" if found.named else "no node slow"),
            nodes=world,
            took_s=round(found.took_s, 3),
            slow=len(found.named),
        )
        for line in found.named:
            log.warning("%s", line)
        if found.mine is not None:
            message, fields = found.mine
            self._emit("link.slow", message, **fields)
        if found.exclude is not None:
            self._ledger.charge(
                Fault(round_, -1, rank, "link_slow", f"slow link: {found.exclude}"[:200])
            )
            raise _Unfit(sm.Exclude(f"slow link: {found.exclude}"))

    def _unfit(self, when: str) -> sm.Exclude | None:
        """Run the node check (``when``: for the event); None when the node may join, else
        the exclusion for its reason (the failure charged to this node and published)."""
        if self._node_check is None:
            return None
        fitness = self._node_check.check()
        kind = "node.checked" if fitness.healthy else "node.check_failed"
        self._emit(
            kind,
            fitness.line,
            when=when,
            took_s=round(fitness.took_s, 3),
            check=dict(fitness.record),
        )
        if fitness.healthy:
            return None
        self._ledger.charge(
            Fault(
                round=self._worker_group.round,
                rank=-1,
                group_rank=-1,
                cause="node_check",
                how=f"failed its node check: {fitness.reason}"[:200],
            )
        )
        return sm.Exclude(f"failed its node check: {fitness.reason}")

    def _min_nodes(self) -> int:
        agent = self._round.agent
        return agent.min_nodes if agent is not None else 1

    def _fail_run(self, exit_code: int, reason: str) -> RunResult:
        self._stop_workers(self._worker_group)
        self._say_stopped("error", reason)
        self._set_state(WorkerState.FAILED)
        self._emit("failed", reason, reason=reason, exit_code=exit_code)
        return RunResult(WorkerState.FAILED, exit_code=exit_code, reason=reason)

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

    def _exit_barrier(self) -> None:
        """Wait for every node of the round to finish (or the job to close), then close the
        rendezvous as succeeded (see ``exit_barrier.py``)."""
        self._round_exit().wait_for_all(self._exit_barrier_timeout)

    def _round_exit(self) -> RoundExit:
        """The exit barrier's view of this node's round, with the loop calls it needs."""
        group = self._worker_group
        agent = self._round.agent
        return RoundExit(
            store=group.store,
            group_rank=group.group_rank,
            group_world_size=group.group_world_size,
            hosting=agent.is_hosting if agent is not None else False,
            interrupted=self._interrupted,
            closed_now=lambda: self._round.poll().closed,
            close=lambda reason: self._round.close(closed_reason(reason) or "closed"),
            leave_rendezvous=self._spec.rdzv_handler.shutdown,
        )

    def _interrupted(self) -> None:
        if self._signal_log.pending_stop() is not None:
            raise RendezvousInterruptedError("interrupted by a signal")

    def _leave_last(self) -> None:
        """Say this node leaves the round; the node that hosts the store waits for the others."""
        self._round_exit().leave_last()


_REJOIN_SUFFIX = ": stopping the workers to re-rendezvous"
# An excluded store host: how often it looks whether the job ended, and how long it serves on
# once it did (the others read the close and leave).
_SERVE_LOOK_S = 1.0
_SERVE_GRACE_S = 5.0


def _learned(poll: RoundPoll) -> dict[str, Any]:
    """How this node learned that the job closed (event fields; none when it did not)."""
    if poll.closed is None or poll.learned_by is None:
        return {}
    fields: dict[str, Any] = {"learned_by": poll.learned_by}
    if poll.notice_from:
        fields["notice_from"] = poll.notice_from
    return fields


def _first_failure(view: GroupView) -> tuple[str, dict[str, Any]]:
    """The first failure of a failed group, for ``workers.stopped``: (text, fields)."""
    if not view.failures:
        return "the worker group failed", {}
    rank = view.failures[0].global_rank
    return f"worker rank {rank} failed", {"rank": rank}


def _rejoin_text(reason: sm.RejoinReason, waiting: int) -> str:
    if reason == "nodes_waiting":
        return f"{waiting} node{'s' if waiting != 1 else ''} waiting to join"
    return {
        "liveness_lost": "this node lost its liveness (its heartbeat failed)",
        "member_lost": "a member of the round was lost",
        "round_ended": "the round ended on another node",
    }[reason]
