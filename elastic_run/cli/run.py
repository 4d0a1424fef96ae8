"""Run one node of a job from a parsed LaunchConfig: the rendezvous, the agent, the view."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elastic_run.agent.config import LaunchConfig
from elastic_run.errors import ElasticRunError

__all__ = ["run_job"]


def _report_failures(run_id: str, failures: Any) -> None:
    from rich.console import Console

    from elastic_run.cli.views import render_failure_summary

    render_failure_summary(run_id, list(failures), Console(stderr=True))


def run_job(config: LaunchConfig) -> int:
    """Run this node's part of the job; return the process exit code."""
    from elastic_run.agent.api import WorkerSpec
    from elastic_run.agent.local import LocalElasticAgent
    from elastic_run.rendezvous.api import RendezvousParameters
    from elastic_run.rendezvous.registry import create_rendezvous_handler

    logging.basicConfig(
        level=logging.WARNING, format="elastic-run: %(levelname)s: %(message)s", stream=sys.stderr
    )
    params = RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **dict(config.rdzv_configs),
    )
    handler = create_rendezvous_handler(params)
    spec = WorkerSpec(
        role=config.role,
        local_world_size=config.nproc_per_node,
        rdzv_handler=handler,
        entrypoint=config.entrypoint,
        args=config.args,
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval_s,
        local_addr=config.local_addr,
        master_addr=config.master_addr,
        master_port=config.master_port,
    )
    try:
        agent = LocalElasticAgent(spec, config)
    except ElasticRunError:
        _close_backend(handler)
        raise
    hold_file = os.environ.get("ELASTIC_RUN_TEST_HOLD_FILE")
    if hold_file:
        agent.set_loop_hold(_hold_while_exists(Path(hold_file)))
    from elastic_run.cli.views import LiveView, make_view

    view = make_view(config=config, run_id=config.run_id, agent=agent)
    agent.add_event_sink(view)
    if isinstance(view, LiveView):
        view.start()
    try:
        result = agent.run(config.role)
    finally:
        if isinstance(view, LiveView):
            view.stop()
        _close_backend(handler)
    if result.failures:
        _report_failures(config.run_id, result.failures.values())
        sys.stderr.write(f"elastic-run: logs in {agent.run_log_dir}\n")
    elif result.exit_code != 0 and result.reason:
        sys.stderr.write(f"Error: {result.reason}\n")
    return result.exit_code


def _hold_while_exists(path: Path) -> Callable[[], None]:
    """Test seam (ELASTIC_RUN_TEST_HOLD_FILE): the agent loop stalls while ``path`` exists."""

    def hold() -> None:
        while path.exists():
            time.sleep(0.05)

    return hold


def _close_backend(handler: Any) -> None:
    backend = getattr(handler, "backend", None)
    close = getattr(backend, "close", None)
    if callable(close):
        close()
