"""Faults found by attack around a completed round, on a real TCPStore with a real agent.

Node "a" is a bare rendezvous participant (a subprocess built through the public registry, as
a user's code would) that completes the round as rank 0 and then misbehaves; node "b" is a real
``elastic-run`` agent. The store is hosted by the test, so killing "a" loses no store.

- a dies between the seal and publishing the workers' store: b re-rendezvouses at once (its
  rendezvous sees a's death) instead of waiting 120 s for the key, and trains alone.
- a publishes a forged workers' store ("host:notaport"): b says so in one line and exits 3.
- garbage under the job's keys: ``close`` still closes (it writes before it decodes anything),
  ``status`` shows what it can and names each bad key.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import cli_harness
import pytest
from cli_harness import Launch, only_run_dir, read_events

from tests.helpers import REPO_ROOT, run_cli, wait_until

launch = cli_harness.launch
RUN = 90.0
CONF = "is_host=false,keep_alive_interval=0.25,keep_alive_max_attempt=4,last_call_timeout=1"

_NODE_A = """
import json, os, signal, sys
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.registry import rendezvous_handler_registry
endpoint, run_id, how = sys.argv[1:4]
conf = dict(item.split("=") for item in sys.argv[4].split(","))
params = RendezvousParameters("c10d", endpoint, run_id, 2, 2, local_addr="127.0.0.1", **conf)
handler = rendezvous_handler_registry.create_handler(params)
info = handler.next_rendezvous()
if how == "forge":
    info.store.set("workers-store", "host:notaport")
print(f"rank {info.rank}", flush=True)
signal.pause()
"""

_WORKER = """
import os, sys
from pathlib import Path
out = Path(sys.argv[1])
(out / f"ran-{os.environ['RANK']}-{os.environ['WORLD_SIZE']}").write_text(str(os.getpid()))
"""


@pytest.fixture(name="store")
def store_fixture() -> Iterator[Any]:
    import torch.distributed as dist

    server = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    yield server


def _start_a(store: Any, run_id: str, how: str) -> subprocess.Popen[str]:
    env = {"PYTHONPATH": str(REPO_ROOT), "TORCH_CPP_LOG_LEVEL": "FATAL"}
    return subprocess.Popen(
        [sys.executable, "-c", _NODE_A, f"127.0.0.1:{store.port}", run_id, how, CONF],
        stdout=subprocess.PIPE,
        text=True,
        env={**cli_harness.clean_env(), **env},
    )


def _start_b(launch: Launch, tmp_path: Path, store: Any, run_id: str) -> Any:
    worker = tmp_path / "worker.py"
    worker.write_text(_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    agent = launch(
        [
            "--nnodes",
            "1:2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{store.port}",
            "--rdzv-id",
            run_id,
            "--rdzv-conf",
            CONF,
            "--local-addr",
            "127.0.0.1",
            "--log-dir",
            str(tmp_path / "logs"),
            "--no-live",
            str(worker),
            str(out),
        ]
    )
    return agent, out


def _arrived(store: Any, run_id: str, count: int) -> bool:
    import torch.distributed as dist

    job = dist.PrefixStore(f"elastic-run/{run_id}/", store)  # the backend's own view
    return bool(job.check(["r0/arrivals"])) and int(job.get("r0/arrivals")) >= count


def test_node_0_dying_before_it_publishes_the_workers_store_is_seen_at_once(
    launch: Launch, tmp_path: Path, store: Any
) -> None:
    run_id = f"rf-{uuid.uuid4().hex[:8]}"
    a = _start_a(store, run_id, "die")
    try:
        wait_until(lambda: _arrived(store, run_id, 1), 60, message="a never arrived")
        agent, out = _start_b(launch, tmp_path, store, run_id)
        assert a.stdout is not None
        assert a.stdout.readline().strip() == "rank 0"
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=30)
        # b trains alone: its worker ran with WORLD_SIZE 1, long before a 120 s wait would end.
        wait_until(
            lambda: (out / "ran-0-1").exists() or agent.proc.poll() is not None,
            RUN,
            message=agent.describe,
        )
        assert agent.wait(RUN) == 0, agent.describe()
        assert (out / "ran-0-1").exists(), agent.describe()
        events = read_events(only_run_dir(tmp_path / "logs"))
        # Round 0 was sealed with a and b; b never started workers in it (no workers' store),
        # it joined again and completed round 1 alone.
        assert [e["kind"] for e in events].count("rendezvous.joining") == 2, events
        done = [e["fields"] for e in events if e["kind"] == "rendezvous.complete"]
        assert [(c["round"], c["group_world_size"]) for c in done] == [(1, 1)], done
    finally:
        if a.poll() is None:
            a.kill()
            a.wait(timeout=30)


def test_a_forged_workers_store_is_one_error_line_and_exit_3(
    launch: Launch, tmp_path: Path, store: Any
) -> None:
    run_id = f"rf-{uuid.uuid4().hex[:8]}"
    a = _start_a(store, run_id, "forge")
    try:
        wait_until(lambda: _arrived(store, run_id, 1), 60, message="a never arrived")
        agent, out = _start_b(launch, tmp_path, store, run_id)
        assert agent.wait(RUN) == 3, agent.describe()
        errors = [line for line in agent.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "workers-store" in errors[0], agent.describe()
        assert "Traceback" not in agent.stderr
        assert not list(out.iterdir())
    finally:
        a.kill()
        a.wait(timeout=30)


def test_close_closes_a_job_whose_keys_hold_garbage_and_status_names_them(store: Any) -> None:
    run_id = f"rf-{uuid.uuid4().hex[:8]}"
    import torch.distributed as dist

    prefix = dist.PrefixStore(f"elastic-run/{run_id}/", store)
    prefix.set("round", "0")
    prefix.set("r0/arrivals", "1")
    prefix.set("r0/node/0", b"\x00garbage")
    prefix.set("r0/seal", "not json")
    prefix.set("ev/count", "x")
    target = ["--rdzv-endpoint", f"127.0.0.1:{store.port}", "--rdzv-id", run_id]
    status = run_cli(["status", *target, "--json", "--sample", "0"])
    assert status.returncode == 0, status.stderr
    body = json.loads(status.stdout)
    named = " ".join(body["problems"])
    assert "'r0/seal'" in named and "'ev/count'" in named, body["problems"]
    assert body["closed"] is False

    closed = run_cli(["close", *target])
    assert closed.returncode == 0, closed.stderr
    assert prefix.check(["closed"])
    after = json.loads(run_cli(["status", *target, "--json", "--sample", "0"]).stdout)
    assert after["closed"] is True and after["state"] == "closed"
