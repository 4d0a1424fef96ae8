"""End to end through the real ``elastic-run`` command, one node: bad input, the env contract,
gloo all-reduce, restarts, failure summaries, signals, orphans, logs.

Every agent runs in a subprocess started by the ``launch`` fixture (cli_harness.py), which kills
whatever is left on teardown. Waits poll for an event with a deadline; nothing is timed.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import cli_harness
import pytest
from cli_harness import (
    Agent,
    Launch,
    clean_env,
    only_run_dir,
    read_events,
    read_pid_file,
    script,
)

from tests.forked_agents import cli_command
from tests.helpers import is_alive, no_process_left, wait_until

launch = cli_harness.launch

pytestmark = pytest.mark.timeout(120)

RUN = 60.0  # deadline of one small job (torch imports on a loaded 2-core machine)


def _results(agent: Agent) -> list[dict[str, object]]:
    return [json.loads(m) for m in re.findall(r"RESULT (\{.*\})", agent.stdout)]


# -- bad input ----------------------------------------------------------------------------


def _bad_input_cases(tmp: Path) -> dict[str, list[str]]:
    touch = script("touch.py")
    not_a_dir = tmp / "plain-file"
    not_a_dir.write_text("")
    return {
        "unknown flag": ["--no-such-flag", touch],
        "nnodes 0": ["--nnodes", "0", touch],
        "nnodes 4:2": ["--nnodes", "4:2", touch],
        "nnodes a:b": ["--nnodes", "a:b", touch],
        "nproc 0": ["--nproc-per-node", "0", touch],
        "nproc -1": ["--nproc-per-node", "-1", touch],
        "missing script": [str(tmp / "no-such-script.py")],
        "module and no-python": ["-m", "--no-python", touch],
        "negative max-restarts": ["--max-restarts", "-1", touch],
        "malformed redirects": ["--redirects", "7", touch],
        "preload not a module name": ["--preload", "a-b", touch],
        "malformed redirects map": ["--redirects", "0:x,1", touch],
        "malformed rdzv-conf": ["--rdzv-conf", "timeout", touch],
        "master port out of range": ["--master-port", "70000", touch],
        "health port out of range": ["--health-check-port", "-5", touch],
        "endpoint port out of range": [
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "localhost:99999",
            touch,
        ],
        "unwritable log-dir": ["--log-dir", str(not_a_dir / "logs"), touch],
    }


_BAD_INPUT_NAMES = [
    "unknown flag",
    "nnodes 0",
    "nnodes 4:2",
    "nnodes a:b",
    "nproc 0",
    "nproc -1",
    "missing script",
    "module and no-python",
    "negative max-restarts",
    "malformed redirects",
    "malformed redirects map",
    "malformed rdzv-conf",
    "master port out of range",
    "health port out of range",
    "endpoint port out of range",
    "unwritable log-dir",
    "preload not a module name",
]


@pytest.mark.parametrize("case", _BAD_INPUT_NAMES)
def test_bad_input_is_one_error_line_and_exit_2(launch: Launch, tmp_path: Path, case: str) -> None:
    args = _bad_input_cases(tmp_path)[case]
    marker = tmp_path / "worker-ran"
    agent = launch(args, env={"MARKER": str(marker)})
    code = agent.wait(RUN)
    lines = agent.stderr.splitlines()
    assert code == 2, agent.describe()
    assert len(lines) == 1, agent.describe()
    assert lines[0].startswith("Error: "), agent.describe()
    assert "Traceback" not in agent.stderr + agent.stdout
    assert not marker.exists(), "a worker was started"
    assert not (tmp_path / "plain-file" / "logs").exists()


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"]], ids=["help", "run-help"])
def test_help_answers_without_importing_torch(tmp_path: Path, args: list[str]) -> None:
    probe = (
        "import sys\n"
        "from elastic_run.cli.main import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit as exc:\n"
        "    assert exc.code in (0, None), exc.code\n"
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print('TORCH-MODULES', loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
        timeout=RUN,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout
    assert "TORCH-MODULES []" in done.stdout, done.stdout[-2000:]

    real = subprocess.run(
        [*cli_command(), *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
        timeout=RUN,
        check=False,
    )
    assert real.returncode == 0, real.stderr
    assert real.stdout.startswith("Usage: elastic-run")
    if args[0] == "run":
        assert "--nproc-per-node" in real.stdout


# -- a job that works ---------------------------------------------------------------------


def test_two_gloo_workers_all_reduce_and_agree(launch: Launch) -> None:
    agent = launch(["--standalone", "--nproc-per-node", "2", script("allreduce.py")])
    assert agent.wait(RUN) == 0, agent.describe()
    results = _results(agent)
    assert sorted(r["rank"] for r in results) == [0, 1], agent.describe()
    assert {r["sum"] for r in results} == {3.0}


def test_env_contract_value_by_value(launch: Launch, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    agent = launch(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "3",
            "--role",
            "trainer",
            "--log-dir",
            str(logs),
            script("print_env.py"),
        ],
        env={"OUT_DIR": str(out)},
    )
    assert agent.wait(RUN) == 0, agent.describe()
    run_dir = only_run_dir(logs)
    envs = [json.loads((out / f"env_0_{lr}.json").read_text()) for lr in (0, 1)]
    for lr, env in enumerate(envs):
        expected = {
            "LOCAL_RANK": str(lr),
            "RANK": str(lr),
            "GROUP_RANK": "0",
            "ROLE_RANK": str(lr),
            "ROLE_NAME": "trainer",
            "LOCAL_WORLD_SIZE": "2",
            "WORLD_SIZE": "2",
            "GROUP_WORLD_SIZE": "1",
            "ROLE_WORLD_SIZE": "2",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "3",
            "TORCHELASTIC_RUN_ID": run_dir.name.rpartition("_")[0],
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_ERROR_FILE": str(run_dir / "attempt_0" / str(lr) / "error.json"),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            "OMP_NUM_THREADS": "1",
        }
        assert {k: env[k] for k in expected} == expected
        assert env["MASTER_ADDR"]
        assert 0 < int(env["MASTER_PORT"]) < 65536
    assert envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"]
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]


def test_env_keeps_the_users_omp_num_threads(launch: Launch, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    agent = launch(
        ["--standalone", script("print_env.py")],
        env={"OUT_DIR": str(out), "OMP_NUM_THREADS": "3"},
    )
    assert agent.wait(RUN) == 0, agent.describe()
    assert json.loads((out / "env_0_0.json").read_text())["OMP_NUM_THREADS"] == "3"


# -- failures and restarts ----------------------------------------------------------------


def test_worker_failing_once_is_restarted_and_the_run_succeeds(
    launch: Launch, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    agent = launch(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "2", script("print_env.py")],
        env={"OUT_DIR": str(out), "FAIL_ATTEMPTS": "1"},
    )
    assert agent.wait(RUN) == 0, agent.describe()
    again = [json.loads((out / f"env_1_{lr}.json").read_text()) for lr in (0, 1)]
    assert [env["TORCHELASTIC_RESTART_COUNT"] for env in again] == ["1", "1"]
    assert not (out / "env_2_0.json").exists()


@pytest.mark.parametrize("decorator", ["ours", "torch"])
def test_restarts_used_up_give_the_summary_and_exit_1(launch: Launch, decorator: str) -> None:
    agent = launch(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            script("fail_record.py"),
            decorator,
        ]
    )
    assert agent.wait(RUN) == 1, agent.describe()
    stderr = agent.stderr
    summary = stderr[stderr.rindex("' failed: ") :]
    failed = re.match(r"' failed: (\d+) worker\(s\) failed", summary)
    assert failed is not None, agent.describe()
    # Rank 0 succeeds, but may still be exiting when rank 1's failure stops it: then its signal
    # exit is a failure too, as in torchrun's summary (torch's SubprocessContext counts it).
    assert failed.group(1) in ("1", "2"), agent.describe()
    if failed.group(1) == "2":
        assert re.search(r"SIG(TERM|KILL)", summary), agent.describe()
    assert re.search(r"root cause: rank 1\b", summary), agent.describe()
    assert re.search(r"exit\s+exit code 1\b", summary), agent.describe()
    # the message as read from the error file, not just the worker's own traceback
    assert re.search(r"error\s+ValueError: boom from rank 1", summary), agent.describe()
    assert "Traceback" in summary


# -- signals and orphans ------------------------------------------------------------------


def _start_hanging_job(launch: Launch, tmp_path: Path, *extra: str) -> tuple[Agent, list[int]]:
    out = tmp_path / "out"
    out.mkdir()
    agent = launch(
        ["--standalone", "--nproc-per-node", "2", script("hang.py"), *extra],
        env={"OUT_DIR": str(out)},
    )
    names = ["worker_0", "worker_1"]
    if "--fork" in extra:
        names += ["grandchild_0", "grandchild_1"]
    wait_until(
        lambda: all((out / n).exists() for n in names) or agent.proc.poll() is not None,
        RUN,
        message=agent.describe,
    )
    assert agent.proc.poll() is None, agent.describe()
    pids = [read_pid_file(out / n) for n in names]
    agent.known_pids.update(pids)
    assert all(is_alive(pid) for pid in pids)
    return agent, pids


def test_sigterm_stops_every_worker_and_exits_143(launch: Launch, tmp_path: Path) -> None:
    agent, pids = _start_hanging_job(launch, tmp_path)
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(RUN) == 128 + signal.SIGTERM, agent.describe()
    assert no_process_left(pids)


def test_sigkill_of_the_agent_leaves_no_worker_nor_grandchild(
    launch: Launch, tmp_path: Path
) -> None:
    agent, pids = _start_hanging_job(launch, tmp_path, "--fork")
    agent.proc.kill()
    agent.proc.wait(timeout=RUN)
    # The guardian sees its pipe's EOF, then scans /proc: give it the time a loaded machine takes.
    wait_until(
        lambda: no_process_left(pids),
        30,
        message=lambda: f"still alive: {[p for p in pids if is_alive(p)]}",
    )


# -- concurrency and repeated restarts ----------------------------------------------------


@pytest.mark.timeout(240)
def test_two_standalone_jobs_at_once_both_succeed(launch: Launch) -> None:
    args = ["--standalone", "--nproc-per-node", "2", script("allreduce.py")]
    first, second = launch(args, name="first"), launch(args, name="second")
    for agent in (first, second):
        assert agent.wait(RUN * 2) == 0, agent.describe()
        assert sorted(r["sum"] for r in _results(agent)) == [3.0, 3.0], agent.describe()


@pytest.mark.timeout(240)
def test_gloo_job_restarts_ten_times_in_a_row(launch: Launch) -> None:
    agent = launch(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "10", script("allreduce.py")],
        env={"FAIL_ATTEMPTS": "10"},
    )
    assert agent.wait(200) == 0, agent.describe()
    results = _results(agent)
    assert sorted({int(r["restart"]) for r in results}) == list(range(11)), agent.describe()
    assert len(results) == 22
    assert {r["sum"] for r in results} == {3.0}


# -- logs ---------------------------------------------------------------------------------


def test_log_dir_layout_with_redirects(launch: Launch, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    agent = launch(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--redirects",
            "3",
            "--log-dir",
            str(logs),
            script("talk.py"),
        ]
    )
    assert agent.wait(RUN) == 0, agent.describe()
    run_dir = only_run_dir(logs)
    for lr in (0, 1):
        rank_dir = run_dir / "attempt_0" / str(lr)
        assert (rank_dir / "stdout.log").read_text() == f"out-line from local rank {lr}\n"
        assert (rank_dir / "stderr.log").read_text() == f"err-line from local rank {lr}\n"
    assert "out-line" not in agent.stdout + agent.stderr
    assert "err-line" not in agent.stdout + agent.stderr
    events = read_events(run_dir)
    assert events, "events.jsonl is empty"
    assert all(isinstance(e["kind"], str) for e in events)
    kinds = [e["kind"] for e in events]
    assert "workers.started" in kinds


def test_tee_prefixes_and_local_ranks_filter(launch: Launch, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    agent = launch(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--tee",
            "3",
            "--local-ranks-filter",
            "0",
            "--log-dir",
            str(logs),
            script("talk.py"),
        ]
    )
    assert agent.wait(RUN) == 0, agent.describe()
    assert "[default0]:out-line from local rank 0" in agent.stdout, agent.describe()
    assert "[default0]:err-line from local rank 0" in agent.stderr, agent.describe()
    assert "local rank 1" not in agent.stdout + agent.stderr
    run_dir = only_run_dir(logs)
    for lr in (0, 1):
        rank_dir = run_dir / "attempt_0" / str(lr)
        assert f"out-line from local rank {lr}" in (rank_dir / "stdout.log").read_text()
        assert f"err-line from local rank {lr}" in (rank_dir / "stderr.log").read_text()
