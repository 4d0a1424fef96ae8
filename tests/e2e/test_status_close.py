"""``elastic-run status`` and ``close`` against real running jobs, and the agent's two views.

Each job is two real ``elastic-run`` agents on 127.0.0.1 (c10d, and etcd on a real etcd) whose
workers report their pid and then wait for a "go" file, so the test reads the rendezvous while
it is complete and healthy and then lets the job finish (or closes it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from elastic_run.rendezvous.etcd.server import EtcdServer
from tests.machine import require_etcd, require_program

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agent_jobs import CLI, WORKER, cli_env, start_job, stop_job  # noqa: E402
from helpers import (  # noqa: E402
    REPO_ROOT,
    free_port,
    no_process_left,
    run_cli,
    run_cli_in_process,
    wait_until,
)

pytestmark = pytest.mark.timeout(180)


def _status(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return run_cli(["status", *args], timeout_s=timeout_s)


@pytest.fixture(name="etcd")
def etcd_fixture() -> Iterator[EtcdServer]:
    require_etcd()
    server = EtcdServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _endpoint(backend: str, request: pytest.FixtureRequest) -> str:
    if backend == "etcd":
        server: EtcdServer = request.getfixturevalue("etcd")
        return server.endpoint
    return f"127.0.0.1:{free_port()}"


@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_status_json_matches_the_running_agents(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    job = start_job(tmp_path, backend, _endpoint(backend, request), nprocs=[1, 2])
    try:
        agent_pids = {a.pid: n for a, n in zip(job.agents, job.nprocs, strict=True)}

        query = ("status", *job.rdzv_args, "--rdzv-id", job.run_id, "--nnodes", "2", "--json")

        def every_member_healthy(done: subprocess.CompletedProcess[str]) -> bool:
            assert done.returncode == 0, done.stderr
            read = json.loads(done.stdout)
            return len(read["members"]) == 2 and all(
                m["state"] == "HEALTHY" for m in read["members"]
            )

        # Polled in this process (the same command; a child imports torch for each read),
        # then read once by the real command in a child, which is what is asserted.
        wait_until(lambda: every_member_healthy(run_cli_in_process(query)), 60, interval_s=0.2)
        done = _status(*query[1:])
        assert every_member_healthy(done), done.stdout
        body = json.loads(done.stdout)
        assert body["v"] == 1
        assert body["run_id"] == job.run_id
        assert body["backend"] == backend
        assert body["endpoint"] == job.endpoint
        assert body["state"] == "complete"
        assert body["closed"] is False and body["closed_reason"] is None
        assert (body["min_nodes"], body["max_nodes"]) == (2, 2)
        assert body["waiting"] == [] and body["lost"] == []
        members = body["members"]
        assert isinstance(members, list)
        assert sorted(m["rank"] for m in members) == [0, 1]
        assert {m["pid"] for m in members} == set(agent_pids)
        for member in members:
            pid = member["pid"]
            assert member["local_world_size"] == agent_pids[pid]
            assert member["restarts"] == 0
            assert member["heartbeat_age_s"] is not None
            assert member["addr"] == "127.0.0.1"
            # What psutil sees under that agent: as many live workers as it says it has.
            children = [
                p
                for p in psutil.Process(pid).children(recursive=True)
                if p.pid in job.worker_pids()
            ]
            assert len(children) == member["local_world_size"]
        events = body["events"]
        assert isinstance(events, list)
        assert [e["kind"] for e in events].count("rendezvous.complete") == 2

        # The workers never beat: they are never judged hung, so no hang timeout is shown
        # (it read 600 s, the warm-up allowance of a judgement that never comes).
        ranks: list[dict[str, object]] = []

        def every_rank_published() -> bool:
            done = run_cli_in_process(
                ["status", *job.rdzv_args, "--rdzv-id", job.run_id, "--json", "--sample", "0"]
            )
            progress = json.loads(done.stdout).get("progress") or {}
            ranks[:] = progress.get("ranks") or []
            return len(ranks) == 3

        wait_until(every_rank_published, 60, interval_s=0.2, message=lambda: str(ranks))
        assert [(r["beats"], r["timeout_s"]) for r in ranks] == [(0, None)] * 3, ranks
        table = _status(*job.rdzv_args, "--rdzv-id", job.run_id, "--sample", "0")
        assert table.returncode == 0 and "ranks" in table.stdout, table.stdout
        assert "600.0 s" not in table.stdout, table.stdout

        (job.out / "go").touch()
        for agent in job.agents:
            assert agent.wait(60) == 0
        assert no_process_left(job.worker_pids())
    finally:
        stop_job(job)


def test_close_ends_a_running_two_node_job(tmp_path: Path) -> None:
    job = start_job(tmp_path, "c10d", f"127.0.0.1:{free_port()}", nprocs=[1, 1])
    try:
        done = run_cli(
            ["close", *job.rdzv_args, "--rdzv-id", job.run_id, "--wait", "--timeout", "60"],
            timeout_s=90,
        )
        assert done.returncode == 0, done.stderr
        assert f"closed rendezvous '{job.run_id}'" in done.stderr
        for index, agent in enumerate(job.agents):
            assert agent.wait(60) == 3, job.log(index)
            assert "closed" in job.log(index)
        wait_until(lambda: no_process_left(job.worker_pids()), 10)
    finally:
        stop_job(job)


def test_close_of_a_missing_job_is_exit_3(etcd: EtcdServer) -> None:
    done = subprocess.run(
        [*CLI, "close", "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoint],
        capture_output=True,
        text=True,
        timeout=60,
        env={**cli_env(), "PET_RDZV_ID": "no-such-job"},
    )
    assert done.returncode == 3
    assert done.stderr.strip().splitlines() == [
        f"Error: no rendezvous 'no-such-job' at the etcd endpoint {etcd.endpoint}"
    ]


def test_status_of_a_missing_job_is_exit_3(etcd: EtcdServer) -> None:
    done = _status("--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoint, "--rdzv-id", "nope")
    assert done.returncode == 3
    assert done.stderr.strip().splitlines() == [
        f"Error: no rendezvous 'nope' at the etcd endpoint {etcd.endpoint}"
    ]


@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_status_of_an_unreachable_endpoint_is_exit_4(backend: str) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    done = _status(
        "--rdzv-backend", backend, "--rdzv-endpoint", endpoint, "--rdzv-id", "x",
        "--rdzv-conf", "read_timeout=2",
    )  # fmt: skip
    assert done.returncode == 4, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: cannot reach the") and endpoint in lines[0]


def test_plain_event_lines_when_not_a_terminal(tmp_path: Path) -> None:
    worker = tmp_path / "ok.py"
    # One write per line (under -u print writes the newline apart; see scripts/talk.py).
    worker.write_text("import sys\nsys.stdout.write('hello\\n')\n")
    done = subprocess.run(
        [*CLI, "--standalone", "--nproc-per-node", "2", str(worker)],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
    )
    assert done.returncode == 0, done.stderr
    line = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ elastic-run\[[^\]]+\] ([a-z.]+): .+$")
    kinds = [m.group(1) for s in done.stderr.splitlines() if (m := line.match(s))]
    assert kinds[0] == "agent.started"
    assert "rendezvous.complete" in kinds and "workers.started" in kinds
    assert kinds[-1] == "agent.exited"
    assert "┃" not in done.stderr and "╭" not in done.stderr
    # Worker output passes through unprefixed on stdout, as under torchrun.
    assert [s for s in done.stdout.splitlines() if s.endswith("hello")] == ["hello", "hello"]


def test_live_view_in_a_real_terminal(tmp_path: Path) -> None:
    require_program("tmux", "tmux")
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    session = f"er-{uuid.uuid4().hex[:8]}"
    socket_name = f"er-test-{session}"
    tmux = ["tmux", "-L", socket_name]
    command = " ".join(
        [
            f"PYTHONPATH={REPO_ROOT}",
            *CLI,
            "--standalone",
            "--nproc-per-node",
            "2",
            str(worker),
            str(out),
            f"; echo EXIT=$? > {out / 'exit'}; sleep 30",
        ]
    )
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", session, "-x", "150", "-y", "60", command],
        check=True,
        env={k: v for k, v in os.environ.items() if k != "TMUX"},
    )
    try:

        def screen() -> str:
            return subprocess.run(
                [*tmux, "capture-pane", "-p", "-t", session],
                capture_output=True,
                text=True,
                check=True,
            ).stdout

        def shows_everything() -> bool:
            text = screen()
            # MiB: the workers' memory, which the panel's feed reads once a second
            return all(
                word in text
                for word in ("members", "workers", "HEALTHY", "rendezvous.complete", "MiB")
            ) and all(str(pid) in text for pid in _ready_pids(out))

        wait_until(lambda: len(_ready_pids(out)) == 2 and shows_everything(), 90, message=screen)
        text = screen()
        assert "╭" in text or "┏" in text  # drawn by rich, not plain lines
        assert "complete" in text and "MiB" in text
        (out / "go").touch()
        wait_until((out / "exit").exists, 60, message=screen)
        assert (out / "exit").read_text().strip() == "EXIT=0"
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        for pid in _ready_pids(out):
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass


def _ready_pids(out: Path) -> list[int]:
    return [int(p.read_text()) for p in out.glob("ready-*") if p.read_text()]
