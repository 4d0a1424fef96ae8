"""LocalElasticAgent: the run loop with subprocess workers on this node.

It owns, for the life of the run: the guardian (no worker outlives the agent), the
file-timer watchdog (when enabled), the health-check server (when a port is given), and the
JSON-lines event log. Per attempt it builds each worker's command and torchrun environment
and hands them to ``WorkerProcesses``.

Logs: ``<log dir>/<run id>/attempt_<n>/<local rank>/{stdout.log,stderr.log,error.json}`` and
``<log dir>/<run id>/events.jsonl``. When another live agent on this host already writes
``<log dir>/<run id>`` (several nodes on one machine), this one uses
``<log dir>/<run id>-<pid>``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from elastic_run.agent.api import RunResult, WorkerGroup, WorkerSpec, WorkerState
from elastic_run.agent.config import LaunchConfig
from elastic_run.agent.events import AgentEvent, EventLog, EventSink
from elastic_run.agent.failures import FailureRecord, WorkerErrorInfo, read_error_file
from elastic_run.agent.guardian import Guardian
from elastic_run.agent.health import HealthCheckServer, Liveness
from elastic_run.agent.processes import WorkerExit, WorkerLaunch, WorkerProcesses
from elastic_run.agent.simple import SimpleElasticAgent
from elastic_run.agent.watchdog import FileTimerServer, TimerExpiry
from elastic_run.errors import AgentError, ConfigurationError

__all__ = ["LocalElasticAgent", "build_worker_env", "open_run_log_dir", "worker_argv"]

log = logging.getLogger(__name__)


def worker_argv(config: LaunchConfig, local_rank: int) -> list[str]:
    """The command of one worker: ``python -u script args`` (or ``-m module``, or the program)."""
    args = [a.replace("${local_rank}", str(local_rank)) for a in config.args]
    if config.no_python:
        return [config.entrypoint, *args]
    python = config.python_exec or os.environ.get("PYTHON_EXEC") or sys.executable
    if config.module:
        return [python, "-u", "-m", config.entrypoint, *args]
    return [python, "-u", config.entrypoint, *args]


def build_worker_env(
    base: Mapping[str, str],
    *,
    group: WorkerGroup,
    local_rank: int,
    restart_count: int,
    max_restarts: int,
    run_id: str,
    use_agent_store: bool,
    error_file: Path,
    timer_file: str | None,
    extra: Mapping[str, str] = {},
) -> dict[str, str]:
    """The environment of one worker: the agent's, plus torchrun's variables (see DESIGN.md)."""
    worker = group.workers[local_rank]
    spec = group.spec
    env = dict(base)
    env.update(extra)
    env.update(
        {
            "LOCAL_RANK": str(local_rank),
            "RANK": str(worker.global_rank),
            "GROUP_RANK": str(group.group_rank),
            "ROLE_RANK": str(worker.role_rank),
            "ROLE_NAME": spec.role,
            "LOCAL_WORLD_SIZE": str(spec.local_world_size),
            "WORLD_SIZE": str(worker.world_size),
            "GROUP_WORLD_SIZE": str(group.group_world_size),
            "ROLE_WORLD_SIZE": str(worker.role_world_size),
            "MASTER_ADDR": str(group.master_addr),
            "MASTER_PORT": str(group.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
            "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_USE_AGENT_STORE": str(use_agent_store),
            "TORCHELASTIC_ERROR_FILE": str(error_file),
        }
    )
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if "OMP_NUM_THREADS" not in base and "OMP_NUM_THREADS" not in extra:
        env["OMP_NUM_THREADS"] = "1"
    if timer_file is not None:
        env["TORCHELASTIC_TIMER_FILE"] = timer_file
    return env


def open_run_log_dir(base: Path, run_id: str) -> tuple[Path, IO[str]]:
    """Claim ``<base>/<run_id>`` for this agent (a lock file), or a sibling if it is taken.

    Returns:
        The directory and the open lock file (keep it open for the life of the agent).

    Raises:
        ConfigurationError: the directory cannot be created or written.
    """
    candidates = [base / run_id, base / f"{run_id}-{os.getpid()}"]
    for path in candidates:
        try:
            path.mkdir(parents=True, exist_ok=True)
            lock = (path / ".agent.lock").open("a+", encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(
                f"--log-dir {base} cannot be written: {exc.strerror}"
            ) from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        return path, lock
    raise ConfigurationError(f"--log-dir {base}: cannot claim a directory for run '{run_id}'")


class LocalElasticAgent(SimpleElasticAgent):
    """Runs this node's workers as subprocesses of the agent.

    Args:
        spec: what to run.
        config: the launch configuration (output, logs, watchdog, health, signals).
        log_dir: the base log directory (default: a fresh temporary directory).
        on_event: receives every event.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        config: LaunchConfig,
        *,
        log_dir: Path | None = None,
        on_event: EventSink | None = None,
    ) -> None:
        super().__init__(
            spec,
            exit_barrier_timeout_s=config.exit_barrier_timeout_s,
            shutdown_timeout_s=config.shutdown_timeout_s,
            signals=config.signals_to_handle,
            on_event=on_event,
        )
        self._config = config
        base = log_dir or config.log_dir or Path(tempfile.mkdtemp(prefix="elastic-run-"))
        self._run_dir, self._lock_file = open_run_log_dir(base, spec.rdzv_handler.get_run_id())
        self._event_log = EventLog(self._run_dir / "events.jsonl")
        self.add_event_sink(self._event_log)
        self._procs: WorkerProcesses | None = None
        self._launched: dict[int, WorkerLaunch] = {}
        self._stopped_by_agent = False
        self._guardian = Guardian(config.python_exec)
        self._watchdog: FileTimerServer | None = None
        self._timer_file: str | None = None
        self._expiries: dict[int, TimerExpiry] = {}
        self._health: HealthCheckServer | None = None
        self._liveness: Liveness | None = None
        self._host = socket.gethostname()

    @property
    def run_log_dir(self) -> Path:
        """``<log dir>/<run id>``: where this agent writes its logs and events."""
        return self._run_dir

    @property
    def health_port(self) -> int | None:
        """The health-check server's port once started, or None."""
        return self._health.port if self._health is not None else None

    # -- services ----------------------------------------------------------------------

    def _setup(self) -> None:
        config = self._config
        self._guardian.start()
        if config.watchdog:
            path = config.timer_file or str(self._run_dir / "watchdog.fifo")
            self._watchdog = FileTimerServer(
                path,
                is_known_pid=self._is_worker_pid,
                on_expired=self._on_timer_expired,
            )
            self._watchdog.start()
            self._timer_file = self._watchdog.file_path
        if config.health_check_port is not None:
            liveness = Liveness(config.health_check_timeout_s)
            liveness.watch("agent_loop", self.loop_alive_since)
            if self._watchdog is not None:
                watchdog = self._watchdog
                liveness.watch("watchdog", lambda: watchdog.last_progress)
            self._liveness = liveness
            self._health = HealthCheckServer(
                config.health_check_addr,
                config.health_check_port,
                status_fn=self._status_json,
                liveness_fn=liveness.check,
                metrics_fn=self._metrics,
            )
            try:
                self._health.start()
            except OSError as exc:
                raise AgentError(
                    f"cannot serve the health check on {config.health_check_addr}:"
                    f"{config.health_check_port}: {exc.strerror or exc}"
                ) from None
            self._emit(
                "health.started",
                f"health check on http://{config.health_check_addr}:{self._health.port}/healthz",
                addr=config.health_check_addr,
                port=self._health.port,
            )

    def _teardown(self) -> None:
        if self._health is not None:
            self._health.stop()
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        self._guardian.close()
        self._event_log.close()
        self._lock_file.close()

    def _emit(self, kind: str, message: str, **fields: Any) -> None:
        if kind == "agent.exited":
            # The log is closed by then; the sinks other than the log still get it.
            event = AgentEvent(kind, message, fields)
            for sink in self._sinks:
                if sink is not self._event_log:
                    try:
                        sink(event)
                    except Exception:
                        log.exception("an event sink failed")
            return
        super()._emit(kind, message, **fields)

    def _status_json(self) -> dict[str, object]:
        snap = self.snapshot()
        body = dataclasses.asdict(snap)
        body["log_dir"] = str(self._run_dir)
        if self._watchdog is not None:
            body["watchdog"] = {
                "file": self._watchdog.file_path,
                "armed": [dataclasses.asdict(t) for t in self._watchdog.armed_timers()],
            }
        return body

    def _metrics(self) -> dict[str, float]:
        snap = self.snapshot()
        # names without the elastic_run_ prefix: render_metrics adds it
        return {
            "restarts": float(snap.restarts),
            "max_restarts": float(snap.max_restarts),
            "round": float(snap.round),
            "group_rank": float(snap.group_rank),
            "group_world_size": float(snap.group_world_size),
            "world_size": float(snap.world_size),
            "workers_running": float(sum(1 for w in snap.workers if w.state == "HEALTHY")),
            "watchdog_expiries": float(len(self._expiries)),
        }

    def _is_worker_pid(self, pid: int) -> bool:
        procs = self._procs
        return procs is not None and pid in procs.pids.values()

    def _on_timer_expired(self, expiry: TimerExpiry) -> None:
        self._expiries[expiry.pid] = expiry
        name = signal.Signals(expiry.signal).name if expiry.signal > 0 else str(expiry.signal)
        self._emit(
            "watchdog.expired",
            f"watchdog: timer '{expiry.scope_id}' of pid {expiry.pid} expired; sent {name}",
            pid=expiry.pid,
            scope_id=expiry.scope_id,
            signal=name,
        )
        self._wake.set()

    # -- workers -------------------------------------------------------------------------

    def _attempt_dir(self, local_rank: int) -> Path:
        return self._run_dir / f"attempt_{self.attempt}" / str(local_rank)

    def _start_workers(self, group: WorkerGroup) -> None:
        config, spec = self._config, self._spec
        handler = spec.rdzv_handler
        launches = []
        for worker in group.workers:
            lr = worker.local_rank
            rank_dir = self._attempt_dir(lr)
            try:
                rank_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise AgentError(
                    f"cannot create the log directory {rank_dir}: {exc.strerror}"
                ) from None
            error_file = rank_dir / "error.json"
            error_file.unlink(missing_ok=True)
            env = build_worker_env(
                os.environ,
                group=group,
                local_rank=lr,
                restart_count=self.restarts,
                max_restarts=spec.max_restarts,
                run_id=handler.get_run_id(),
                use_agent_store=True,
                error_file=error_file,
                timer_file=self._timer_file,
                extra=dict(config.extra_env),
            )
            shown = config.local_ranks_filter is None or lr in config.local_ranks_filter
            launches.append(
                WorkerLaunch(
                    local_rank=lr,
                    global_rank=worker.global_rank,
                    argv=tuple(worker_argv(config, lr)),
                    env=env,
                    log_dir=rank_dir,
                    redirect=config.redirects.for_rank(lr),
                    tee=config.tee.for_rank(lr),
                    show_on_console=shown,
                    error_file=error_file,
                )
            )
        self._expiries.clear()
        self._stopped_by_agent = False
        procs = WorkerProcesses(launches, on_exit=self._wake.set, guardian=self._guardian)
        self._procs = procs
        self._launched = {launch.local_rank: launch for launch in launches}
        procs.start()
        pids = procs.pids
        for worker in group.workers:
            worker.id = pids.get(worker.local_rank)

    def _stop_workers(self, group: WorkerGroup, sig: int, timeout_s: float) -> None:
        procs = self._procs
        if procs is None:
            return
        self._stopped_by_agent = True
        procs.stop(sig, timeout_s)
        if self._watchdog is not None:
            for pid in procs.pids.values():
                self._watchdog.clear_pid(pid)
        if WorkerState.is_running(group.state):
            group.state = WorkerState.STOPPED

    def _kill_workers_now(self) -> None:
        self._signal_workers(signal.SIGKILL)

    def _signal_workers(self, sig: int) -> None:
        procs = self._procs
        if procs is not None:
            procs.send_signal(sig)

    def _monitor_workers(self, group: WorkerGroup) -> RunResult:
        procs = self._procs
        if procs is None:
            return RunResult(WorkerState.INIT)
        exits = procs.poll()
        failed = {lr: e for lr, e in exits.items() if e.exitcode != 0}
        if failed:
            failures = [self._failure(group, e) for e in failed.values()]
            return RunResult(WorkerState.FAILED, failures={f.global_rank: f for f in failures})
        if len(exits) == len(group.workers):
            return RunResult(
                WorkerState.SUCCEEDED,
                return_values={
                    group.workers[lr].global_rank: e.exitcode for lr, e in exits.items()
                },
            )
        return RunResult(WorkerState.HEALTHY)

    def _failure(self, group: WorkerGroup, exit_: WorkerExit) -> FailureRecord:
        launch = self._launched[exit_.local_rank]
        error = read_error_file(launch.error_file)
        expiry = self._expiries.get(exit_.pid)
        if error is None and expiry is not None:
            error = WorkerErrorInfo(
                message=f"the watchdog timer '{expiry.scope_id}' expired and killed the worker"
            )
        timestamp = exit_.finished_at
        if error is not None and error.timestamp is not None:
            timestamp = min(timestamp, error.timestamp)
        return FailureRecord(
            local_rank=exit_.local_rank,
            global_rank=group.workers[exit_.local_rank].global_rank,
            role=group.spec.role,
            pid=exit_.pid,
            exitcode=exit_.exitcode,
            timestamp=timestamp,
            host=self._host,
            error_file=launch.error_file if launch.error_file.exists() else None,
            log_dir=launch.log_dir,
            error=error,
        )

    def _worker_state(self, local_rank: int) -> str:
        procs = self._procs
        if procs is None:
            return "INIT"
        exit_ = procs.poll().get(local_rank)
        if exit_ is None:
            if local_rank in procs.pids:
                return "STOPPED" if self._stopped_by_agent else "HEALTHY"
            return "INIT"
        if exit_.exitcode == 0:
            return "SUCCEEDED"
        return "STOPPED" if self._stopped_by_agent else "FAILED"

    def _worker_exitcode(self, local_rank: int) -> int | None:
        procs = self._procs
        if procs is None:
            return None
        exit_ = procs.poll().get(local_rank)
        return exit_.exitcode if exit_ is not None else None
