"""End to end through the real ``elastic-run`` command: the file-timer watchdog and the
health-check server (/healthz, /status, /metrics).

A worker that hangs inside a watchdog timer (ours, then torch's FileTimerClient) is killed and
restarted; /healthz turns 503 while the agent loop is held through the test seam
a ptrace freeze of its loop thread and 200 once it resumes; /status names the workers psutil sees.
"""

from __future__ import annotations

import http.client
import json
import signal
from pathlib import Path

import cli_harness
import pytest
from cli_harness import Agent, Launch, only_run_dir, read_events, read_pid_file, script

from tests.helpers import is_alive, no_process_left, wait_until
from tests.thread_freeze import frozen_thread

launch = cli_harness.launch

pytestmark = pytest.mark.timeout(120)

RUN = 60.0  # deadline of one small job (torch imports on a loaded 2-core machine)


@pytest.mark.parametrize("client", ["ours", "torch"])
def test_worker_hanging_in_a_timer_is_killed_and_restarted(
    launch: Launch, tmp_path: Path, client: str
) -> None:
    logs = tmp_path / "logs"
    agent = launch(
        [
            "--standalone",
            "--watchdog",
            "--max-restarts",
            "1",
            "--log-dir",
            str(logs),
            script("hang_in_timer.py"),
            client,
        ]
    )
    assert agent.wait(RUN) == 0, agent.describe()
    assert "hanging inside the timer" in agent.stdout, agent.describe()
    assert "recovered on restart 1" in agent.stdout, agent.describe()
    events = read_events(only_run_dir(logs))
    expired = [e for e in events if e["kind"] == "watchdog.expired"]
    assert len(expired) == 1, events
    fields = expired[0]["fields"]
    assert isinstance(fields, dict)
    assert fields["scope_id"] == "hang"
    assert fields["signal"] == "SIGKILL"
    restarts = [e for e in events if e["kind"] == "restart"]
    assert len(restarts) == 1, events


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def _health_port(agent: Agent, run_dir: Path) -> int:
    found: list[int] = []

    def started() -> bool:
        for event in read_events(run_dir):
            fields = event["fields"]
            if event["kind"] == "health.started" and isinstance(fields, dict):
                found.append(int(fields["port"]))
                return True
        return agent.proc.poll() is not None

    wait_until(started, RUN, message=agent.describe)
    assert found, agent.describe()
    return found[0]


def _wait_for_status(port: int, code: int, agent: Agent) -> str:
    seen: list[tuple[int, str]] = []

    def answered() -> bool:
        assert agent.proc.poll() is None, agent.describe()
        seen.append(_get(port, "/healthz"))
        return seen[-1][0] == code

    wait_until(answered, 30, interval_s=0.1, message=lambda: f"last answer {seen[-1:]}")
    return seen[-1][1]


def test_health_server_follows_the_agent_loop_and_lists_the_workers(
    launch: Launch, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    agent = launch(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--health-check-port",
            "0",
            "--health-check-timeout",
            "1",
            "--log-dir",
            str(logs),
            script("hang.py"),
        ],
        env={"OUT_DIR": str(out)},
    )
    run_dir = only_run_dir(logs)
    port = _health_port(agent, run_dir)
    wait_until(
        lambda: all((out / f"worker_{lr}").exists() for lr in (0, 1)) or agent.proc.poll(),
        RUN,
        message=agent.describe,
    )
    pids = {read_pid_file(out / f"worker_{lr}") for lr in (0, 1)}
    agent.known_pids.update(pids)

    body = json.loads(_wait_for_status(port, 200, agent))
    assert body["status"] == "ok"

    # /status names exactly the workers that are running under the agent
    def status_pids() -> set[int]:
        code, text = _get(port, "/status")
        assert code == 200, text
        return {w["pid"] for w in json.loads(text)["workers"] if w["pid"] is not None}

    wait_until(lambda: status_pids() == pids, 10, message=lambda: f"{status_pids()} != {pids}")
    descendants = {p.pid for p in agent.remember_descendants()}
    assert pids <= descendants
    assert all(is_alive(pid) for pid in pids)
    code, status_text = _get(port, "/status")
    status = json.loads(status_text)
    assert sorted(w["rank"] for w in status["workers"]) == [0, 1]
    assert {w["state"] for w in status["workers"]} == {"HEALTHY"}

    code, metrics = _get(port, "/metrics")
    assert code == 200
    lines = metrics.splitlines()
    assert "elastic_run_restarts_total 0.0" in lines, metrics
    assert "elastic_run_workers_running 2.0" in lines, metrics
    assert "elastic_run_elastic_run_" not in metrics
    assert _get(port, "/no-such-path")[0] == 404

    # the agent's loop thread stalls (frozen by ptrace, the rest of the agent runs on): 503,
    # then 200 once it runs again
    with frozen_thread(agent.proc.pid):
        unhealthy = json.loads(_wait_for_status(port, 503, agent))
    assert unhealthy["status"] == "unhealthy"
    assert "agent_loop" in unhealthy["reason"]
    assert json.loads(_wait_for_status(port, 200, agent))["status"] == "ok"

    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(RUN) == 128 + signal.SIGTERM, agent.describe()
    assert no_process_left(pids)
