"""Bad input through the real ``elastic-run`` command: one ``Error:`` line, exit 2, nothing started.

Every case runs the console script in a subprocess (the ``launch`` fixture, cwd = the test's
temporary directory) with ``--log-dir`` pointing into that directory, and checks: exit code 2,
exactly one line on stderr and it starts with ``Error:``, nothing on stdout, no traceback, no
worker ran (the marker file a worker would touch is absent), no log directory was made. The
autouse ``no_leaked_processes`` fixture fails a case that left any process behind. A few cases
show that the checks let good input through: a module and a program found where the workers
will look, and a run id made safe for its log path.
"""

from __future__ import annotations

from pathlib import Path

import cli_harness
import pytest
from cli_harness import Agent, Launch, script

launch = cli_harness.launch

pytestmark = pytest.mark.timeout(120)

BAD_EXIT = 60.0  # deadline of a run refused at parse time (no torch import on this path)
RUN = 90.0  # deadline of one small real job (torch imports on a loaded 2-core machine)
HUGE = "99999999999999999999999"
TOUCH = script("touch.py")


def _files(cwd: Path) -> None:
    """What the cases need in the agent's directory: programs and packages of every kind."""
    plain = cwd / "plain.sh"
    plain.write_text('#!/bin/sh\ntouch "$MARKER"\n')
    plain.chmod(0o644)
    (cwd / "lib_pkg").mkdir()
    (cwd / "lib_pkg" / "__init__.py").write_text("")
    (cwd / "broken_pkg").mkdir()
    (cwd / "broken_pkg" / "__init__.py").write_text("raise RuntimeError('broken\\npackage')\n")
    (cwd / "a_module.py").write_text("")


# name -> (arguments, extra environment); each ends in SCRIPT unless it is about SCRIPT.
CASES: dict[str, tuple[list[str], dict[str, str]]] = {
    # --rdzv-conf values whose meaning is known
    "keep_alive_interval nan": (["--standalone", "--rdzv-conf", "keep_alive_interval=nan"], {}),
    "keep_alive_interval inf": (["--standalone", "--rdzv-conf", "keep_alive_interval=inf"], {}),
    "join_timeout -inf": (["--standalone", "--rdzv-conf", "join_timeout=-inf"], {}),
    "read_timeout 1e300": (["--standalone", "--rdzv-conf", "read_timeout=1e300"], {}),
    # `timeout` itself is not read by c10d (torch's rule): its older name is tested on static.
    "join_timeout past a year": (["--standalone", "--rdzv-conf", "join_timeout=31536001"], {}),
    "static timeout past a year": (["--rdzv-conf", "timeout=31536001"], {}),
    "heartbeat_timeout 0": (["--standalone", "--rdzv-conf", "heartbeat_timeout=0"], {}),
    "close_timeout text": (["--standalone", "--rdzv-conf", "close_timeout=soon"], {}),
    "last_call_timeout -1": (["--standalone", "--rdzv-conf", "last_call_timeout=-1"], {}),
    "keep_alive_max_attempt 0": (["--standalone", "--rdzv-conf", "keep_alive_max_attempt=0"], {}),
    "keep_alive_max_attempt huge": (
        ["--standalone", "--rdzv-conf", f"keep_alive_max_attempt={HUGE}"],
        {},
    ),
    "is_host maybe": (["--standalone", "--rdzv-conf", "is_host=maybe"], {}),
    "use_libuv 2": (["--standalone", "--rdzv-conf", "use_libuv=2"], {}),
    "store_type redis": (["--standalone", "--rdzv-conf", "store_type=redis"], {}),
    "protocol ftp": (
        ["--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-conf", "protocol=ftp"],
        {},
    ),
    # node and worker counts
    "nnodes huge": (["--nnodes", HUGE], {}),
    "nnodes max huge": (
        ["--rdzv-backend", "c10d", "--rdzv-endpoint", "x:1", "--nnodes", f"1:{HUGE}"],
        {},
    ),
    "nnodes 5000 digits": (["--nnodes", "9" * 5000], {}),
    "nproc 100000000": (["--nproc-per-node", "100000000"], {}),
    "nproc huge": (["--nproc-per-node", HUGE], {}),
    "elastic-min 0": (["--elastic-min", "0"], {}),
    # float flags and the environment's shutdown timeout
    "monitor-interval nan": (["--monitor-interval", "nan"], {}),
    "monitor-interval inf": (["--monitor-interval", "inf"], {}),
    "monitor-interval 0": (["--monitor-interval", "0"], {}),
    "shutdown-timeout nan": (["--shutdown-timeout", "nan"], {}),
    "shutdown-timeout -1": (["--shutdown-timeout", "-1"], {}),
    "health-check-timeout -inf": (["--health-check-timeout", "-inf"], {}),
    "exit-barrier-timeout 1e300": (["--exit-barrier-timeout", "1e300"], {}),
    "script-exit-timeout nan": (["--script-exit-timeout", "nan"], {}),
    "script-exit-timeout -5": (["--script-exit-timeout", "-5"], {}),
    "script-exit-timeout text": (["--script-exit-timeout", "soon"], {}),
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT nan": ([], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "nan"}),
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT text": ([], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "soon"}),
    "PET_MONITOR_INTERVAL nan": ([], {"PET_MONITOR_INTERVAL": "nan"}),
    # every setting's variable is read by the same parser as its flag
    "PET_MAX_RESTARTS text": ([], {"PET_MAX_RESTARTS": "many"}),
    "PET_NNODES huge": ([], {"PET_NNODES": HUGE}),
    "PET_NPROC_PER_NODE 0": ([], {"PET_NPROC_PER_NODE": "0"}),
    "PET_STANDALONE maybe": ([], {"PET_STANDALONE": "maybe"}),
    "PET_EXIT_BARRIER_TIMEOUT -1": ([], {"PET_EXIT_BARRIER_TIMEOUT": "-1"}),
    "PET_HEALTH_CHECK_PORT 65536": ([], {"PET_HEALTH_CHECK_PORT": "65536"}),
    "TORCHELASTIC_HEALTH_CHECK_PORT text": ([], {"TORCHELASTIC_HEALTH_CHECK_PORT": "http"}),
    "hang-timeout 1e300": (["--hang-timeout", "1e300"], {}),
    "straggler-factor inf": (["--straggler-factor", "inf"], {}),
    "straggler-factor huge": (["--straggler-factor", HUGE], {}),
    "start-method thread": (["--start-method", "thread"], {}),
    # integer flags
    "max-restarts huge": (["--max-restarts", HUGE], {}),
    "max-restarts 10001": (["--max-restarts", "10001"], {}),
    "node-rank huge": (["--node-rank", HUGE], {}),
    "node-rank past nnodes": (["--nnodes", "2", "--node-rank", "2"], {}),
    "master-port huge": (["--master-port", HUGE], {}),
    "health-check-port 65536": (["--health-check-port", "65536"], {}),
    "TORCHELASTIC_HEALTH_CHECK_PORT huge": ([], {"TORCHELASTIC_HEALTH_CHECK_PORT": HUGE}),
    # a Slurm allocation's node list (python-hostlist behind our errors)
    "SLURM_JOB_NODELIST too many hosts": (
        [],
        {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": f"n[1-{HUGE}]"},
    ),
    "SLURM_JOB_NODELIST unbalanced": (
        [],
        {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2"},
    ),
    "endpoint port superscript": (
        ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:\u00b2"],
        {},
    ),
    "redirects superscript rank": (["--redirects", "\u00b2:1"], {}),
    "local-ranks-filter huge": (["--local-ranks-filter", HUGE], {}),
    "etcd TLS file not PEM": (
        [
            "--rdzv-backend",
            "etcd",
            "--rdzv-endpoint",
            "127.0.0.1:9",
            "--rdzv-conf",
            "protocol=https,ca_cert=plain.sh",
        ],
        {},
    ),
    # run ids
    "empty run id": (["--rdzv-backend", "c10d", "--rdzv-endpoint", "x:1", "--rdzv-id", ""], {}),
    "blank run id": (["--rdzv-id", "  "], {}),
    # what the workers run
    "no-python not executable": (["--no-python", "./plain.sh"], {}),
    "no-python not on PATH": (["--no-python", "plain.sh"], {}),
    "no-python missing": (["--no-python", "./no-such-program"], {}),
    "module missing": (["-m", "no_such_module_here"], {}),
    "module in a package missing": (["-m", "lib_pkg.no_such"], {}),
    "module is a package without __main__": (["-m", "lib_pkg"], {}),
    "module whose package fails": (["-m", "broken_pkg.train"], {}),
    "module named as a file": (["-m", "a_module.py"], {}),
    "module name with a slash": (["-m", "dir/train"], {}),
    # what click rejects itself
    "click: not an int": (["--max-restarts", "many"], {}),
    "click: not a float": (["--monitor-interval", "soon"], {}),
    "click: unknown option": (["--no-such-flag"], {}),
}

_ABOUT_SCRIPT = {name for name in CASES if "module" in name or "no-python" in name}


def _assert_refused(agent: Agent, marker: Path, log_dir: Path) -> None:
    code = agent.wait(BAD_EXIT)
    lines = agent.stderr.splitlines()
    assert code == 2, agent.describe()
    assert len(lines) == 1, agent.describe()
    assert lines[0].startswith("Error: "), agent.describe()
    assert agent.stdout == "", agent.describe()
    assert "Traceback" not in agent.stderr
    assert not marker.exists(), "a worker ran"
    assert not log_dir.exists(), "a log directory was made"


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_error_line_exit_2_and_nothing_started(
    launch: Launch, tmp_path: Path, case: str
) -> None:
    _files(tmp_path)
    args, env = CASES[case]
    log_dir = tmp_path / "logs"
    marker = tmp_path / "worker-ran"
    tail = [] if case in _ABOUT_SCRIPT else [TOUCH]
    agent = launch(["--log-dir", str(log_dir), *args, *tail], env={"MARKER": str(marker), **env})
    _assert_refused(agent, marker, log_dir)


@pytest.mark.parametrize(
    "args",
    [
        ["--rdzv-conf", "keep_alive_interval=nan"],
        ["--rdzv-conf", "read_timeout=1e300"],
        ["--nnodes", HUGE],
        ["--rdzv-id", " "],
        ["--rdzv-conf", "oops"],
    ],
    ids=["conf nan", "conf 1e300", "nnodes huge", "blank id", "conf malformed"],
)
@pytest.mark.parametrize("command", ["status", "close"])
def test_status_and_close_refuse_bad_input_the_same_way(
    launch: Launch, tmp_path: Path, command: str, args: list[str]
) -> None:
    agent = launch(
        [command, "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id", "job", *args],
        name=f"{command}-bad",
    )
    _assert_refused(agent, tmp_path / "worker-ran", tmp_path / "logs")


# -- good input still runs ----------------------------------------------------------------


def test_a_module_in_the_current_directory_runs(launch: Launch, tmp_path: Path) -> None:
    (tmp_path / "touch_mod").mkdir()
    (tmp_path / "touch_mod" / "__init__.py").write_text("")
    (tmp_path / "touch_mod" / "go.py").write_text(Path(TOUCH).read_text())
    marker = tmp_path / "worker-ran"
    agent = launch(["--standalone", "-m", "touch_mod.go"], env={"MARKER": str(marker)})
    assert agent.wait(RUN) == 0, agent.describe()
    assert marker.exists()


def test_an_executable_program_runs_with_no_python(launch: Launch, tmp_path: Path) -> None:
    program = tmp_path / "touch.sh"
    program.write_text('#!/bin/sh\ntouch "$MARKER"\n')
    program.chmod(0o755)
    marker = tmp_path / "worker-ran"
    agent = launch(["--standalone", "--no-python", "./touch.sh"], env={"MARKER": str(marker)})
    assert agent.wait(RUN) == 0, agent.describe()
    assert marker.exists()


def test_an_unsafe_run_id_is_made_safe_once_and_used_for_the_log_path(
    launch: Launch, tmp_path: Path
) -> None:
    log_dir = tmp_path / "deep" / "logs"
    marker = tmp_path / "worker-ran"
    agent = launch(
        [
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "127.0.0.1:0",
            "--rdzv-id",
            "../../escape/job \x01 1",
            "--log-dir",
            str(log_dir),
            "--no-live",
            TOUCH,
        ],
        env={"MARKER": str(marker)},
    )
    assert agent.wait(RUN) == 0, agent.describe()
    assert marker.exists()
    (run_dir,) = log_dir.iterdir()  # <run id>_<random>, as torchrun names it
    assert run_dir.name.rpartition("_")[0] == ".._.._escape_job___1"
    assert not (tmp_path / "escape").exists() and not (tmp_path / "deep" / "escape").exists()
    notices = [line for line in agent.stderr.splitlines() if "not safe in a file path" in line]
    assert len(notices) == 1, agent.describe()
    assert "'.._.._escape_job___1'" in notices[0]
