"""The agent that hosts the c10d store raises its soft descriptor limit to the hard limit at
start, and says in one line before the round when even that is too low for MAX nodes.

A real agent under ``prlimit`` (soft 512, hard 4096); its worker prints the soft limit it
inherited, which is the agent's after the raise.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.helpers import agent_env

SCRIPT = Path(__file__).parent / "descriptor_scripts" / "print_nofile.py"
_LINE = "has room for about"

pytestmark = pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit")


def _host(max_nodes: int) -> subprocess.CompletedProcess[str]:
    command = ["prlimit", "--nofile=512:4096", sys.executable, "-m", "elastic_run"]
    command += ["--nnodes", f"1:{max_nodes}", "--nproc-per-node", "1", "--no-live"]
    command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]
    command += ["--rdzv-id", f"fd-{uuid.uuid4().hex[:8]}", "--rdzv-conf", "last_call_timeout=1"]
    command += [str(SCRIPT)]
    return subprocess.run(
        command, env=agent_env(), capture_output=True, text=True, timeout=120, check=False
    )


def test_a_store_host_raises_its_soft_limit_and_says_nothing_when_max_fits() -> None:
    done = _host(8)
    assert done.returncode == 0, done.stderr
    assert "soft nofile 4096" in done.stdout, done.stdout  # raised from 512 to the hard limit
    assert _LINE not in done.stderr + done.stdout


def test_a_store_host_too_small_for_max_nodes_says_so_in_one_line_before_the_round() -> None:
    done = _host(3000)  # 2 connections a node: 6,000 and more descriptors, the hard limit 4,096
    assert done.returncode == 0, done.stderr  # a job of fewer nodes still runs
    assert "soft nofile 4096" in done.stdout, done.stdout
    output = done.stderr + done.stdout
    lines = [line for line in output.splitlines() if _LINE in line]
    assert len(lines) == 1, output
    assert "--nnodes max 3000" in lines[0] and "4096" in lines[0], lines[0]
    assert output.index(_LINE) < output.index("rendezvous.complete"), output
