"""LocalElasticAgent: the run loop with subprocess workers on this node.

Constructed as torch's (``LocalElasticAgent(spec, logs_specs, start_method, exit_barrier_timeout,
log_line_prefix_template, ...)``), plus our options (``AgentOptions``: the watchdog, the health
server, the signals, extra worker variables). It owns, for the life of the run: the guardian (no
worker outlives the agent), the file-timer watchdog (when enabled), the health-check server
(when a port is given), the JSON-lines event log ``<run log dir>/events.jsonl``, and the
progress duties (``progress/duties.py``) and the zygote of warm starts (``warm/zygote.py``). Per
attempt it builds each worker's command and torchrun environment (``workers/env.py``), asks the
logs specs where the output goes, and hands the launches to ``WorkerProcesses``. A callable
entrypoint runs in a process per worker (``function_workers.py``), its return values in
``RunResult.return_values``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elastic_run.agent.api import RunResult, WorkerGroup, WorkerSpec, WorkerState
from elastic_run.agent.config import AgentOptions
from elastic_run.agent.events import EventLog
from elastic_run.agent.health.server import AgentHealthServer, Liveness
from elastic_run.agent.link_check import (
    LinkCheckError,
    LinkHelper,
    link_verdict,
    parse_link_check_mode,
    run_link_check,
    slow_event_fields,
    slow_message,
)
from elastic_run.agent.loop.parts import LinkFindings, MonitoredWorkers, NodeFitness, WorkerPart
from elastic_run.agent.loop.simple import SimpleElasticAgent
from elastic_run.agent.node_check import (
    NodeCheckOptions,
    failure_line,
    run_node_check,
    startup_line,
)
from elastic_run.agent.progress.duties import ProgressDuties
from elastic_run.agent.settings import table as settings
from elastic_run.agent.warm.policy import WarmStarts
from elastic_run.agent.watchdog.server import FileTimerServer, TimerExpiry
from elastic_run.agent.workers.console import duplicate_filters, tee_prefix
from elastic_run.agent.workers.env import (
    build_worker_env,
    cold_python_env,
    python_command,
    shared_worker_env,
    worker_argv,
)
from elastic_run.agent.workers.function_workers import FunctionWorkers
from elastic_run.agent.workers.gloo_check import GlooLoopbackCheck
from elastic_run.agent.workers.group import LocalWorkerGroup, run_result
from elastic_run.agent.workers.guardian import Guardian
from elastic_run.agent.workers.logs_specs import ATTEMPT_ENV, DefaultLogsSpecs, LogsSpecs
from elastic_run.agent.workers.numa import numa_wrapped
from elastic_run.agent.workers.processes import WorkerLaunch
from elastic_run.errors import AgentError, ConfigurationError

__all__ = ["LocalElasticAgent"]

log = logging.getLogger(__name__)


class LocalElasticAgent(SimpleElasticAgent):
    """Runs this node's workers as subprocesses of the agent (torch's LocalElasticAgent).

    Args:
        spec: what to run.
        logs_specs: where the workers' logs go (default: ``DefaultLogsSpecs()``).
        start_method: how a callable entrypoint's workers start: ``spawn``, ``fork``, or
            ``forkserver`` (started as spawn); a program is always run as a subprocess.
        exit_barrier_timeout: how long a finished node waits for the others (s).
        log_line_prefix_template: the prefix of teed console lines (torch's
            ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``; None: ``[<role><local rank>]:``).
        shutdown_timeout: the grace period between the stop signal and SIGKILL (s).
        health_check_server: accepted for torch's signature (see ``options``).
        uninterruptible_state_timeout: accepted for torch's signature.
        options: elastic-run's additions (watchdog, health server, signals, extra env).

    Raises:
        ConfigurationError: the log directory cannot be created, or an unknown start method
            for a callable entrypoint.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        logs_specs: LogsSpecs | None = None,
        start_method: str = settings.START_METHOD.default,
        exit_barrier_timeout: float = settings.EXIT_BARRIER_TIMEOUT.default,
        log_line_prefix_template: str | None = settings.LOG_LINE_PREFIX_TEMPLATE.default,
        shutdown_timeout: float = settings.SHUTDOWN_TIMEOUT.default,
        health_check_server: Any = None,
        uninterruptible_state_timeout: float | None = None,
        *,
        options: AgentOptions | None = None,
    ) -> None:
        opts = options or AgentOptions()
        entry = spec.entrypoint
        self._guardian = Guardian(None)
        self._functions = (  # first: an unknown start method fails before anything is open
            None
            if isinstance(entry, str) or entry is None
            else FunctionWorkers(entry, spec.args, start_method, guardian=lambda: self._guardian)
        )
        self._host = socket.gethostname()
        self._watchdog: FileTimerServer | None = None
        self._progress_duties = ProgressDuties(opts.progress, self._host, armed=self._armed_pids)
        functions = self._functions
        self._group = LocalWorkerGroup(
            role=spec.role,
            host=self._host,
            guardian=self._guardian,
            on_exit=self.wake,
            notes=self._progress_duties,
            return_value=functions.return_value if functions is not None else None,
        )
        # A subclass that overrides torch's ``_monitor_workers`` has it asked each turn.
        overridden = type(self)._monitor_workers is not LocalElasticAgent._monitor_workers
        workers: WorkerPart = (
            MonitoredWorkers(self._monitor_workers, spec.role) if overridden else self._group
        )
        super().__init__(
            spec,
            exit_barrier_timeout,
            shutdown_timeout,
            signals=opts.signals,
            workers=workers,
            progress=self._progress_duties,
            max_node_failures=opts.max_node_failures,
            node_check=_NodeCheck(opts, lambda: self._run_dir, self._host, self._base_env)
            if opts.node_check
            else None,
            link_check=_LinkCheck(opts, self._base_env)
            if opts.link_check != "off" and spec.rdzv_handler.get_backend() != "static"
            else None,
        )
        self._options = opts
        self._logs_specs = logs_specs if logs_specs is not None else DefaultLogsSpecs()
        self._start_method = start_method
        self._log_line_prefix_template = log_line_prefix_template
        run_id = spec.rdzv_handler.get_run_id()
        try:
            if isinstance(self._logs_specs, DefaultLogsSpecs):
                self._run_dir = self._logs_specs.run_log_dir(run_id)
            else:
                self._run_dir = Path(self._logs_specs.root_log_dir)
                self._run_dir.mkdir(parents=True, exist_ok=True)
            self._event_log = EventLog(self._run_dir / "events.jsonl")
        except OSError as exc:
            raise ConfigurationError(
                f"the log directory cannot be written: {exc.strerror or exc}"
            ) from None
        self.add_event_sink(self._event_log)
        self._timer_file: str | None = None
        self._pending_where: dict[int, str] = {}  # the watchdog's thread: pid -> where it was
        self._health: AgentHealthServer | None = None
        warm = opts.warm_start and self._functions is None
        emit = lambda kind, message, fields: self.emit_event(kind, message, **fields)  # noqa: E731
        self._warm = WarmStarts(enabled=warm, preload=opts.preload, emit=emit)
        self._gloo = GlooLoopbackCheck()

    @property
    def run_log_dir(self) -> Path:
        """Where this agent writes its logs and events (``<log dir>/<run id>_<random>``)."""
        return self._run_dir

    @property
    def health_port(self) -> int | None:
        """The health-check server's port once started, or None."""
        return self._health.port if self._health is not None else None

    # -- services ----------------------------------------------------------------------

    def _setup(self) -> None:
        opts = self._options
        spec = self.get_worker_group().spec
        self._guardian.start()
        if isinstance(spec.entrypoint, str):
            env = shared_worker_env(
                self._base_env(),
                local_world_size=spec.local_world_size,
                extra=dict(opts.extra_env),
            )
            argv = worker_argv(spec, 0)
            self._warm.begin(argv, env.get("PYTHON_EXEC") or python_command(), os.getcwd(), env)
        if opts.watchdog:
            path = opts.timer_file or str(self._run_dir / "watchdog.fifo")
            self._watchdog = FileTimerServer(
                path,
                spec.rdzv_handler.get_run_id(),
                max_interval=0.1,
                is_known_pid=self._is_worker_pid,
                on_expired=self._on_timer_expired,
                on_request=self._progress_duties.watch.timer_beat,
                before_kill=self._before_timer_kill,
            )
            self._watchdog.start()
            self._timer_file = self._watchdog.file_path
        if opts.health_check_port is not None:
            self._start_health(opts)
        self._progress_duties.start_publisher(
            spec.rdzv_handler,
            spec.rdzv_handler.get_run_id(),
            position=self._position,
            attempt=lambda: self.attempt,
            running=lambda: self.get_worker_group().state is WorkerState.HEALTHY,
            members=self._member_ids,
            goodput=lambda: self.goodput().to_json(with_restarts=False),
        )

    def _position(self) -> tuple[int, int]:
        group = self.get_worker_group()
        if group.group_rank is None:
            return -1, -1
        return group.round, group.group_rank

    def _member_ids(self, round_: int) -> list[str]:
        rdzv = self.rendezvous
        snap = rdzv.snapshot() if rdzv is not None else None
        if snap is None or snap.round != round_:
            return []
        return [m.node_id for m in snap.members]

    def _start_health(self, opts: AgentOptions) -> None:
        liveness = Liveness(opts.health_check_timeout_s)
        liveness.watch("agent_loop", self.loop_alive_since)
        if self._watchdog is not None:
            watchdog = self._watchdog
            liveness.watch("watchdog", lambda: watchdog.last_progress)
        assert opts.health_check_port is not None
        from elastic_run.agent.health.metrics import AgentMetrics  # prometheus-client: lazily

        metrics = AgentMetrics(self.snapshot)  # fed events on the loop's thread
        self.add_event_sink(metrics)
        self._health = AgentHealthServer(
            opts.health_check_addr,
            opts.health_check_port,
            status_fn=self._status_json,
            liveness_fn=liveness.check,
            metrics_text_fn=metrics.render,
        )
        self._health.start()
        self.emit_event(
            "health.started",
            f"health check on http://{opts.health_check_addr}:{self._health.port}/healthz",
            addr=opts.health_check_addr,
            port=self._health.port,
        )

    def _teardown(self) -> None:
        self._progress_duties.close()
        if self._health is not None:
            self._health.stop()
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        self._warm.close()
        self._guardian.close()
        if self._functions is not None:
            self._functions.close()
        self.flush_events()  # what the stopped threads posted last, before the log closes
        self._event_log.close()

    def _status_json(self) -> dict[str, object]:
        body = dataclasses.asdict(self.snapshot())
        body["log_dir"] = str(self._run_dir)
        watchdog = self._watchdog  # once: the teardown sets it to None
        if watchdog is not None:
            body["watchdog"] = {
                "file": watchdog.file_path,
                "armed": [dataclasses.asdict(t) for t in watchdog.armed_timers()],
            }
        return body

    def _armed_pids(self) -> frozenset[int]:
        watchdog = self._watchdog  # once: the teardown sets it to None
        if watchdog is None:
            return frozenset()
        return frozenset(t.pid for t in watchdog.armed_timers())

    def _is_worker_pid(self, pid: int) -> bool:
        return self._group.is_worker_pid(pid)

    def _before_timer_kill(self, pid: int) -> None:
        # On the watchdog's thread: the stacks are taken and the place noted before the kill,
        # so the failure the loop builds from the exit says where the worker was.
        where = self._progress_duties.before_timer_kill(pid)
        self._pending_where[pid] = where

    def _on_timer_expired(self, expiry: TimerExpiry) -> None:
        self._group.note_expiry(
            expiry.pid, expiry.scope_id, self._pending_where.pop(expiry.pid, "")
        )
        name = signal.Signals(expiry.signal).name if expiry.signal > 0 else str(expiry.signal)
        self.emit_event(
            "watchdog.expired",
            f"watchdog: timer '{expiry.scope_id}' of pid {expiry.pid} expired; sent {name}",
            pid=expiry.pid,
            scope_id=expiry.scope_id,
            signal=name,
        )
        self.wake()

    # -- workers -------------------------------------------------------------------------

    def _base_env(self) -> dict[str, str]:
        base = self._options.base_env  # + ELASTIC_RUN_GUARDIAN: found by it if the agent dies
        return self._guardian.worker_env(dict(base) if base is not None else os.environ)

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        spec, group = worker_group.spec, worker_group
        handler = spec.rdzv_handler
        self._warm.before_attempt()
        envs = {
            w.local_rank: build_worker_env(
                self._base_env(),
                group=group,
                local_rank=w.local_rank,
                restart_count=self.restarts,
                max_restarts=spec.max_restarts,
                run_id=handler.get_run_id(),
                use_agent_store=handler.use_agent_store,
                timer_file=self._timer_file,
                extra=dict(self._options.extra_env),
                virtual_local_rank=self._options.virtual_local_rank,
            )
            for w in group.workers
        }
        self._gloo.check(group.group_world_size or 1, self.advertised_addr(), envs)
        try:
            dest = self._logs_specs.reify(
                {lr: {**env, ATTEMPT_ENV: str(self.attempt)} for lr, env in envs.items()}
            )
        except OSError as exc:
            raise AgentError(f"cannot create the log directory: {exc.strerror or exc}") from None
        opts = self._options
        duplicates = duplicate_filters(
            opts.duplicate_stdout_filters, opts.duplicate_stderr_filters, dest.error_files
        )
        functions = self._functions
        if functions is not None:
            functions.prepare_attempt()
        beats = self._progress_duties.env_for_attempt(
            self.attempt,
            [(w.local_rank, w.global_rank) for w in group.workers],
            {w.local_rank: Path(dest.error_files[w.local_rank]).parent for w in group.workers},
        )
        launches = []
        for worker in group.workers:
            lr = worker.local_rank
            is_python = not functions and spec.entrypoint == (
                envs[lr].get("PYTHON_EXEC") or python_command()
            )
            argv = (
                ()
                if functions
                else numa_wrapped(tuple(worker_argv(spec, lr)), lr, self._options.numa_binding)
            )
            error_file = Path(dest.error_files[lr])
            error_file.unlink(missing_ok=True)
            envs[lr]["TORCHELASTIC_ERROR_FILE"] = str(error_file)
            envs[lr].update(beats.get(lr, {}))
            start = functions.start if functions else self._warm.start_for(argv, envs[lr])
            env = envs[lr] if start is not None else cold_python_env(envs[lr], python=is_python)
            launches.append(
                WorkerLaunch(
                    local_rank=lr,
                    global_rank=worker.global_rank,
                    argv=(functions.name,) if functions else tuple(argv),
                    env=env,
                    log_dir=error_file.parent,
                    redirect=self._logs_specs.redirect_for(lr),
                    tee=self._logs_specs.tee_for(lr),
                    show_on_console=self._logs_specs.shows_on_console(lr),
                    error_file=error_file,
                    start=start,
                    tee_prefix=tee_prefix(
                        self._log_line_prefix_template,
                        role=spec.role,
                        rank=worker.global_rank,
                        local_rank=lr,
                    ),
                    duplicates=duplicates,
                )
            )
        pids = self._group.start(launches)
        for worker in group.workers:
            worker.id = pids.get(worker.local_rank)
        self._progress_duties.started(pids, self._warm)
        return dict(pids)

    def _begin_stop_workers(self, worker_group: WorkerGroup) -> float | None:
        return self._group.begin_stop((int(signal.SIGTERM), int(signal.SIGKILL)))

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        self._shutdown(signal.SIGTERM, int(self.shutdown_timeout))

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        pids = self._group.pids
        signals_before = self.stop_signal_count()
        # A signal that arrives while stopping (a second one, after the one that stops us):
        # no more grace.
        self._group.stop(
            (int(death_sig), int(signal.SIGKILL)),
            float(timeout),
            escalate=lambda: self.stop_signal_count() > signals_before,
        )
        if self._watchdog is not None:
            for pid in pids.values():
                self._watchdog.clear_pid(pid)

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        return run_result(self._group.observe(worker_group))


class _NodeCheck:
    """The node check of ``agent/node_check/`` as the loop's part: this node's devices as the
    flags ask for them, the run's log directory, ``--node-check-cmd``, in the check's budget."""

    def __init__(
        self,
        opts: AgentOptions,
        log_dir: Callable[[], Path],
        host: str,
        env: Callable[[], dict[str, str]],
    ) -> None:
        self._options = NodeCheckOptions(
            enabled=True, timeout_s=opts.node_check_timeout_s, command=opts.node_check_cmd
        )
        self._devices = opts.node_devices
        self._log_dir = log_dir
        self._host = host
        self._env = env

    def check(self) -> NodeFitness:
        """Check this node now."""
        result = run_node_check(self._options, self._devices, self._log_dir(), env=self._env())
        if result.healthy:
            return NodeFitness(
                True, startup_line(result), "", result.duration_s, result.as_record()
            )
        return NodeFitness(
            False,
            failure_line(self._host, result),
            result.reason or "unhealthy",
            result.duration_s,
            result.as_record(),
        )


class _LinkCheck:
    """The link check of ``agent/link_check/`` as the loop's part: a helper started when the
    node begins to join (torch imported before the round forms), the round's links timed over
    the workers' backend (NCCL when GPUs are asked for, else gloo), the verdict of
    ``--link-check``. A check that fails is a warning: it never stops the job."""

    def __init__(self, opts: AgentOptions, env: Callable[[], dict[str, str]]) -> None:
        self._mode = parse_link_check_mode(opts.link_check)
        self._factor = opts.progress.straggler_factor
        self._backend = "nccl" if opts.node_devices.kind == "cuda" else "gloo"
        self._env = env
        self._helper: LinkHelper | None = None

    def prepare(self) -> None:
        """Start a helper now (the loop's thread: its parent-death signal follows that thread)."""
        if self._helper is None:
            try:
                self._helper = LinkHelper.start(env=self._env())
            except (LinkCheckError, OSError) as exc:
                log.warning("the link check's helper did not start: %s", exc)

    def measure(
        self,
        rank: int,
        world_size: int,
        addr: str,
        port: int,
        prefix: str,
        spares: int,
        give_up: Callable[[], None],
    ) -> LinkFindings:
        """Time the round's links; name the slow nodes; say whether this one leaves."""
        helper, self._helper = self._helper, None
        try:
            report = run_link_check(
                rank,
                world_size,
                addr,
                port,
                prefix,
                self._backend,
                factor=self._factor,
                helper=helper,
                env=self._env(),
                give_up=give_up,
            )
        except LinkCheckError as exc:
            log.warning("the link check did not complete: %s", exc)
            return LinkFindings(completed=False)
        verdict = link_verdict(report, self._mode, self._factor, spares)
        named = tuple(slow_message(report, r) for r in verdict.named)
        mine = None
        exclude = None
        if rank in verdict.named:
            excluded = rank in verdict.excluded
            mine = (
                slow_message(report, rank),
                slow_event_fields(report, rank, self._mode, excluded),
            )
            if excluded:
                exclude = slow_message(report, rank).removeprefix("link check: ")
        return LinkFindings(named, mine, exclude, report.duration_s)
