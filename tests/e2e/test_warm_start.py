"""Warm starts end to end: workers forked from the per-node zygote behave as cold ones.

The cold suite's own tests run again with ``--warm-start`` (gloo, the env contract, restarts,
torch's and our @record, SIGTERM and SIGKILL of the agent, --redirects, --tee and
--local-ranks-filter, the watchdog with both clients); a probe script compares a warm worker's
start (environment, argv, session, signals, stdio, command line) with a cold one's; and the
zygote's failure paths: the zygote SIGKILLed mid-run, a preload that raises, a preload that
starts a thread.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import cli_harness
import pytest
import test_cli_single_node as cold
import test_cli_watchdog_health as cold_watchdog
from cli_harness import Agent, Launch, script

from tests.e2e import test_hangs as hangs
from tests.helpers import REPO_ROOT, is_alive, no_process_left, run_cli, wait_until

launch = cli_harness.launch

pytestmark = pytest.mark.timeout(180)

RUN = 60.0
_COLD_WORDS = ("start cold", "warm start off")
# Values that belong to one run, not to how a worker was started.
_RUN_SPECIFIC = {
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "ELASTIC_RUN_PROGRESS_FILE",
    "ELASTIC_RUN_GUARDIAN",  # a token per agent
    "OUT_DIR",  # the test's
}


@pytest.fixture
def warm(launch: Launch) -> Iterator[Launch]:
    """``launch`` with ``--warm-start``; after the test, no agent said it started cold."""
    agents: list[Agent] = []

    def start(args: Sequence[str], **kwargs: Any) -> Agent:
        agent = launch(["--warm-start", *args], **kwargs)
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        assert not any(word in agent.stderr for word in _COLD_WORDS), agent.describe()


# -- the cold suite, warm ----------------------------------------------------------------


def test_gloo_all_reduce_warm(warm: Launch) -> None:
    cold.test_two_gloo_workers_all_reduce_and_agree(warm)


def test_env_contract_warm(warm: Launch, tmp_path: Path) -> None:
    cold.test_env_contract_value_by_value(warm, tmp_path)


def test_restart_after_a_failure_warm(warm: Launch, tmp_path: Path) -> None:
    cold.test_worker_failing_once_is_restarted_and_the_run_succeeds(warm, tmp_path)


@pytest.mark.parametrize("decorator", ["ours", "torch"])
def test_record_error_file_warm(warm: Launch, decorator: str) -> None:
    cold.test_restarts_used_up_give_the_summary_and_exit_1(warm, decorator)


def test_sigterm_warm(warm: Launch, tmp_path: Path) -> None:
    cold.test_sigterm_stops_every_worker_and_exits_143(warm, tmp_path)


def test_sigkill_of_the_agent_leaves_nothing_warm(warm: Launch, tmp_path: Path) -> None:
    cold.test_sigkill_of_the_agent_leaves_no_worker_nor_grandchild(warm, tmp_path)


def test_redirects_warm(warm: Launch, tmp_path: Path) -> None:
    cold.test_log_dir_layout_with_redirects(warm, tmp_path)


def test_tee_and_local_ranks_filter_warm(warm: Launch, tmp_path: Path) -> None:
    cold.test_tee_prefixes_and_local_ranks_filter(warm, tmp_path)


@pytest.mark.parametrize("client", ["ours", "torch"])
def test_watchdog_warm(warm: Launch, tmp_path: Path, client: str) -> None:
    cold_watchdog.test_worker_hanging_in_a_timer_is_killed_and_restarted(warm, tmp_path, client)


# -- a warm worker starts as a cold one ---------------------------------------------------


def _probe(
    launch: Launch,
    out: Path,
    *args: str,
    env: dict[str, str] | None = None,
    module: bool = False,
) -> Agent:
    """The probe's job (``-m probe_start`` with ``module``); it writes its probes to ``out``."""
    out.mkdir()
    probe = script("probe_start.py")
    target, found = [probe], {}
    if module:  # found on PYTHONPATH, as a user's module is
        target, found = ["-m", "probe_start"], {"PYTHONPATH": f"{REPO_ROOT}:{Path(probe).parent}"}
    return launch(
        ["--standalone", "--nproc-per-node", "2", *args, *target, "x", "-y"],
        env={"OUT_DIR": str(out), **found, **(env or {})},
    )


def _read(out: Path, attempt: int, local_rank: int) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((out / f"probe_{attempt}_{local_rank}.json").read_text())
    return result


def _first_probes(agent: Agent, out: Path) -> list[dict[str, Any]]:
    """Both workers' probes of the first attempt, once written (or the agent exited)."""
    wait_until(
        lambda: (
            all((out / f"probe_0_{lr}.json").exists() for lr in (0, 1))
            or agent.proc.poll() is not None
        ),
        RUN,
        message=agent.describe,
    )
    return [_read(out, 0, lr) for lr in (0, 1)]


@pytest.mark.parametrize("how", ["script", "module"])
def test_a_warm_worker_starts_as_a_cold_one(launch: Launch, tmp_path: Path, how: str) -> None:
    runs = {}
    for mode in ("--warm-start", "--no-warm-start"):
        agent = _probe(launch, tmp_path / mode, mode, module=how == "module")
        assert agent.wait(RUN) == 0, agent.describe()
        runs[mode] = [_read(tmp_path / mode, 0, lr) for lr in (0, 1)]
    for lr in (0, 1):
        warm_probe, cold_probe = runs["--warm-start"][lr], runs["--no-warm-start"][lr]
        assert warm_probe["warm"] and not cold_probe["warm"]
        for probe in (warm_probe, cold_probe):
            for key in _RUN_SPECIFIC:
                probe["env"].pop(key, None)
        assert warm_probe["env"] == cold_probe["env"]
        same = [
            "argv", "cmdline", "proc_environ_is_os_environ", "path0", "cwd", "name", "file", "main", "own_session", "own_group",
            "pdeathsig", "dispositions", "blocked", "stdin", "stdout_line_buffering",
            "stderr_line_buffering", "stdout_write_through", "threads",
        ]  # fmt: skip
        assert {k: warm_probe[k] for k in same} == {k: cold_probe[k] for k in same}
        assert warm_probe["pdeathsig"] == signal.SIGKILL
        assert warm_probe["proc_environ_is_os_environ"]
        assert warm_probe["main"]["is_this_module"] and warm_probe["main"]["annotations"]
    warm_runs = runs["--warm-start"]
    assert warm_runs[0]["random"] != warm_runs[1]["random"]  # reseeded in each worker
    assert warm_runs[0]["numpy_random"] != warm_runs[1]["numpy_random"]


# -- the zygote's failure paths -----------------------------------------------------------


def test_a_killed_zygote_is_replaced_and_the_job_restarts_warm(
    launch: Launch, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    agent = _probe(launch, out, "--warm-start", "--max-restarts", "1", env={"HANG_ATTEMPTS": "1"})
    first = _first_probes(agent, out)
    assert all(p["warm"] for p in first), agent.describe()
    zygote = first[0]["parent"]
    agent.known_pids.update([zygote, *(p["pid"] for p in first)])
    os.kill(zygote, signal.SIGKILL)
    assert agent.wait(RUN) == 0, agent.describe()
    again = [_read(out, 1, lr) for lr in (0, 1)]
    assert all(p["warm"] for p in again), agent.describe()
    assert again[0]["parent"] != zygote
    assert f"the zygote (pid {zygote}) died; starting a new one" in agent.stderr
    assert "killed by SIGKILL" in agent.stderr, agent.describe()
    assert no_process_left([zygote, *(p["pid"] for p in first)])


def _preload_job(launch: Launch, tmp_path: Path, module_text: str) -> Agent:
    (tmp_path / "zyg_preload.py").write_text(module_text)
    return _probe(
        launch,
        tmp_path / "out",
        "--warm-start",
        "--preload",
        "zyg_preload",
        env={"PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{tmp_path}"},
    )


def _one_warning(agent: Agent) -> str:
    lines = [line for line in agent.stderr.splitlines() if "warm start off" in line]
    assert len(lines) == 1, agent.describe()
    assert "Traceback" not in agent.stderr, agent.describe()
    return lines[0]


def test_a_preload_that_raises_gives_one_warning_and_a_cold_start(
    launch: Launch, tmp_path: Path
) -> None:
    agent = _preload_job(launch, tmp_path, "raise RuntimeError('no GPU here')\n")
    assert agent.wait(RUN) == 0, agent.describe()
    line = _one_warning(agent)
    assert "preloading 'zyg_preload' failed: RuntimeError: no GPU here" in line
    assert not any(_read(tmp_path / "out", 0, lr)["warm"] for lr in (0, 1))


def test_a_preload_that_starts_a_thread_is_refused(launch: Launch, tmp_path: Path) -> None:
    agent = _preload_job(
        launch,
        tmp_path,
        "import threading\n"
        "threading.Thread(target=threading.Event().wait, name='poller', daemon=True).start()\n",
    )
    assert agent.wait(RUN) == 0, agent.describe()
    line = _one_warning(agent)
    assert "a preloaded module started a Python thread (poller)" in line
    assert not any(_read(tmp_path / "out", 0, lr)["warm"] for lr in (0, 1))


def test_a_good_preload_is_imported_in_the_zygote(launch: Launch, tmp_path: Path) -> None:
    agent = _preload_job(launch, tmp_path, "import json\nVALUE = 1\n")
    assert agent.wait(RUN) == 0, agent.describe()
    assert not any(word in agent.stderr for word in _COLD_WORDS), agent.describe()
    assert all(_read(tmp_path / "out", 0, lr)["warm"] for lr in (0, 1))


def test_no_python_starts_cold_and_print_config_says_why(launch: Launch) -> None:
    agent = launch(["--standalone", "--warm-start", "--no-python", "--print-config", "true"])
    assert agent.wait(RUN) == 0, agent.describe()
    assert "--no-python: workers are programs, started cold" in agent.stdout, agent.describe()


def test_nothing_outlives_a_killed_agent_warm(launch: Launch, tmp_path: Path) -> None:
    out = tmp_path / "out"
    agent = _probe(launch, out, "--warm-start", env={"HANG_ATTEMPTS": "1"})
    probes = _first_probes(agent, out)
    assert all(p["warm"] for p in probes), agent.describe()
    agent.remember_descendants()
    everyone = sorted(agent.known_pids | {probes[0]["parent"]} | {p["pid"] for p in probes})
    agent.proc.kill()
    agent.proc.wait(timeout=RUN)
    wait_until(
        lambda: no_process_left(everyone),
        10,
        message=lambda: f"still alive: {[p for p in everyone if is_alive(p)]}",
    )


def test_a_preload_that_starts_a_native_thread_is_refused(launch: Launch, tmp_path: Path) -> None:
    # A thread that ``threading`` does not know of: only the count of /proc/self/task shows it.
    agent = _preload_job(
        launch, tmp_path, "import _thread, time\n_thread.start_new_thread(time.sleep, (600,))\n"
    )
    assert agent.wait(RUN) == 0, agent.describe()
    line = _one_warning(agent)
    assert "preloading started native threads" in line, line
    assert not any(_read(tmp_path / "out", 0, lr)["warm"] for lr in (0, 1))


def test_stacks_of_a_warm_worker_before_the_watchdog_kill(tmp_path: Path) -> None:
    """py-spy attaches to a warm worker by pid as to a cold one (the hang suite's own test)."""
    script_path = tmp_path / "watched.py"
    script_path.write_text(hangs.WATCHED)
    log_dir = tmp_path / "logs"
    proc = run_cli(
        ["--warm-start", "--standalone", "--no-live", "--watchdog", "--log-dir", str(log_dir),
         str(script_path)],
        env={"COLUMNS": "300"},
        timeout_s=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert not any(word in proc.stderr for word in _COLD_WORDS), proc.stderr
    (run_dir,) = log_dir.iterdir()
    stacks = (run_dir / "attempt_0" / "0" / "stacks.txt").read_text()
    assert "its watchdog timer expired" in stacks.splitlines()[0]
    assert f"<module> ({script_path}:4)" in stacks
    assert "stuck in Condition.wait at watched.py:4" in proc.stderr
