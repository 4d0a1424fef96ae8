"""Run one node of a job from a parsed LaunchConfig: the rendezvous, the agent, the view.

The one place where the CLI's frozen ``LaunchConfig`` becomes the library's objects, built
through the same public entry points a user's Python code would use: the rendezvous registry,
torch's ``WorkerSpec`` (``entrypoint`` the interpreter, ``args`` ``-u script ...``, as torchrun
builds it), ``DefaultLogsSpecs`` and ``LocalElasticAgent``. ``WorkerSpec``, the agent's keyword
arguments, ``AgentOptions`` and ``ProgressOptions`` take their values by the settings table's
rows (:meth:`LaunchConfig.arguments`): no field is copied by hand here.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Iterable

from elastic_run.agent.config import LaunchConfig, Std, StdSpec
from elastic_run.agent.settings.setting import Target
from elastic_run.agent.settings.table import EVENT_LOG_HANDLER
from elastic_run.agent.workers.failures import FailureRecord
from elastic_run.agent.workers.logs_specs import LogsSpecs
from elastic_run.cli.launch_clock import launcher_start_monotonic_s
from elastic_run.errors import ElasticRunError
from elastic_run.rendezvous.api import BackendLink

__all__ = ["run_job"]


def _std(spec: StdSpec) -> Std | dict[int, Std]:
    if not spec.per_rank:
        return spec.default
    return {rank: std for rank, std in spec.per_rank}


def _logs_specs(config: LaunchConfig) -> LogsSpecs:
    """torch's DefaultLogsSpecs layout, or the --logs-specs plugin's class (torch's kwargs)."""
    from elastic_run.agent.workers.logs_specs import DefaultLogsSpecs, TorchLogsSpecs

    ranks = set(config.local_ranks_filter) if config.local_ranks_filter is not None else None
    log_dir = str(config.log_dir) if config.log_dir is not None else None
    if config.logs_specs is None:
        return DefaultLogsSpecs(
            log_dir=log_dir,
            redirects=_std(config.redirects),
            tee=_std(config.tee),
            local_ranks_filter=ranks,
        )
    from elastic_run.cli.options.torchrun_flags import load_logs_specs_class

    cls = load_logs_specs_class(config.logs_specs)
    if issubclass(cls, LogsSpecs):
        return cls(
            log_dir=log_dir,
            redirects=_std(config.redirects),
            tee=_std(config.tee),
            local_ranks_filter=ranks,
        )
    return TorchLogsSpecs(cls, log_dir, _std(config.redirects), _std(config.tee), ranks)


def _argv(config: LaunchConfig) -> tuple[str, tuple[str, ...]]:
    """The worker command as torchrun builds it: (entrypoint, args)."""
    if config.no_python:
        return config.entrypoint, config.args
    from elastic_run.agent.workers.env import python_command

    python = config.python_exec or python_command()
    if config.module:
        return python, ("-u", "-m", config.entrypoint, *config.args)
    return python, ("-u", config.entrypoint, *config.args)


def _report_failures(run_id: str, failures: Iterable[FailureRecord]) -> None:
    from rich.console import Console

    from elastic_run.cli.views.lines import render_failure_summary

    render_failure_summary(run_id, list(failures), Console(stderr=True))


def run_job(config: LaunchConfig) -> int:
    """Run this node's part of the job; return the process exit code."""
    from elastic_run.agent.api import WorkerSpec
    from elastic_run.agent.local import LocalElasticAgent
    from elastic_run.cli.launcher_error import write_launcher_error_file
    from elastic_run.cli.live_feed import LiveFeed
    from elastic_run.cli.options.torchrun_flags import check_event_log_handler, torch_event_sink
    from elastic_run.cli.views.lines import LiveView, make_view, wants_live
    from elastic_run.rendezvous.api import AgentRendezvous, RendezvousParameters
    from elastic_run.rendezvous.registry import rendezvous_handler_registry
    from elastic_run.rendezvous.settings import RendezvousConf

    logging.basicConfig(
        level=logging.WARNING, format="elastic-run: %(levelname)s: %(message)s", stream=sys.stderr
    )
    params = RendezvousParameters.from_conf(
        config.rdzv_backend,
        config.rdzv_endpoint,
        config.run_id,
        config.min_nodes,
        config.max_nodes,
        config.local_addr,
        config.rdzv_conf or RendezvousConf.parse(config.rdzv_configs, config.rdzv_backend),
    )
    handler = rendezvous_handler_registry.create_handler(params)
    entrypoint, args = _argv(config)
    try:
        _check_reachable(handler)
        # Each object takes its values from the config by the settings table's rows.
        spec = WorkerSpec(
            rdzv_handler=handler,
            entrypoint=entrypoint,
            args=args,
            **config.arguments(Target.WORKER_SPEC),
        )
        logs_specs = _logs_specs(config)
        if config.event_log_handler != EVENT_LOG_HANDLER.default:
            check_event_log_handler(config.event_log_handler)
        agent = LocalElasticAgent(
            spec,
            logs_specs,
            options=config.agent_options(),
            **config.arguments(Target.AGENT),
        )
    except (ElasticRunError, ValueError):
        _close_backend(handler)
        raise
    feed = (
        LiveFeed(agent.snapshot, handler.snapshot if isinstance(handler, AgentRendezvous) else None)
        if wants_live(config)
        else None
    )
    view = make_view(
        config=config,
        run_id=config.run_id,
        agent=agent,
        feed=feed.picture if feed is not None else None,
    )
    agent.add_event_sink(view)
    agent.count_goodput_from(launcher_start_monotonic_s())
    torch_sink = torch_event_sink(config.event_log_handler)
    if torch_sink is not None:
        agent.add_event_sink(torch_sink)
    if feed is not None:
        feed.start()
    if isinstance(view, LiveView):
        view.start()
    # What the agent gives back when it returns: a late signal must not kill the process
    # before it exits with the run's code.
    for sig in config.signals_to_handle:
        signal.signal(sig, signal.SIG_IGN)
    try:
        result = agent.run(config.role)
    finally:
        if isinstance(view, LiveView):
            view.stop()
        if feed is not None:
            feed.stop()
        _close_backend(handler)
    from elastic_run.agent.loop.goodput import summary_line

    sys.stderr.write(f"elastic-run: {summary_line(agent.goodput())}\n")
    for line in agent.snapshot().excluded_nodes:
        sys.stderr.write(f"elastic-run: node excluded during the job: {line}\n")
    if result.failures:
        _report_failures(config.run_id, result.failures.values())
        if config.launcher_error_file:
            write_launcher_error_file(config.launcher_error_file, result.failures.values())
        sys.stderr.write(f"elastic-run: logs in {agent.run_log_dir}\n")
    elif result.exit_code != 0 and result.reason:
        sys.stderr.write(f"Error: {result.reason}\n")
    elif result.reason:  # an ending worth one line (a spare that was not needed)
        sys.stderr.write(f"elastic-run: {result.reason}\n")
    return result.exit_code


# How long a backend that connects lazily (etcd) may take to answer its first read before the
# agent starts: a store that is down is one line and exit 4 at once, not after a join attempt.
_REACH_TIMEOUT_S = 5.0


def _check_reachable(handler: object) -> None:
    if isinstance(handler, BackendLink):
        handler.check_reachable(_REACH_TIMEOUT_S)


def _close_backend(handler: object) -> None:
    if isinstance(handler, BackendLink):
        handler.release()
