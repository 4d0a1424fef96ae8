"""Running the real ``elastic-run`` command in a subprocess, for the single-node e2e tests.

The ``launch`` fixture starts the console script (``<venv>/bin/elastic-run``) in its own session
(forked from a template that imported torch, ``tests/forked_agents.py``), with stdout and stderr in
files (no pipe can fill up and stall it), and on teardown kills the
agent and every process below it. Worker scripts live in ``tests/e2e/scripts``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.forked_agents import AgentProcess, start_agent
from tests.helpers import REPO_ROOT, alive_descendants, wait_until

SCRIPTS = Path(__file__).resolve().parent / "scripts"

# Variables of the launcher contract that must not leak in from the test's own environment.
_CONTRACT_VARIABLES = (
    "LOCAL_RANK",
    "RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_TIMER_FILE",
    "TORCHELASTIC_ENABLE_FILE_TIMER",
    "TORCHELASTIC_HEALTH_CHECK_PORT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
)


def script(name: str) -> str:
    """The path of a worker script in ``tests/e2e/scripts``."""
    return str(SCRIPTS / name)


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the launcher's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _CONTRACT_VARIABLES}
    env.pop("PYTHONPATH", None)
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@dataclass
class Agent:
    """One ``elastic-run`` process started by :func:`launch`."""

    proc: AgentProcess
    stdout_path: Path
    stderr_path: Path
    known_pids: set[int] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def describe(self) -> str:
        return f"exit {self.proc.poll()}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"

    def wait(self, timeout_s: float) -> int:
        """Wait for the agent to exit; fail the test (with its output) past ``timeout_s``."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"elastic-run ran past {timeout_s} s\n{self.describe()}") from None

    def remember_descendants(self) -> list[psutil.Process]:
        """The agent's living descendants now; they are also killed on teardown."""
        found = alive_descendants(self.pid)
        self.known_pids.update(p.pid for p in found)
        return found


Launch = Callable[..., Agent]


def _kill(agent: Agent) -> None:
    agent.remember_descendants()
    procs: list[psutil.Process] = []
    for pid in [agent.pid, *agent.known_pids]:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    if agent.proc.poll() is None:
        try:
            os.killpg(agent.pid, signal.SIGKILL)  # the agent's own session and group
        except ProcessLookupError:
            pass
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)
    try:
        agent.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launch]:
    """Start ``elastic-run ARGS`` in tmp_path; everything it started is killed on teardown."""
    agents: list[Agent] = []

    def start(
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
    ) -> Agent:
        label = name or f"agent{len(agents)}"
        out = tmp_path / f"{label}.stdout"
        err = tmp_path / f"{label}.stderr"
        with out.open("wb") as out_file, err.open("wb") as err_file:
            proc = start_agent(
                args, env=clean_env(env), stdout=out_file, stderr=err_file, cwd=tmp_path
            )
        agent = Agent(proc, out, err)
        agents.append(agent)
        return agent

    try:
        yield start
    finally:
        for agent in agents:
            _kill(agent)


def read_events(run_dir: Path) -> list[dict[str, object]]:
    """The JSON lines of ``<run_dir>/events.jsonl`` (complete lines only)."""
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines = lines[:-1]  # a line still being written
    return [json.loads(line) for line in lines if line.strip()]


def only_run_dir(log_dir: Path) -> Path:
    """The single ``<log-dir>/<run-id>`` directory (waits until the agent made it)."""
    wait_until(lambda: log_dir.is_dir() and any(log_dir.iterdir()), 30, message="no run dir")
    runs = [p for p in log_dir.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def read_pid_file(path: Path) -> int:
    """A pid written to ``path`` by a worker script (written atomically)."""
    return int(path.read_text())
