"""The embedded etcd cluster on three hosts (issue 26): network namespaces on a bridge, real agents.

``tests/netns_hosts.py`` builds h1, h2, h3, each with its own address. Every agent runs inside
its host with ``--rdzv-backend embedded-etcd --rdzv-endpoint h1,h2,h3`` (the three addresses) and
``--local-addr`` its host's address, so each starts one member of the job's static etcd cluster:
no etcd is started by the test. The workers (``mn_scripts``) record their environment and wait
for a ``go`` file, which the test steers through.

After every case nothing of the job is left on any host: no etcd or keeper process, no data
directory, no listening member port. No duration is asserted: each step waits (with a deadline)
for the state it expects, and prints how long it took.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from test_partitions import HostsJob

from tests.helpers import is_alive, wait_until
from tests.machine import require_etcd
from tests.netns_hosts import Hosts, require_hosts

pytestmark = [
    pytest.mark.etcd,
    pytest.mark.timeout(420),
]

# A node is judged gone after 0.25 s x 4 = 1 s without a heartbeat; a store call that does not
# answer gives up after 3 s.
CONF = "last_call_timeout=1,keep_alive_interval=0.25,keep_alive_max_attempt=4,read_timeout=3"
STEP_S = 120.0
MEMBER_PORTS = (29410, 29411)


def _say(what: str, since: float) -> None:
    sys.stderr.write(f"[embedded-etcd] {what}: {time.monotonic() - since:.1f} s\n")


@pytest.fixture(name="job")
def job_fixture(tmp_path: Path) -> Iterator[HostsJob]:
    require_hosts()
    require_etcd()
    hosts = Hosts(3)
    try:
        endpoint = ",".join(hosts.addrs)
        job = HostsJob(tmp_path, "embedded-etcd", endpoint, hosts)
        job.run_id = f"emb-{uuid.uuid4().hex[:8]}"
        try:
            yield job
        finally:
            job.kill_all()
            _kill_members(job)
    finally:
        hosts.close()


def _member_processes(job: HostsJob) -> list[psutil.Process]:
    """The job's etcd members and keepers (their command lines name its data directory)."""
    mark = f"elastic-run-etcd-{job.run_id}-"
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(mark in arg for arg in proc.info["cmdline"] or ()):
            found.append(proc)
    return found


def _kill_members(job: HostsJob) -> None:
    """After a failed test: give the keepers (whose agents are gone) time to clean up, then kill
    what is left and remove the job's directories."""
    try:
        wait_until(lambda: not _member_processes(job), 20.0, interval_s=0.2)
    except AssertionError:
        for proc in _member_processes(job):
            try:
                proc.kill()
            except psutil.Error:
                pass
    pattern = os.path.join(tempfile.gettempdir(), f"elastic-run-etcd-{job.run_id}-*")
    for directory in glob.glob(pattern):
        shutil.rmtree(directory, ignore_errors=True)


def _listening(job: HostsJob, i: int) -> list[str]:
    out = subprocess.run(
        ["ip", "netns", "exec", job.hosts.names[i - 1], "ss", "-ltnH"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return [
        line for line in out.splitlines() if any(f":{port} " in line + " " for port in MEMBER_PORTS)
    ]


def _leftovers(job: HostsJob) -> list[str]:
    """What of the job's members is left on any host: processes, directories, ports."""
    found = [f"process {p.pid} {' '.join(p.cmdline())[:120]}" for p in _member_processes(job)]
    pattern = os.path.join(tempfile.gettempdir(), f"elastic-run-etcd-{job.run_id}-*")
    found += [f"directory {d}" for d in glob.glob(pattern)]
    for i in (1, 2, 3):
        found += [f"h{i} listens: {line}" for line in _listening(job, i)]
    return found


def _assert_nothing_left(job: HostsJob) -> None:
    job.assert_no_survivors()
    wait_until(lambda: not _leftovers(job), 30.0, message=lambda: "left: " + str(_leftovers(job)))


def _start_three(job: HostsJob) -> None:
    for i, name in ((1, "a"), (2, "b"), (3, "c")):
        job.start_on(i, name, nnodes="2:3", conf=CONF)
    job.wait_running(["a", "b", "c"], 3, timeout_s=STEP_S)


def _wait_new_round(job: HostsJob, names: list[str], world_size: int, old_port: str) -> None:
    wait_until(
        lambda: (
            job.running_with(names, world_size) and job.newest(names[0])["MASTER_PORT"] != old_port
        ),
        STEP_S,
        interval_s=0.1,
        message=job.report,
    )


def test_a_job_of_three_trains_on_embedded_etcd_and_leaves_nothing(job: HostsJob) -> None:
    _start_three(job)
    assert len(_member_processes(job)) >= 3  # three keepers, three etcd members
    for i in (1, 2, 3):
        listening = _listening(job, i)
        # Each member binds its host's address, not every interface.
        assert listening and all(job.hosts.addr(i) in line for line in listening), listening
    job.go()
    for name in ("a", "b", "c"):
        assert job.wait_exit(name) == 0, job.report()
    _assert_nothing_left(job)


def test_sigkill_of_a_member_host_leaves_the_others_training(job: HostsJob) -> None:
    _start_three(job)
    old_port = job.newest("b")["MASTER_PORT"]
    killed_at = time.monotonic()
    os.kill(job.nodes["a"].proc.pid, signal.SIGKILL)
    # a's member dies with its agent (its keeper sees the pipe close).
    wait_until(lambda: not _listening(job, 1), STEP_S, message=job.report)
    _say("a's member gone after the SIGKILL", killed_at)
    _wait_new_round(job, ["b", "c"], 2, old_port)
    _say("b and c train at WORLD_SIZE 2 after a's SIGKILL", killed_at)
    job.go()
    for name in ("b", "c"):
        assert job.wait_exit(name) == 0, job.report()
    _assert_nothing_left(job)


def test_losing_two_member_hosts_ends_the_third_with_exit_4(job: HostsJob) -> None:
    _start_three(job)
    killed_at = time.monotonic()
    for name in ("b", "c"):
        os.kill(job.nodes[name].proc.pid, signal.SIGKILL)
    code = job.wait_exit("a", STEP_S)
    _say("a exited after b and c were killed", killed_at)
    assert code == 4, job.report()
    errors = [line for line in job.nodes["a"].output().splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "lost its quorum" in errors[0], job.report()
    _assert_nothing_left(job)


def test_a_cut_member_host_rejoins_after_the_heal(job: HostsJob) -> None:
    _start_three(job)
    old_port = job.newest("b")["MASTER_PORT"]
    a_pids = {int(r["pid"]) for r in job.records("a") if r["MASTER_PORT"] == old_port}
    cut_at = time.monotonic()
    job.hosts.partition(1)
    _wait_new_round(job, ["b", "c"], 2, old_port)
    _say("b and c train at WORLD_SIZE 2 after a's cut", cut_at)
    wait_until(lambda: not any(is_alive(p) for p in a_pids), STEP_S, message=job.report)
    _say("a's workers stopped after the cut", cut_at)
    # The cut lasts 30 s: a waits for the heal, it does not exit.
    wait_until(lambda: time.monotonic() - cut_at >= 30.0, 60.0, interval_s=0.5)
    assert job.nodes["a"].proc.poll() is None, "a must wait for the heal\n" + job.report()
    healed_at = time.monotonic()
    job.hosts.heal(1)
    job.wait_running(["a", "b", "c"], 3, timeout_s=STEP_S)
    _say("a, b, c train at WORLD_SIZE 3 after the heal", healed_at)
    job.go()
    for name in ("a", "b", "c"):
        assert job.wait_exit(name) == 0, job.report()
    _assert_nothing_left(job)
