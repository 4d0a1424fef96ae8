"""The embedded etcd backend on one host (issue 26): a one-member cluster, bad input, status and
close from a reader, no root needed. The three-host cases are ``test_embedded_etcd.py``.

Each job's member binds 127.0.0.1 on a free port; after each case no etcd or keeper process,
no data directory and no listening port of the job is left.
"""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import psutil
import pytest

from tests.forked_agents import start_agent
from tests.helpers import REPO_ROOT, free_port_pair, run_cli, wait_until
from tests.machine import require_etcd, require_program

WORKER = Path(__file__).resolve().parent / "mn_scripts" / "worker.py"
STEP_S = 45.0  # one step takes under 10 s; the cases' own limit below leaves room to say why
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(name="etcd_required")
def etcd_required_fixture() -> None:
    """A missing etcd fails the test in one line (never a skip)."""
    require_etcd()


@pytest.fixture(name="openssl_required")
def openssl_required_fixture() -> None:
    """A missing openssl fails the test in one line (never a skip)."""
    require_program("openssl", "openssl")


needs_etcd = pytest.mark.usefixtures("etcd_required")


def _leftovers(run_id: str, port: int) -> list[str]:
    mark = f"elastic-run-etcd-{run_id}-"
    found = [
        f"process {p.pid}"
        for p in psutil.process_iter(["cmdline"])
        if any(mark in arg for arg in p.info["cmdline"] or ())
    ]
    found += glob.glob(os.path.join(tempfile.gettempdir(), mark + "*"))
    found += [
        f"port {c.laddr}"
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in (port, port + 1)
    ]
    return found


def _agent(tmp: Path, run_id: str, endpoint: str, env: dict[str, str] | None = None) -> list[str]:
    return [
        "--nnodes", "1", "--rdzv-backend", "embedded-etcd", "--rdzv-endpoint", endpoint,
        "--rdzv-id", run_id, "--local-addr", "127.0.0.1", "--log-dir", str(tmp / "logs"),
        "--no-live", str(WORKER),
    ]  # fmt: skip


@needs_etcd
def test_a_one_member_job_trains_and_leaves_nothing(tmp_path: Path) -> None:
    run_id = f"emb1-{uuid.uuid4().hex[:8]}"
    port = free_port_pair()
    out = tmp_path / "out"
    out.mkdir()
    (out / "go").touch()
    done = run_cli(
        _agent(tmp_path, run_id, f"127.0.0.1:{port}"),
        env={"MN_OUT": str(out), "MN_NODE": "a"},
        timeout_s=STEP_S,
    )
    assert done.returncode == 0, done.stderr
    assert list(out.glob("a_*.json")), done.stderr
    wait_until(
        lambda: not _leftovers(run_id, port), 30.0, message=lambda: str(_leftovers(run_id, port))
    )


def test_a_member_host_without_etcd_fails_before_the_agent_starts(tmp_path: Path) -> None:
    run_id = f"emb2-{uuid.uuid4().hex[:8]}"
    port = free_port_pair()
    done = run_cli(
        _agent(tmp_path, run_id, f"127.0.0.1:{port},127.0.0.2,127.0.0.3"),
        env={"PATH": str(tmp_path), "MN_OUT": str(tmp_path)},  # no etcd on PATH
        timeout_s=STEP_S,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("Error:"), done.stderr
    assert "etcd-server" in lines[0] and "m1" in lines[0], lines
    assert "Traceback" not in done.stderr
    assert not list((tmp_path / "logs").glob("*/events.jsonl"))  # no agent.started
    assert not _leftovers(run_id, port)


@needs_etcd
def test_a_member_whose_peer_port_is_taken_says_why_in_one_line(tmp_path: Path) -> None:
    run_id = f"emb5-{uuid.uuid4().hex[:8]}"
    port = free_port_pair()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        done = run_cli(
            _agent(tmp_path, run_id, f"127.0.0.1:{port}"),
            env={"MN_OUT": str(tmp_path), "MN_NODE": "a"},
            timeout_s=STEP_S,
        )
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0, done.stderr
    assert len(lines) == 1 and lines[0].startswith("Error:"), done.stderr
    assert f"127.0.0.1:{port + 1}: bind: address already in use" in lines[0], lines
    assert not list(tmp_path.glob("a_*.json"))  # no worker started
    wait_until(
        lambda: not _leftovers(run_id, port), 30.0, message=lambda: str(_leftovers(run_id, port))
    )


def test_print_config_shows_the_members_and_which_one_is_here(tmp_path: Path) -> None:
    done = run_cli(
        [
            "--rdzv-backend",
            "embedded-etcd",
            "--rdzv-endpoint",
            "127.0.0.1:4000,10.9.9.2,10.9.9.3",
            "--rdzv-id",
            "job",
            "--local-addr",
            "127.0.0.1",
            "--print-config",
        ]  # fmt: skip
    )
    assert done.returncode == 0, done.stderr
    assert "m1=127.0.0.1:4000, m2=10.9.9.2:29410, m3=10.9.9.3:29410" in done.stdout
    assert "this host runs m1" in done.stdout and "peer port = client port + 1" in done.stdout


@pytest.mark.parametrize("endpoint", ["a,b", "a,a,b", "a:99999,b,c"])
def test_bad_member_lists_are_one_line_and_exit_2(tmp_path: Path, endpoint: str) -> None:
    done = run_cli(_agent(tmp_path, "job", endpoint), timeout_s=STEP_S)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), done.stderr


@needs_etcd
def test_status_and_close_from_a_reader_show_the_members_and_end_the_job(tmp_path: Path) -> None:
    run_id = f"emb3-{uuid.uuid4().hex[:8]}"
    port = free_port_pair()
    endpoint = f"127.0.0.1:{port}"
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, MN_OUT=str(out), MN_NODE="a", MN_MAX_WAIT_S="300")
    env["PYTHONPATH"] = str(REPO_ROOT)
    log = (tmp_path / "agent.log").open("wb")
    agent = start_agent(_agent(tmp_path, run_id, endpoint), env=env, stdout=log, stderr=log)
    try:
        wait_until(
            lambda: list(out.glob("a_*.json")) or agent.poll() is not None,
            STEP_S,
            message=lambda: (tmp_path / "agent.log").read_text(),
        )
        assert agent.poll() is None, (tmp_path / "agent.log").read_text()
        reader = [
            "--rdzv-backend",
            "embedded-etcd",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-id",
            run_id,
        ]
        status = run_cli(["status", *reader, "--sample", "0"], timeout_s=STEP_S)
        assert status.returncode == 0, status.stderr
        assert f"embedded etcd members: {endpoint} up" in status.stderr
        closed = run_cli(["close", *reader], timeout_s=STEP_S)
        assert closed.returncode == 0, closed.stderr
        assert agent.wait(timeout=STEP_S) == 3, (tmp_path / "agent.log").read_text()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    wait_until(
        lambda: not _leftovers(run_id, port), 30.0, message=lambda: str(_leftovers(run_id, port))
    )


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _certificates(d: Path) -> None:
    """A CA, and one certificate for 127.0.0.1-3 that serves and authenticates (peers use it)."""
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=d)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-days", "2", "-subj", "/CN=ca", "-out", "ca.pem",
        cwd=d,
    )  # fmt: skip
    (d / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1,IP:127.0.0.2,IP:127.0.0.3\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
    )
    _openssl("genrsa", "-out", "member.key", "2048", cwd=d)
    _openssl(
        "req", "-new", "-key", "member.key", "-subj", "/CN=member", "-out", "member.csr", cwd=d
    )
    _openssl(
        "x509", "-req", "-in", "member.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "ext.cnf", "-out", "member.pem", cwd=d,
    )  # fmt: skip


@needs_etcd
@pytest.mark.usefixtures("openssl_required")
def test_three_members_with_peer_and_client_tls_train(tmp_path: Path) -> None:
    _certificates(tmp_path)
    run_id = f"emb4-{uuid.uuid4().hex[:8]}"
    port = free_port_pair()
    endpoint = ",".join(f"127.0.0.{i}:{port}" for i in (1, 2, 3))
    conf = (
        f"ssl_cert={tmp_path / 'member.pem'},ssl_cert_key={tmp_path / 'member.key'},"
        f"ca_cert={tmp_path / 'ca.pem'},last_call_timeout=1"
    )
    out = tmp_path / "out"
    out.mkdir()
    (out / "go").touch()
    agents = []
    for i in (1, 2, 3):
        env = dict(os.environ, MN_OUT=str(out), MN_NODE=f"n{i}", PYTHONPATH=str(REPO_ROOT))
        command = [
            "--nnodes", "3", "--rdzv-backend", "embedded-etcd",
            "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, "--rdzv-conf", conf,
            "--local-addr", f"127.0.0.{i}", "--log-dir", str(tmp_path / f"logs{i}"), "--no-live",
            str(WORKER),
        ]  # fmt: skip
        log = (tmp_path / f"n{i}.log").open("wb")
        agents.append(start_agent(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        for i, agent in enumerate(agents, start=1):
            code = agent.wait(timeout=STEP_S * 2)
            assert code == 0, (tmp_path / f"n{i}.log").read_text()
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    assert len(list(out.glob("n*_*.json"))) == 3
    wait_until(
        lambda: not _leftovers(run_id, port), 30.0, message=lambda: str(_leftovers(run_id, port))
    )
