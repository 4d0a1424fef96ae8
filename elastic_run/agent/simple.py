"""SimpleElasticAgent: the run loop over a rendezvous, independent of how workers run.

One loop per node, on the main thread (the thread that spawns the workers must live as long
as the agent: their parent-death signal fires when it exits):

    rendezvous -> ranks -> the workers' store -> start -> monitor
        failed     -> report the failure to the rendezvous (first reporter counts one
                      restart), stop, rendezvous again; restarts used up: close as failed
        waiting / lost / round over -> stop, rendezvous again (counts nothing)
        succeeded  -> exit barrier, close the rendezvous as succeeded
        closed     -> stop, leave

A signal in ``signals`` (SIGTERM, SIGINT, ...) interrupts whatever the loop does; the agent
forwards it to the workers, waits ``shutdown_timeout_s``, kills what is left, and the run
ends with exit code 128+N. A second signal while stopping kills the workers at once.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Iterable
from datetime import timedelta
from types import FrameType
from typing import TYPE_CHECKING, Any

from elastic_run.agent.api import ElasticAgent, RunResult, WorkerGroup, WorkerSpec, WorkerState
from elastic_run.agent.events import AgentEvent, EventSink
from elastic_run.agent.snapshot import AgentSnapshot, WorkerSnapshot
from elastic_run.errors import AgentError, ElasticRunError
from elastic_run.rendezvous.errors import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousTimeoutError,
)

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

__all__ = ["SignalReceived", "SimpleElasticAgent"]

log = logging.getLogger(__name__)

# Events also published to the rendezvous backend for `elastic-run status`.
_PUBLISHED = {
    "rendezvous.complete",
    "worker.failed",
    "watchdog.expired",
    "membership.changed",
    "restart",
    "succeeded",
    "failed",
    "closed",
    "signal",
}
_FORWARD_ONLY = frozenset({signal.SIGUSR1, signal.SIGUSR2})
_MASTER_KEY = "workers-store"
_EXIT_KEY = "exit-barrier"
_LEFT_KEY = "exit-left"


class SignalReceived(ElasticRunError):
    """The agent received a signal it handles; the run stops with 128+N."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum


class _RoundEnded(Exception):
    """Internal: the round ended under us (a member lost, nodes waiting); rendezvous again."""


class SimpleElasticAgent(ElasticAgent):
    """The elastic run loop; subclasses start, watch and stop the workers.

    Args:
        spec: what to run.
        exit_barrier_timeout_s: how long a node that finished waits for the others.
        shutdown_timeout_s: the grace period between the forwarded signal and SIGKILL.
        signals: the signals the agent handles and forwards.
        on_event: receives every event (the CLI's view, the JSON lines log).
    """

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        exit_barrier_timeout_s: float = 300.0,
        shutdown_timeout_s: float = 30.0,
        signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT),
        on_event: EventSink | None = None,
    ) -> None:
        self._spec = spec
        self._group = WorkerGroup(spec)
        self._exit_barrier_timeout_s = exit_barrier_timeout_s
        self._shutdown_timeout_s = shutdown_timeout_s
        self._signals = tuple(signals)
        self._sinks: list[EventSink] = [on_event] if on_event is not None else []
        self._restarts = 0
        self._attempt = -1
        self._wake = threading.Event()
        self._stopping = False
        self._pending_signal: int | None = None
        self._workers_store: Store | None = None
        self._in_rendezvous = False
        self._last_loop = time.monotonic()
        self._hold: Callable[[], None] | None = None
        self._forwarded: list[int] = []

    # -- the ElasticAgent interface ---------------------------------------------------

    def get_worker_group(self, role: str = "default") -> WorkerGroup:
        return self._group

    @property
    def restarts(self) -> int:
        """Restarts this node has spent (TORCHELASTIC_RESTART_COUNT)."""
        return self._restarts

    def add_event_sink(self, sink: EventSink) -> None:
        """Send every event to ``sink`` as well."""
        self._sinks.append(sink)

    def snapshot(self) -> AgentSnapshot:
        """A read-only picture of the agent (for the live view and /status)."""
        group, spec = self._group, self._spec
        handler = spec.rdzv_handler
        state = "RENDEZVOUS" if self._in_rendezvous else group.state.value
        return AgentSnapshot(
            run_id=handler.get_run_id(),
            backend=handler.get_backend(),
            endpoint=_endpoint_of(handler),
            state=state,
            round=group.round,
            group_rank=group.group_rank,
            group_world_size=group.group_world_size,
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
                )
                for w in group.workers
            ),
        )

    def loop_alive_since(self) -> float:
        """Monotonic time of the loop's last turn (a rendezvous in progress counts as now)."""
        return time.monotonic() if self._in_rendezvous else self._last_loop

    def set_loop_hold(self, hold: Callable[[], None] | None) -> None:
        """Test seam: ``hold()`` is called on every monitor turn and may block it."""
        self._hold = hold

    # -- what subclasses provide ---------------------------------------------------------

    @abstractmethod
    def _start_workers(self, group: WorkerGroup) -> None:
        """Start the group's workers with the ranks it carries; fill each Worker.id."""

    @abstractmethod
    def _stop_workers(self, group: WorkerGroup, sig: int, timeout_s: float) -> None:
        """Stop every worker (``sig``, then SIGKILL after ``timeout_s``). Idempotent."""

    @abstractmethod
    def _monitor_workers(self, group: WorkerGroup) -> RunResult:
        """Return the group's state now: HEALTHY, SUCCEEDED, or FAILED with its failures."""

    @abstractmethod
    def _kill_workers_now(self) -> None:
        """SIGKILL every running worker at once (a second signal while stopping)."""

    @abstractmethod
    def _signal_workers(self, sig: int) -> None:
        """Send ``sig`` to every running worker (safe to call from a signal handler)."""

    def _worker_state(self, local_rank: int) -> str:
        return self._group.state.value

    def _worker_exitcode(self, local_rank: int) -> int | None:
        return None

    def _setup(self) -> None:
        """Start services that live as long as the run (watchdog, health). Default: none."""

    def _teardown(self) -> None:
        """Stop what ``_setup`` started. Idempotent."""

    # -- events ------------------------------------------------------------------------

    def _emit(self, kind: str, message: str, **fields: Any) -> None:
        event = AgentEvent(kind, message, fields)
        for sink in self._sinks:
            try:
                sink(event)
            except Exception:  # a view must never break the agent
                log.exception("an event sink failed")
        handler = self._spec.rdzv_handler
        if kind in _PUBLISHED and hasattr(handler, "publish_event"):
            handler.publish_event(kind, message, fields)

    def _publish_state(self, state: str, message: str = "") -> None:
        handler = self._spec.rdzv_handler
        if hasattr(handler, "publish_state"):
            handler.publish_state(state, self._restarts, message)

    # -- signals -------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum in _FORWARD_ONLY:
            # Preemption notices (SBATCH --signal=USR1@60): the workers checkpoint and go on.
            self._signal_workers(signum)
            self._forwarded.append(signum)
            self._wake.set()
            return
        if self._stopping:
            # A second signal while stopping: no more grace.
            self._kill_workers_now()
            return
        self._pending_signal = signum
        self._wake.set()
        raise SignalReceived(signum)

    def _install_signal_handlers(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous
        for sig in self._signals:
            previous[sig] = signal.signal(sig, self._on_signal)
        return previous

    # -- the loop ------------------------------------------------------------------------

    def run(self, role: str = "default") -> RunResult:
        """Run this node's part of the job until it succeeds, fails, closes or is signalled.

        Returns:
            The result; ``exit_code`` is what the CLI exits with.
        """
        previous = self._install_signal_handlers()
        handler = self._spec.rdzv_handler
        try:
            try:
                self._setup()
                self._emit(
                    "agent.started",
                    f"agent up: {self._spec.local_world_size} workers, "
                    f"{handler.get_backend()} rendezvous '{handler.get_run_id()}'",
                    run_id=handler.get_run_id(),
                    nproc_per_node=self._spec.local_world_size,
                    backend=handler.get_backend(),
                    endpoint=_endpoint_of(handler),
                )
                result = self._invoke_run()
            except SignalReceived as exc:
                result = self._stop_for_signal(exc.signum)
            except RendezvousClosedError as exc:
                result = self._closed_result(str(exc))
            except RendezvousError as exc:
                self._stop_all(signal.SIGTERM)
                result = RunResult(WorkerState.FAILED, exit_code=exc.exit_code, reason=str(exc))
                self._emit("failed", str(exc), reason=str(exc), exit_code=exc.exit_code)
            except AgentError as exc:
                self._stop_all(signal.SIGTERM)
                result = RunResult(WorkerState.FAILED, exit_code=exc.exit_code, reason=str(exc))
                self._emit("failed", str(exc), reason=str(exc), exit_code=exc.exit_code)
        except SignalReceived as exc:  # a signal while handling the end
            result = self._stop_for_signal(exc.signum)
        finally:
            self._stopping = True
            try:
                self._stop_all(signal.SIGKILL)
                self._teardown()
                try:
                    handler.shutdown()
                except RendezvousError as exc:
                    log.warning("leaving the rendezvous failed: %s", exc)
                self._workers_store = None
            finally:
                for sig, old in previous.items():
                    signal.signal(sig, old)
        self._emit(
            "agent.exited", f"agent exits with code {result.exit_code}", exit_code=result.exit_code
        )
        return result

    def _stop_all(self, sig: int) -> None:
        self._stopping = True
        self._stop_workers(self._group, sig, self._shutdown_timeout_s)
        self._stopping = False

    def _stop_for_signal(self, signum: int) -> RunResult:
        name = signal.Signals(signum).name
        self._emit("signal", f"received {name}: stopping the workers", signal=name)
        self._stopping = True
        try:
            self._stop_workers(self._group, signum, self._shutdown_timeout_s)
        finally:
            self._stopping = False
        self._group.state = WorkerState.STOPPED
        self._publish_state("STOPPED", f"received {name}")
        self._emit("workers.stopped", f"workers stopped ({name})", signal=name, reason="signal")
        return RunResult(WorkerState.STOPPED, exit_code=128 + signum, reason=f"stopped by {name}")

    def _closed_result(self, why: str) -> RunResult:
        self._stop_all(signal.SIGTERM)
        handler = self._spec.rdzv_handler
        reason = "closed"
        closed_reason = getattr(handler, "closed_reason", None)
        if callable(closed_reason):
            try:
                record = closed_reason()
                if record is not None:
                    reason = str(record.reason)
            except RendezvousError:
                pass
        self._group.state = WorkerState.STOPPED
        self._leave_last()
        if reason == "succeeded":
            self._emit("closed", "the job already finished on the other nodes", reason=reason)
            return RunResult(WorkerState.SUCCEEDED, exit_code=0, reason="the job already finished")
        if reason == "failed":
            msg = "the job failed on another node (its restarts are used up)"
            self._emit("closed", msg, reason=reason)
            return RunResult(WorkerState.FAILED, exit_code=1, reason=msg)
        self._emit("closed", f"the rendezvous was closed: {why}", reason=reason)
        return RunResult(WorkerState.STOPPED, exit_code=3, reason=why)

    def _invoke_run(self) -> RunResult:
        spec, group = self._spec, self._group
        handler = spec.rdzv_handler
        while True:
            self._rendezvous()
            self._start_attempt()
            while True:
                self._wait_tick()
                outcome = self._monitor_workers(group)
                state = outcome.state
                if state == WorkerState.SUCCEEDED:
                    group.state = WorkerState.SUCCEEDED
                    self._publish_state("SUCCEEDED")
                    self._emit("succeeded", "every local worker succeeded")
                    self._exit_barrier()
                    return RunResult(
                        WorkerState.SUCCEEDED, return_values=outcome.return_values, exit_code=0
                    )
                if state == WorkerState.FAILED:
                    group.state = WorkerState.FAILED
                    first = self._report_failure()
                    failed = sorted(outcome.failures.values(), key=lambda f: f.timestamp)
                    head = failed[0] if failed else None
                    self._emit(
                        "worker.failed",
                        f"worker rank {head.global_rank} (local {head.local_rank}) failed: "
                        f"{head.how}"
                        if head
                        else "a worker failed",
                        local_rank=head.local_rank if head else -1,
                        rank=head.global_rank if head else -1,
                        exitcode=head.exitcode if head else None,
                        counted=first,
                    )
                    if first and self._restarts >= spec.max_restarts:
                        self._stop_all(signal.SIGTERM)
                        reason = (
                            f"worker failure and {spec.max_restarts} restart"
                            f"{'' if spec.max_restarts == 1 else 's'} used up"
                        )
                        self._close_rendezvous("failed")
                        self._publish_state("FAILED", reason)
                        self._emit(
                            "failed", f"the job failed: {reason}", reason=reason, exit_code=1
                        )
                        return RunResult(
                            WorkerState.FAILED,
                            failures=outcome.failures,
                            exit_code=1,
                            reason=reason,
                        )
                    if first:
                        self._restarts += 1
                    self._emit(
                        "restart",
                        f"restarting the workers ({self._restarts}/{spec.max_restarts} restarts"
                        f"{' spent' if first else ', not counted: another node failed first'})",
                        restarts=self._restarts,
                        max_restarts=spec.max_restarts,
                        counted=first,
                    )
                    self._stop_all(signal.SIGTERM)
                    break
                # Healthy: has the job changed around us?
                if handler.is_closed():
                    raise RendezvousClosedError(f"rendezvous '{handler.get_run_id()}' is closed")
                waiting = handler.num_nodes_waiting()
                over = bool(getattr(handler, "is_round_over", lambda: False)())
                if waiting > 0 or over:
                    ended = self._round_end() if over else {}
                    lost = handler.has_lost_member() or ended.get("cause") == "member_lost"
                    reason = (
                        "member_lost" if lost else "nodes_waiting" if waiting else "round_ended"
                    )
                    who = ", ".join(ended.get("lost", ())) or ended.get("ended_by", "")
                    text = {
                        "member_lost": "a member of the round was lost",
                        "nodes_waiting": f"{waiting} node{'s' if waiting > 1 else ''} waiting to join",
                        "round_ended": "the round ended on another node",
                    }[reason] + (f" ({who})" if who and reason != "nodes_waiting" else "")
                    self._emit(
                        "membership.changed",
                        f"{text}: stopping the workers to re-rendezvous",
                        reason=reason,
                        waiting=waiting,
                        **ended,
                    )
                    self._stop_all(signal.SIGTERM)
                    break

    def _round_end(self) -> dict[str, Any]:
        """Who ended this node's round and why (event fields), as far as the handler can say.

        Best-effort: a handler without ``round_end`` or a backend error gives no fields.
        """
        read = getattr(self._spec.rdzv_handler, "round_end", None)
        if not callable(read):
            return {}
        try:
            record = read()
        except RendezvousError as exc:
            log.debug("could not read why the round ended: %s", exc)
            return {}
        if record is None:
            return {}
        fields: dict[str, Any] = {"cause": record.reason, "ended_by": record.by}
        if record.node_ids:
            fields["lost"] = list(record.node_ids)
        return fields

    def _wait_tick(self) -> None:
        self._wake.wait(self._spec.monitor_interval)
        self._wake.clear()
        if self._hold is not None:
            self._hold()
        self._last_loop = time.monotonic()
        while self._forwarded:
            name = signal.Signals(self._forwarded.pop(0)).name
            self._emit("signal", f"forwarded {name} to the workers", signal=name, forwarded=True)

    def _report_failure(self) -> bool:
        report = getattr(self._spec.rdzv_handler, "report_failure", None)
        if callable(report):
            return bool(report())
        return True

    def _close_rendezvous(self, reason: str) -> None:
        handler = self._spec.rdzv_handler
        try:
            try:
                handler.set_closed(reason)  # type: ignore[call-arg]
            except TypeError:
                handler.set_closed()
        except RendezvousError as exc:
            log.warning("closing the rendezvous failed: %s", exc)

    # -- rendezvous and ranks ----------------------------------------------------------------

    def _rendezvous(self) -> None:
        spec, group = self._spec, self._group
        handler = spec.rdzv_handler
        set_local_info = getattr(handler, "set_local_info", None)
        if callable(set_local_info):
            set_local_info(spec.local_world_size, spec.role)
        set_change_callback = getattr(handler, "set_change_callback", None)
        if callable(set_change_callback):
            set_change_callback(self._wake.set)  # a lost member wakes the loop at once
        group.state = WorkerState.INIT
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
        group.store = info.store
        group.group_rank = info.rank
        group.group_world_size = info.world_size
        group.round = info.round
        self._assign_ranks(info.store, info.rank, info.world_size)
        self._workers_store = None  # the previous round's workers' store goes away here
        addr, port = self._share_workers_store(info.store, info.rank)
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
        )

    def _assign_ranks(self, store: Store, group_rank: int, group_world_size: int) -> None:
        spec, group = self._spec, self._group
        assignment = getattr(spec.rdzv_handler, "assignment", None)
        if assignment is not None:
            offset, total = assignment.rank_offset, assignment.total_workers
            role_offset, role_total = assignment.role_offset, assignment.role_total
        else:
            # No seal to compute from (static): every node publishes its size, reads all.
            store.set(f"lws/{group_rank}", f"{spec.local_world_size}:{spec.role}")
            keys = [f"lws/{i}" for i in range(group_world_size)]
            if not wait_keys(store, keys, 600.0):
                raise AgentError("not every node published its local world size in 600 s")
            sizes = [bytes(store.get(k)).decode().split(":", 1) for k in keys]
            counts = [int(n) for n, _ in sizes]
            offset, total = sum(counts[:group_rank]), sum(counts)
            role_offset = sum(int(n) for n, r in sizes[:group_rank] if r == spec.role)
            role_total = sum(int(n) for n, r in sizes if r == spec.role)
        for w in group.workers:
            w.global_rank = offset + w.local_rank
            w.role_rank = role_offset + w.local_rank
            w.world_size = total
            w.role_world_size = role_total
            w.id = None

    def _advertised_addr(self) -> str:
        spec = self._spec
        if spec.local_addr:
            return spec.local_addr
        addr = getattr(spec.rdzv_handler, "_addr", None)
        return str(addr) if addr else socket.getfqdn()

    def _share_workers_store(self, store: Store, group_rank: int) -> tuple[str, int]:
        """Node 0 hosts a fresh TCPStore for this round's workers; every node learns where."""
        from torch._C._distributed_c10d import TCPStore

        if group_rank == 0:
            addr = self._advertised_addr()
            try:
                server = TCPStore(
                    "0.0.0.0" if addr not in ("localhost", "127.0.0.1") else addr,
                    0,
                    is_master=True,
                    wait_for_workers=False,
                    timeout=timedelta(seconds=60),
                )
            except RuntimeError as exc:
                raise AgentError(f"cannot host the workers' store: {exc}") from exc
            self._workers_store = server
            store.set(_MASTER_KEY, f"{addr}:{server.port}")
            return addr, int(server.port)
        if not wait_keys(store, [_MASTER_KEY], 120.0):
            raise AgentError("node 0 of the round did not publish the workers' store in 120 s")
        raw = bytes(store.get(_MASTER_KEY)).decode()
        host, _, port = raw.rpartition(":")
        return host, int(port)

    def _start_attempt(self) -> None:
        self._attempt += 1
        self._start_workers(self._group)
        group = self._group
        group.state = WorkerState.HEALTHY
        self._publish_state("HEALTHY")
        self._emit(
            "workers.started",
            f"started {len(group.workers)} workers (attempt {self._attempt}, "
            f"restart count {self._restarts})",
            pids=[w.id for w in group.workers],
            ranks=[w.global_rank for w in group.workers],
            attempt=self._attempt,
        )

    @property
    def attempt(self) -> int:
        """The number of the current attempt on this node (0 for the first start)."""
        return self._attempt

    def _exit_barrier(self) -> None:
        """Wait for every node of the round to finish, then close the rendezvous as succeeded."""
        store, group = self._group.store, self._group
        if store is None:
            return
        from torch.distributed import DistStoreError

        keys = [f"{_EXIT_KEY}/{i}" for i in range(group.group_world_size)]
        try:
            store.set(f"{_EXIT_KEY}/{group.group_rank}", "1")
            if not wait_keys(store, keys, self._exit_barrier_timeout_s):
                log.warning(
                    "exit barrier: not every node finished within %.0f s",
                    self._exit_barrier_timeout_s,
                )
                return
        except (DistStoreError, RuntimeError) as exc:
            log.warning("exit barrier: %s", exc)
            return
        self._close_rendezvous("succeeded")
        self._leave_last()

    def _leave_last(self) -> None:
        """Say this node leaves the round; the node that hosts the store waits for the others.

        The store lives in one agent: were it to leave first, the others' last reads (the
        closed record, dropping their heartbeat) would find it gone. Bounded by 10 s, for a
        member that died.
        """
        store, group = self._group.store, self._group
        if store is None:
            return
        from torch.distributed import DistStoreError

        handler = self._spec.rdzv_handler
        hosting = bool(getattr(getattr(handler, "backend", None), "is_hosting", False))
        try:
            if not hosting:
                # Leave the rendezvous (drop the heartbeat) while the store is surely there.
                try:
                    handler.shutdown()
                except RendezvousError as exc:
                    log.warning("leaving the rendezvous failed: %s", exc)
            store.set(f"{_LEFT_KEY}/{group.group_rank}", "1")
            if hosting:
                left = [f"{_LEFT_KEY}/{i}" for i in range(group.group_world_size)]
                wait_keys(store, left, 10.0)
        except (DistStoreError, RuntimeError) as exc:
            log.debug("leaving the round: %s", exc)


def wait_keys(store: Store, keys: list[str], timeout_s: float, slice_s: float = 0.5) -> bool:
    """Wait for ``keys`` in short slices, so a signal handler runs between them.

    Returns:
        Whether every key exists.
    """
    from torch.distributed import DistStoreError

    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            store.wait(keys, timedelta(seconds=max(0.001, min(slice_s, left))))
            return True
        except DistStoreError as exc:
            # torch's stores say "timeout", ours (a RendezvousTimeoutError) "timed out".
            timed_out = isinstance(exc, RendezvousTimeoutError) or "timeout" in str(exc).lower()
            if not timed_out:
                raise
        if time.monotonic() >= deadline:
            return False


def _endpoint_of(handler: Any) -> str:
    backend = getattr(handler, "backend", None)
    endpoint = getattr(backend, "endpoint", None)
    return str(endpoint) if endpoint else ""
