"""``elastic-run close`` closes whatever the store holds (issue 28, point 6).

Two real agents train (c10d: the first hosts the TCPStore; etcd: a real etcd). A client of the
same store then forges what anything that can write to it could: garbage, a pickle or a record
with a reason we do not know under ``closed``, or it deletes the ``round`` key. None of it may
disable the operator's kill switch: ``close`` says what it replaced in one line, the agents stop
their workers and exit 3, and no worker is left; before the job whose ``round`` key was deleted
is closed, ``status`` shows it at its last round with the gap named. ``close --wait`` whose agents do not stop in
its bound (their workers ignore SIGTERM, the agents' grace is long) exits 1 and names them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastic_run.rendezvous.etcd.server import EtcdServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agent_jobs import CLI, WORKER, Job, cli_env, start_job, stop_job  # noqa: E402
from helpers import free_port, no_process_left, run_cli, wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(240)

# What pickle.dumps({"reason": "closed", "by": "x"}) writes: a reader that unpickled it would run
# whatever a forger put there.
_PICKLE = (
    b"\x80\x04\x95 \x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x06reason\x94\x8c\x06closed\x94"
    b"\x8c\x02by\x94\x8c\x01x\x94u."
)
# name -> (key, what it is made to hold; None: deleted)
_FORGERIES: dict[str, tuple[str, bytes | None]] = {
    "garbage": ("closed", b"\x00\xffnot a record"),
    "pickle": ("closed", _PICKLE),
    "bad_reason": ("closed", json.dumps({"v": 1, "reason": "bogus", "by": "forger"}).encode()),
    "round_deleted": ("round", None),
    # A TCPStore drops the connection of a client that adds to a value that is not a number.
    "epoch_garbage": ("epoch", b"\x00\xffnot a counter"),
    "epoch_past_64_bits": ("epoch", b"99999999999999999999999"),
}


@pytest.fixture(name="etcd")
def etcd_fixture() -> Iterator[EtcdServer]:
    if shutil.which("etcd") is None:
        pytest.fail("etcd is not installed: run scripts/setup.sh as root")
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


class _Forger:
    """A plain client of the job's store, writing and deleting under the job's keys."""

    def __init__(self, job: Job) -> None:
        host, port = job.endpoint.rsplit(":", 1)
        self._etcd: Any = None
        self._c10d: Any = None
        if job.backend == "etcd":
            from elastic_run.rendezvous.etcd.client import EtcdClient

            self._etcd = EtcdClient([job.endpoint])
            self._base = f"/elastic-run/{job.run_id}/"
        else:
            from datetime import timedelta

            import torch.distributed as dist

            client = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30))
            self._c10d = dist.PrefixStore(f"elastic-run/{job.run_id}/", client)

    def set(self, key: str, value: bytes) -> None:
        if self._etcd is not None:
            self._etcd.put(self._base + key, value)
        else:
            self._c10d.set(key, value)

    def get(self, key: str) -> bytes | None:
        if self._etcd is not None:
            kv = self._etcd.get(self._base + key)
            return kv.value if kv is not None else None
        return bytes(self._c10d.get(key)) if self._c10d.check([key]) else None

    def delete(self, key: str) -> None:
        if self._etcd is not None:
            assert self._etcd.delete(self._base + key)
        else:
            assert self._c10d.delete_key(key)

    def close(self) -> None:
        if self._etcd is not None:
            self._etcd.close()


def _job_cli(job: Job, command: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``elastic-run <command>`` (``status``, ``close``) on the job's rendezvous."""
    return run_cli([command, *job.rdzv_args, "--rdzv-id", job.run_id, *extra], timeout_s=120)


def _check_status_names_the_missing_round(job: Job) -> None:
    """The job exists while any of its keys does: ``status`` shows it at its last round, the gap
    named (checked on the job whose ``round`` key was deleted, before it is closed)."""
    status = _job_cli(job, "status", "--json", "--sample", "0")
    assert status.returncode == 0, status.stderr
    body = json.loads(status.stdout)
    assert body["round"] == 0 and len(body["members"]) == 2
    assert any("'round' is missing" in p for p in body["problems"]), body["problems"]


@pytest.mark.parametrize("forgery", list(_FORGERIES))
@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_close_ends_a_job_whatever_its_store_holds(
    backend: str, forgery: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    job = start_job(tmp_path, backend, _endpoint(backend, request), nprocs=[1, 1])
    forger = _Forger(job)
    try:
        key, value = _FORGERIES[forgery]
        if value is None:
            forger.delete(key)
        else:
            forger.set(key, value)
        assert all(agent.poll() is None for agent in job.agents)
        if forgery == "round_deleted":
            _check_status_names_the_missing_round(job)

        done = _job_cli(job, "close", "--wait", "--timeout", "60")
        assert done.returncode == 0, done.stderr
        lines = done.stderr.strip().splitlines()
        if value is None:
            assert lines[0] == f"closed rendezvous '{job.run_id}'", done.stderr
        elif key == "epoch":
            assert lines[0] == (
                f"rendezvous '{job.run_id}': replaced what its 'epoch' key held: "
                f"{value[:40]!r} (not a counter)"
            ), done.stderr
            assert lines[1] == f"closed rendezvous '{job.run_id}'", done.stderr
        else:
            assert lines[0].startswith(
                f"closed rendezvous '{job.run_id}', replacing what its 'closed' key held: "
                "the value under rendezvous key 'closed' "
            ), done.stderr
        assert "Traceback" not in done.stderr
        if backend == "etcd":  # a c10d store went away with the agent that hosted it
            record = json.loads(forger.get("closed") or b"null")
            assert record["reason"] == "closed" and record["by"].startswith("elastic-run close@")
        for index, agent in enumerate(job.agents):
            assert agent.wait(60) == 3, job.log(index)
            assert "] closed: " in job.log(index), job.log(index)
        wait_until(lambda: no_process_left(job.worker_pids()), 30)
    finally:
        forger.close()
        stop_job(job)


_STUBBORN = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + WORKER


@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_close_wait_past_its_bound_exits_1_naming_the_agents_still_there(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # Workers that ignore SIGTERM and a 120 s grace: the agents stop them for 120 s at least.
    job = start_job(
        tmp_path,
        backend,
        _endpoint(backend, request),
        nprocs=[1, 1],
        extra=["--shutdown-timeout", "120"],
        script=_STUBBORN,
    )
    try:
        done = _job_cli(job, "close", "--wait", "--timeout", "1")
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert lines[0] == f"closed rendezvous '{job.run_id}'", done.stderr
        assert len(lines) == 2 and lines[1].startswith(
            f"Error: rendezvous '{job.run_id}' is closed, but 2 agents still ran 1 s later "
            "(--timeout): "
        ), done.stderr
        for agent in job.agents:
            assert f"(agent pid {agent.pid})" in lines[1]
    finally:
        stop_job(job)


def test_close_timeout_without_wait_is_bad_usage() -> None:
    done = subprocess.run(
        [*CLI, "close", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id", "x", "--timeout", "5"],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(),
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "Error: --timeout is how long --wait waits: pass --wait with it"
    ]
