"""A rendezvous backend that cannot be reached: one line, exit 4, before the agent starts.

torch's C++ layer prints about 20 lines (socket errors with stacks) for an unreachable c10d
endpoint, and gRPC's core one line per failed connect or handshake for etcd; the agent sets
both quiet for itself (its workers keep the user's environment). etcd connects lazily, so the
agent reads one key before it starts: an etcd that is down is said at once, not after a first
join attempt ran out of time, and ``agent.started`` never appears.
"""

from __future__ import annotations

from pathlib import Path

import cli_harness
import pytest
from cli_harness import Agent, Launch, script

from tests.helpers import free_port

launch = cli_harness.launch

pytestmark = pytest.mark.timeout(180)

RUN = 120.0


def _assert_unreachable(agent: Agent, marker: Path, log_dir: Path) -> None:
    assert agent.wait(RUN) == 4, agent.describe()
    lines = agent.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), agent.describe()
    assert "agent.started" not in agent.stderr
    assert not marker.exists(), "a worker ran"
    assert not log_dir.exists(), "a log directory was made"


def test_an_unreachable_c10d_endpoint_is_one_line_and_exit_4(
    launch: Launch, tmp_path: Path
) -> None:
    marker, log_dir = tmp_path / "worker-ran", tmp_path / "logs"
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    agent = launch(
        [
            "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--rdzv-id", "job", "--rdzv-conf", "is_host=false,read_timeout=2",
            "--log-dir", str(log_dir), script("touch.py"),
        ],
        env={"MARKER": str(marker)},
    )  # fmt: skip
    _assert_unreachable(agent, marker, log_dir)
    assert endpoint in agent.stderr


def test_an_unreachable_etcd_is_said_before_the_agent_starts(
    launch: Launch, tmp_path: Path
) -> None:
    marker, log_dir = tmp_path / "worker-ran", tmp_path / "logs"
    endpoint = f"127.0.0.1:{free_port()}"
    agent = launch(
        [
            "--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint,
            "--rdzv-id", "job", "--log-dir", str(log_dir), script("touch.py"),
        ],
        env={"MARKER": str(marker)},
    )  # fmt: skip
    _assert_unreachable(agent, marker, log_dir)
    assert "cannot be reached to answer a first read" in agent.stderr, agent.describe()
