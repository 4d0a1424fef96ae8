"""The tests' forked agents (``tests/forked_agents.py``) against exec'd ones.

The same job runs twice, once with its agent forked from the template and once exec'd
(``ELASTIC_RUN_TEST_FORK_AGENTS=0``): what a test can see of the agent (its command line, cwd,
session, environment, its workers' environment, its events, its exit status, its answer to
SIGTERM) is the same. Then the harness's own rules: an agent whose start-up variables differ from
every template's is exec'd, and a forked agent is waited for and killed as a ``Popen`` is.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cli_harness
import psutil
import pytest
from cli_harness import Agent, Launch, clean_env

from tests import forked_agents
from tests.forked_agents import FORK_VARIABLE, ForkedAgent, console_script, start_agent
from tests.helpers import free_port, is_alive, no_process_left, wait_until

launch = cli_harness.launch

pytestmark = pytest.mark.timeout(180)

RUN = 60.0

# Writes its environment to $OUT/env-<RANK>.json, then waits for $OUT/go.
WORKER = """\
import json, os, sys, time
from pathlib import Path
out = Path(os.environ["OUT"])
(out / f"env-{os.environ['RANK']}.json").write_text(json.dumps(dict(os.environ)))
while not (out / "go").exists():
    time.sleep(0.05)
"""
# Values that belong to one run or one test directory, not to how the agent was started.
_PER_RUN = {
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "ELASTIC_RUN_PROGRESS_FILE",
    "ELASTIC_RUN_GUARDIAN",
    "ELASTIC_RUN_TEST_ID",
    "OUT",
    "PWD",
    FORK_VARIABLE,  # the switch that made one of the two exec'd
}


@pytest.fixture(autouse=True)
def forking() -> None:
    """The first agent of a set of start-up variables is exec'd: one went by before each test."""
    _version(clean_env())


def _both_ways(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``"forked"``, then ``"execd"``: agents started after it are exec'd."""
    yield "forked"
    monkeypatch.setenv(FORK_VARIABLE, "0")
    yield "execd"


def _job(launch: Launch, tmp_path: Path, name: str) -> tuple[Agent, Path, dict[str, Any]]:
    """Start a two-worker job; while both workers wait, look at its agent."""
    out = tmp_path / name
    out.mkdir()
    worker = out / "worker.py"
    worker.write_text(WORKER)
    args = ["--standalone", "--nproc-per-node", "2", "--no-live", str(worker)]
    agent = launch(args, env={"OUT": str(out), "PROBE": "yes"}, name=name)
    wait_until(
        lambda: len(list(out.glob("env-*.json"))) == 2 or agent.proc.poll() is not None,
        RUN,
        message=agent.describe,
    )
    me = psutil.Process(agent.pid)
    seen = {
        "forked": isinstance(agent.proc, ForkedAgent),
        "cmdline": me.cmdline(),
        "cwd": me.cwd(),
        "own_session": os.getsid(agent.pid) == agent.pid,
        "probe": me.environ().get("PROBE"),
        "python_path": me.environ().get("PYTHONPATH"),
    }
    return agent, out, seen


def _worker_env(out: Path, rank: int) -> dict[str, str]:
    env: dict[str, str] = json.loads((out / f"env-{rank}.json").read_text())
    return {k: v for k, v in env.items() if k not in _PER_RUN}


def _kinds(agent: Agent) -> list[str]:
    """The event kinds of the agent's stderr lines (``... elastic-run[run] kind: text``)."""
    return [
        line.split("] ", 1)[1].split(":", 1)[0]
        for line in agent.stderr.splitlines()
        if "] " in line and " elastic-run[" in line
    ]


def test_a_forked_agent_is_seen_as_an_execd_one(
    launch: Launch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = {}
    for name in _both_ways(monkeypatch):
        agent, out, seen = _job(launch, tmp_path, name)
        (out / "go").write_text("")
        assert agent.wait(RUN) == 0, agent.describe()
        runs[name] = (seen, [_worker_env(out, r) for r in (0, 1)], _kinds(agent), agent)
    (forked, forked_env, forked_kinds, fa), (execd, execd_env, execd_kinds, ea) = (
        runs["forked"],
        runs["execd"],
    )
    assert forked.pop("forked") and not execd.pop("forked")
    script = str(tmp_path / "{}" / "worker.py")
    for seen, name in ((forked, "forked"), (execd, "execd")):
        expected = [sys.executable, console_script(), "--standalone", "--nproc-per-node", "2"]
        assert seen["cmdline"] == [*expected, "--no-live", script.format(name)], seen
        assert seen["cwd"] == str(tmp_path)
    forked["cmdline"] = execd["cmdline"] = None
    assert forked == execd
    for f_env, e_env in zip(forked_env, execd_env, strict=True):
        keys = {*f_env, *e_env}
        assert not {k: (f_env.get(k), e_env.get(k)) for k in keys if f_env.get(k) != e_env.get(k)}
    assert forked_kinds == execd_kinds and "succeeded" in forked_kinds, (fa.stderr, ea.stderr)


def test_sigterm_ends_a_forked_agent_as_an_execd_one(
    launch: Launch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    codes = {}
    for name in _both_ways(monkeypatch):
        agent, out, _ = _job(launch, tmp_path, name)
        workers = [p.pid for p in agent.remember_descendants()]
        agent.proc.send_signal(signal.SIGTERM)
        codes[name] = agent.wait(RUN)
        wait_until(lambda pids=workers: no_process_left(pids), 30)
    assert codes["forked"] == codes["execd"], codes


def _version(env: dict[str, str]) -> forked_agents.AgentProcess:
    proc = start_agent(["--version"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert proc.wait(RUN) == 0
    return proc


def test_start_up_variables_pick_the_template(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent is forked only from a template started with its start-up variables (the first
    agent of a set is exec'd); the templates of one set take turns, each with its own seed."""
    forked = [p for p in (_version(clean_env()) for _ in range(3)) if isinstance(p, ForkedAgent)]
    first, second = forked[-2:]
    seeds = {psutil.Process(p.template_pid).environ()["PYTHONHASHSEED"] for p in (first, second)}
    assert first.template_pid != second.template_pid and len(seeds) == 2
    # Room for one more template (the run's other tests may hold some already).
    monkeypatch.setattr(forked_agents, "_MAX_TEMPLATES", len(forked_agents.template_pids()) + 1)
    warned_env = clean_env({"PYTHONWARNINGS": "ignore::DeprecationWarning"})
    assert isinstance(_version(warned_env), subprocess.Popen)  # the first of its set
    warned = _version(warned_env)
    assert isinstance(warned, ForkedAgent)
    template = psutil.Process(warned.template_pid).environ()
    assert template["PYTHONWARNINGS"] == "ignore::DeprecationWarning"
    assert "PYTHONWARNINGS" not in psutil.Process(first.template_pid).environ()
    # No room for one more: exec'd.
    for _ in range(2):
        assert isinstance(_version(clean_env({"PYTHONWARNINGS": "error"})), subprocess.Popen)
    # torchrun's own variables are read at run time: they pick no other template.
    odd = _version(clean_env({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "7"}))
    assert isinstance(odd, ForkedAgent)


# Imports torch, then forked_agents.PRELOADED with every read of os.environ recorded.
_SPY = """\
import importlib, json, os, sys
import torch
read = set()
environ = type(os.environ)
for name in ("__getitem__", "__contains__"):
    def spy(self, key, _real=getattr(environ, name)):
        read.add(key)
        return _real(self, key)
    setattr(environ, name, spy)
for module in sys.argv[1:]:
    importlib.import_module(module)
print(json.dumps({"read": sorted(read), "grpc": "grpc" in sys.modules}))
"""


def test_the_preloads_read_only_start_up_variables() -> None:
    """What the template's preloads read at import is part of the key that picks a template:
    an agent with another value is never forked from it. And grpc is not among them: the CLI
    sets its fork support before grpc is imported."""
    proc = subprocess.run(
        [sys.executable, "-c", _SPY, *forked_agents.PRELOADED],
        capture_output=True,
        text=True,
        timeout=RUN,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert "LANG" in seen["read"]  # the spy sees reads (click's gettext looks up the locale)
    assert [name for name in seen["read"] if not forked_agents._startup_variable(name)] == []
    assert seen["grpc"] is False


@pytest.mark.parametrize("command", ["run", "status"])
def test_torch_s_log_level_is_the_one_the_cli_sets(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI sets TORCH_CPP_LOG_LEVEL before it imports torch (torch's C++ layer reads it
    then); a forked agent's torch was imported by its template, started with that value: an
    unreachable c10d endpoint is the same one line either way, not torch's socket errors."""
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "job"]
    conf = ["--rdzv-conf", "is_host=false,read_timeout=2"]
    args = [*rdzv, *conf]
    if command == "run":
        args = ["--nnodes", "2", *args, "--no-live", "-m", "json.tool"]
    else:
        args = ["status", *args]
    stderr = {}
    for name in _both_ways(monkeypatch):
        path = tmp_path / f"{name}.stderr"
        with path.open("wb") as err:
            proc = start_agent(args, env=clean_env(), stdout=subprocess.DEVNULL, stderr=err)
        assert isinstance(proc, ForkedAgent) == (name == "forked")
        assert proc.wait(RUN) == 4, path.read_text()
        stderr[name] = path.read_text()
    assert len(stderr["forked"].splitlines()) == 1, stderr
    assert stderr["forked"] == stderr["execd"]


def test_a_forked_agent_waits_and_dies_as_a_popen(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    worker = tmp_path / "worker.py"
    worker.write_text("import time\ntime.sleep(600)\n")
    with log.open("wb") as out:
        proc = start_agent(
            ["--standalone", "--nproc-per-node", "1", "--no-live", str(worker)],
            env=clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    assert isinstance(proc, ForkedAgent)
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.1)
    proc.kill()
    assert proc.wait(RUN) == -signal.SIGKILL and proc.returncode == -signal.SIGKILL
    assert not is_alive(proc.pid)
    proc.kill()  # a no-op once it is gone
