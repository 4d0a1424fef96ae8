"""Views read, the loop writes: the live panel, the health server and ``status`` only read.

A real agent runs real workers on a real c10d store (one fails, so the loop restarts them, the
attempt that carries most events). Meanwhile a view thread reads the agent as the live panel does
(``snapshot()``) and an HTTP client reads ``/status`` and ``/metrics`` as a prober does. Every
event must be emitted on the loop's own thread, and what a view reads is the snapshot the loop
published, never one built on the view's thread. A static check holds the view modules to
reading: they call nothing that emits, publishes, closes or judges.
"""

from __future__ import annotations

import ast
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest

from elastic_run.agent.api import WorkerSpec
from elastic_run.agent.config import AgentOptions
from elastic_run.agent.local import LocalElasticAgent
from elastic_run.agent.workers.logs_specs import DefaultLogsSpecs
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.registry import get_rendezvous_handler
from tests.helpers import REPO_ROOT, free_port

pytestmark = pytest.mark.timeout(240)

# Fails once (attempt 0), then succeeds: events of a failure, a restart and a success.
WORKER = """
import os, sys
sys.exit(3 if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" else 0)
"""

# Calls a view module must never make: they emit, publish, write the store, or judge workers.
WRITES = {
    "_emit",
    "emit",
    "publish_event",
    "publish_state",
    "publish_progress",
    "set_closed",
    "close_job",
    "amend_exits",
    "stop_hung",
    "tick",
    "_publish_snapshot",
}
VIEW_MODULES = sorted(
    [
        *(REPO_ROOT / "elastic_run/cli/views").glob("*.py"),
        *(REPO_ROOT / "elastic_run/agent/health").glob("*.py"),
    ]
)


def test_every_event_is_emitted_on_the_loop_thread_while_views_read(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    params = RendezvousParameters(
        backend="c10d",
        endpoint="127.0.0.1:0",
        run_id=f"views-{uuid.uuid4().hex[:8]}",
        min_nodes=1,
        max_nodes=1,
    )
    spec = WorkerSpec(
        role="trainer",
        local_world_size=2,
        rdzv_handler=get_rendezvous_handler(params),
        entrypoint=script_runner(),
        args=(str(script),),
        max_restarts=1,
        monitor_interval=0.05,
    )
    port = free_port()
    agent = LocalElasticAgent(
        spec,
        DefaultLogsSpecs(log_dir=str(tmp_path / "logs")),
        options=AgentOptions(health_check_port=port, warm_start=False),
    )
    emitted_on: list[tuple[str, str]] = []
    agent.add_event_sink(lambda e: emitted_on.append((e.kind, threading.current_thread().name)))

    done = threading.Event()
    seen: list[object] = []
    view_errors: list[BaseException] = []

    def read_like_views() -> None:
        while not done.is_set():
            try:
                first = agent.snapshot()
                seen.append(first)
                for path in ("/status", "/metrics", "/healthz"):
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5):
                            pass
                    except OSError:
                        pass  # before the server is up, or a 503 from /healthz
            except BaseException as exc:  # noqa: BLE001 - reported below
                view_errors.append(exc)
                return
            done.wait(0.005)

    viewer = threading.Thread(target=read_like_views, name="view")
    viewer.start()
    try:
        result = agent.run()
    finally:
        done.set()
        viewer.join(30)
    loop_thread = threading.current_thread().name

    assert not view_errors, view_errors
    assert result.exit_code == 0, result
    kinds = [kind for kind, _ in emitted_on]
    assert "worker.failed" in kinds and "restart" in kinds and "succeeded" in kinds, kinds
    off_loop = [(kind, name) for kind, name in emitted_on if name != loop_thread]
    assert not off_loop, f"events emitted off the loop thread: {off_loop}"
    # What the views read are the loop's published pictures: many reads, few distinct objects.
    assert len(seen) > 10
    assert len({id(s) for s in seen}) < len(seen)


def script_runner() -> str:
    """The entrypoint that runs the worker script (a program, as torchrun runs one)."""
    import sys

    return sys.executable


@pytest.mark.parametrize("path", VIEW_MODULES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_view_modules_only_read(path: Path) -> None:
    tree = ast.parse(path.read_text())
    calls = [
        f"{ast.unparse(node.func)} (line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in WRITES
    ]
    assert not calls, f"{path.name} writes: {calls}"
