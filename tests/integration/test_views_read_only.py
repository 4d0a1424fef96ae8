"""Views read, the loop writes: the live panel, the health server and ``status`` only read.

A real agent runs real workers on a real c10d store with the watchdog on: rank 0 hangs inside a
timer, so the watchdog's thread kills it and the loop restarts the workers (the attempt that
carries most events, one of them born on another thread). Meanwhile a view thread draws the real
live panel (``LiveView.render``: the agent's snapshot and the live feed's picture, whose own
thread reads the rendezvous: the drawing thread never reads the store) and an HTTP
client reads ``/status``, ``/metrics`` and ``/healthz`` as a prober does. Every event must be
emitted on the loop's own thread; every write to the rendezvous (events, state, progress,
closing, leaving) must come from the loop or the progress publisher, never from a view's thread
or the health server's; and what a view reads is the snapshot the loop published, never one
built on the view's thread. A static check holds the view code to reading: the view modules,
``status``, and the agent's health callbacks call nothing that emits, publishes, closes or judges.
"""

from __future__ import annotations

import ast
import io
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest
from rich.console import Console

from elastic_run.agent.api import WorkerSpec
from elastic_run.agent.config import AgentOptions
from elastic_run.agent.local import LocalElasticAgent
from elastic_run.agent.workers.logs_specs import DefaultLogsSpecs
from elastic_run.cli.live_feed import LiveFeed
from elastic_run.cli.views.live_panel import LiveView
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.registry import get_rendezvous_handler
from tests.helpers import REPO_ROOT, free_port

pytestmark = pytest.mark.timeout(240)

# Attempt 0: rank 0 hangs inside a 0.3 s watchdog timer (killed by the watchdog's thread), rank 1
# waits to be stopped; attempt 1 succeeds: events of an expiry, a failure, a restart, a success.
WORKER = """
import os, sys, time
if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
    sys.exit(0)
if os.environ["LOCAL_RANK"] == "0":
    from elastic_run.worker import expires
    with expires(after=0.3, scope="hang"):
        while True:
            time.sleep(0.05)
while True:
    time.sleep(0.05)
"""
# The rendezvous's writing calls (the agent-facing seam); who may make them.
RDZV_WRITES = (
    "publish_event",
    "publish_state",
    "set_closed",
    "leave_round",
    "report_failure",
    "shutdown",
)
# Besides the loop's own: the services that publish their own events (never a view's thread).
WRITER_THREADS = ("progress-publisher", "file-timer-watchdog")

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
    "emit_event",
    "_fold_goodput",
    "_set_state",
    "leave_round",
    "report_failure",
    "compare_set",
    "kill",
    "terminate",
    "send_signal",
    "mark",
    "nudge",
    "wake",
}
VIEW_MODULES = sorted(
    [
        *(REPO_ROOT / "elastic_run/cli/views").glob("*.py"),
        *(REPO_ROOT / "elastic_run/agent/health").glob("*.py"),
        REPO_ROOT / "elastic_run/cli/status.py",
    ]
)
# The agent's callbacks that the health server's threads run (``/metrics`` renders
# agent/health/metrics.py's registry, a view module checked below).
HEALTH_CALLBACKS = ("_status_json",)


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
        rdzv_handler=(handler := get_rendezvous_handler(params)),
        entrypoint=script_runner(),
        args=(str(script),),
        max_restarts=1,
        monitor_interval=0.05,
    )
    port = free_port()
    agent = LocalElasticAgent(
        spec,
        DefaultLogsSpecs(log_dir=str(tmp_path / "logs")),
        options=AgentOptions(health_check_port=port, warm_start=False, watchdog=True),
    )
    emitted_on: list[tuple[str, str]] = []
    agent.add_event_sink(lambda e: emitted_on.append((e.kind, threading.current_thread().name)))
    read_on: list[str] = []
    read_picture = handler.snapshot

    def recorded_read() -> object:
        read_on.append(threading.current_thread().name)
        return read_picture()

    feed = LiveFeed(agent.snapshot, recorded_read, interval_s=0.05)  # type: ignore[arg-type]
    panel = LiveView(
        agent,
        params.run_id,
        console=Console(file=io.StringIO(), width=120, height=40),
        feed=feed.picture,
    )
    agent.add_event_sink(panel)
    written_on: list[tuple[str, str]] = []
    for name in RDZV_WRITES:
        call = getattr(handler, name)

        def recorded(
            *args: object, __call: object = call, __name: str = name, **kw: object
        ) -> object:
            written_on.append((__name, threading.current_thread().name))
            return __call(*args, **kw)  # type: ignore[operator]

        setattr(handler, name, recorded)

    done = threading.Event()
    seen: list[object] = []
    view_errors: list[BaseException] = []

    def read_like_views() -> None:
        while not done.is_set():
            try:
                first = agent.snapshot()
                seen.append(first)
                panel.render()  # as rich's refresh thread draws it
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
    feed.start()
    try:
        result = agent.run()
    finally:
        done.set()
        viewer.join(30)
        feed.stop()
    loop_thread = threading.current_thread().name

    assert not view_errors, view_errors
    assert result.exit_code == 0, result
    kinds = [kind for kind, _ in emitted_on]
    for kind in ("watchdog.expired", "worker.failed", "restart", "succeeded"):
        assert kinds.count(kind) == 1, kinds  # the posted one neither lost nor doubled
    off_loop = [(kind, name) for kind, name in emitted_on if name != loop_thread]
    assert not off_loop, f"events emitted off the loop thread: {off_loop}"
    assert any(name == "publish_state" for name, _ in written_on), written_on
    stray = [(c, t) for c, t in written_on if t != loop_thread and not t.startswith(WRITER_THREADS)]
    assert not stray, f"rendezvous writes off the loop and the publisher: {stray}"
    # The store is read for the panel by the feed's thread, never by the drawing one.
    assert read_on and set(read_on) == {"live-feed"}, read_on
    # What the views read are the loop's published pictures: many reads, few distinct objects.
    assert len(seen) > 10
    assert len({id(s) for s in seen}) < len(seen)


def script_runner() -> str:
    """The entrypoint that runs the worker script (a program, as torchrun runs one)."""
    import sys

    return sys.executable


def _writing_calls(tree: ast.AST) -> list[str]:
    """The calls under ``tree`` whose name (a method's or a bare function's) is in WRITES."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in WRITES:
            found.append(f"{ast.unparse(func)} (line {node.lineno})")
    return found


# What a view module may hold besides views: ``close`` (it writes by design) lives in status.py.
NOT_VIEWS = {"status.py": {"close_command", "_wait_until_left"}}


@pytest.mark.parametrize("path", VIEW_MODULES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_view_modules_only_read(path: Path) -> None:
    tree = ast.parse(path.read_text())
    skip = NOT_VIEWS.get(path.name, set())
    assert skip <= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    tree.body = [n for n in tree.body if getattr(n, "name", None) not in skip]
    calls = _writing_calls(tree)
    assert not calls, f"{path.name} writes: {calls}"


def test_the_agents_health_callbacks_only_read() -> None:
    tree = ast.parse((REPO_ROOT / "elastic_run/agent/local.py").read_text())
    bodies = {
        node.name: node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name in HEALTH_CALLBACKS
    }
    assert sorted(bodies) == sorted(HEALTH_CALLBACKS)
    calls = {name: _writing_calls(body) for name, body in bodies.items()}
    assert not any(calls.values()), calls


def test_the_static_check_finds_a_write() -> None:
    """The check above fails on what it must find: a bare call and a method call."""
    tree = ast.parse("def f(agent):\n    agent.emit_event('x', 'y')\n    close_job(store)\n")
    assert [c.split(" ")[0] for c in _writing_calls(tree)] == ["agent.emit_event", "close_job"]
