"""Signals only record and wake the loop: a flood of SIGTERM while the workers spawn still ends
with every worker stopped and exit 143.

A signal handler that acts (raises, kills) can fire between spawning a worker and recording it,
or between two writes that belong together; then a worker escapes or state tears. The test
sends SIGTERM in a tight loop from the moment the round completed (the agent is about to spawn
8 workers) until the agent exits, while another thread records every descendant it sees.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import cli_harness
import psutil
from cli_harness import Launch, only_run_dir, read_events, script

from tests.helpers import is_alive, wait_until

launch = cli_harness.launch

RUN = 120.0


def test_a_sigterm_flood_while_workers_spawn_stops_them_all_and_exits_143(
    launch: Launch, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    agent = launch(
        ["--standalone", "--nproc-per-node", "8", "--log-dir", str(logs), script("hang.py")],
        env={"OUT_DIR": str(out)},
    )
    run_dir = only_run_dir(logs)
    wait_until(
        lambda: (
            any(e["kind"] == "rendezvous.complete" for e in read_events(run_dir))
            or agent.proc.poll() is not None
        ),
        RUN,
        interval_s=0.001,
        message=agent.describe,
    )
    seen: set[int] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                seen.update(p.pid for p in psutil.Process(agent.pid).children(recursive=True))
            except psutil.Error:
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    sent = 0
    try:
        while agent.proc.poll() is None:
            try:
                os.kill(agent.pid, signal.SIGTERM)
                sent += 1
            except ProcessLookupError:
                break
    finally:
        done.set()
        watcher.join(timeout=10)
    agent.known_pids.update(seen)
    assert agent.wait(RUN) == 128 + signal.SIGTERM, agent.describe()
    assert sent > 1, "the agent exited before a second signal"
    wait_until(
        lambda: not any(is_alive(pid) for pid in seen),
        10,
        message=lambda: f"still running: {[p for p in seen if is_alive(p)]}",
    )
    # Every worker that got far enough to say so is gone too.
    started = {int(p.read_text()) for p in out.glob("worker_*") if p.read_text()}
    assert not any(is_alive(pid) for pid in started), started
