"""WorkerProcesses, the guardian and worker output, against real processes and real signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from elastic_run.agent.config import Std
from elastic_run.agent.workers.guardian import Guardian
from elastic_run.agent.workers.output import StreamName, set_console_sink
from elastic_run.agent.workers.processes import WorkerExit, WorkerLaunch, WorkerProcesses
from elastic_run.errors import AgentError
from tests.helpers import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]


def is_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie left for an absent init to reap counts)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Console:
    """A console sink that records what workers would print."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.blocks: list[tuple[StreamName, str]] = []

    def __call__(self, stream: StreamName, text: str) -> None:
        with self._lock:
            self.blocks.append((stream, text))

    def lines(self, stream: StreamName | None = None) -> list[str]:
        with self._lock:
            blocks = list(self.blocks)
        text = "".join(t for s, t in blocks if stream is None or s is stream)
        return text.splitlines()


@pytest.fixture
def console() -> Iterator[Console]:
    sink = Console()
    set_console_sink(sink)
    yield sink
    set_console_sink(None)


@pytest.fixture
def cleanup() -> Iterator[list[WorkerProcesses]]:
    groups: list[WorkerProcesses] = []
    yield groups
    for group in groups:
        group.close()


def launch(
    tmp_path: Path,
    body: str,
    *,
    local_rank: int = 0,
    global_rank: int | None = None,
    redirect: Std = Std.NONE,
    tee: Std = Std.NONE,
    show_on_console: bool = True,
    argv: tuple[str, ...] | None = None,
) -> WorkerLaunch:
    script = tmp_path / f"worker_{local_rank}.py"
    script.write_text(textwrap.dedent(body))
    log_dir = tmp_path / "logs" / f"attempt_0/{local_rank}"
    error_file = log_dir / "error.json"
    env = dict(os.environ)
    env.update(
        {
            "LOCAL_RANK": str(local_rank),
            "TORCHELASTIC_ERROR_FILE": str(error_file),
            "MARK_DIR": str(tmp_path),
        }
    )
    return WorkerLaunch(
        local_rank=local_rank,
        global_rank=local_rank if global_rank is None else global_rank,
        argv=argv if argv is not None else (sys.executable, "-u", str(script)),
        env=env,
        log_dir=log_dir,
        redirect=redirect,
        tee=tee,
        show_on_console=show_on_console,
        error_file=error_file,
        tee_prefix=f"[rank {local_rank if global_rank is None else global_rank}]: ",
    )


def logs(worker: WorkerLaunch) -> Path:
    assert worker.log_dir is not None
    return worker.log_dir


def start(
    launches: list[WorkerLaunch],
    cleanup: list[WorkerProcesses],
    on_exit: Callable[[], None] | None = None,
    guardian: Guardian | None = None,
) -> WorkerProcesses:
    group = WorkerProcesses(launches, on_exit=on_exit, guardian=guardian)
    cleanup.append(group)
    group.start()
    return group


def wait_exits(group: WorkerProcesses, count: int) -> dict[int, WorkerExit]:
    wait_until(lambda: len(group.poll()) == count, 30, f"{count} workers to exit")
    return group.poll()


def test_exit_codes_and_signals(
    tmp_path: Path, console: Console, cleanup: list[WorkerProcesses]
) -> None:
    launches = [
        launch(tmp_path, "import sys; sys.exit(0)", local_rank=0),
        launch(tmp_path, "import sys; sys.exit(3)", local_rank=1),
        launch(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)", local_rank=2),
    ]
    group = start(launches, cleanup)
    exits = wait_exits(group, 3)
    assert {rank: e.exitcode for rank, e in exits.items()} == {0: 0, 1: 3, 2: -signal.SIGTERM}
    assert {rank: e.pid for rank, e in exits.items()} == group.pids
    assert not group.running()


def test_on_exit_fires_for_each_exit(
    tmp_path: Path, console: Console, cleanup: list[WorkerProcesses]
) -> None:
    calls: list[int] = []
    lock = threading.Lock()

    def on_exit() -> None:
        with lock:
            calls.append(1)

    launches = [launch(tmp_path, "pass", local_rank=r) for r in range(2)]
    start(launches, cleanup, on_exit=on_exit)
    wait_until(lambda: len(calls) == 2, 30, "on_exit to fire twice")


def test_exec_failure_raises_agent_error(tmp_path: Path, console: Console) -> None:
    missing = str(tmp_path / "no-such-interpreter")
    good = launch(tmp_path, "import signal; signal.pause()", local_rank=0)
    bad = launch(tmp_path, "", local_rank=1, argv=(missing, "x.py"))
    group = WorkerProcesses([good, bad])
    with pytest.raises(AgentError, match="no-such-interpreter"):
        group.start()
    # The worker started before the failure was killed.
    assert all(is_gone(pid) for pid in group.pids.values())
    group.close()


def test_stop_escalates_to_sigkill(
    tmp_path: Path, console: Console, cleanup: list[WorkerProcesses]
) -> None:
    stubborn = """
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready")
        while True:
            signal.pause()
    """
    polite = """
        import signal
        print("ready")
        signal.pause()
    """
    launches = [
        launch(tmp_path, stubborn, local_rank=0),
        launch(tmp_path, polite, local_rank=1),
    ]
    group = start(launches, cleanup)
    # Console-only output passes through unprefixed, as under torchrun.
    wait_until(lambda: console.lines().count("ready") == 2, 30, "both ready")
    group.stop(signal.SIGTERM, 0.5)
    exits = group.poll()
    assert exits[0].exitcode == -signal.SIGKILL
    assert exits[1].exitcode == -signal.SIGTERM
    group.stop(signal.SIGTERM, 0.5)  # idempotent
    group.close()


GRANDCHILD = """
    import os, signal, subprocess, sys
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
         "while True: signal.pause()"],
        start_new_session={setsid},
    )
    mark = os.path.join(os.environ["MARK_DIR"], "grandchild.pid")
    with open(mark + ".tmp", "w") as f:
        f.write(str(child.pid))
    os.rename(mark + ".tmp", mark)
    signal.pause()
"""


def read_mark(path: Path) -> int:
    wait_until(path.exists, 30, f"{path}")
    return int(path.read_text())


@pytest.mark.parametrize("begun", [False, True], ids=["stop", "begin_stop-then-stop"])
@pytest.mark.parametrize("setsid", [True, False])
def test_stop_kills_grandchildren(
    tmp_path: Path, console: Console, cleanup: list[WorkerProcesses], setsid: bool, begun: bool
) -> None:
    group = start([launch(tmp_path, GRANDCHILD.format(setsid=setsid))], cleanup)
    grandchild = read_mark(tmp_path / "grandchild.pid")
    worker = group.pids[0]
    try:
        assert (os.getsid(grandchild) == os.getsid(worker)) is not setsid
        if begun:
            group.begin_stop(signal.SIGTERM)
            wait_until(lambda: 0 in group.poll(), 30, "the worker to exit on the first signal")
        # stop() finds the grandchild that ignores SIGTERM (after begin_stop too): SIGKILL
        group.stop(signal.SIGTERM, 0.5)
        assert group.poll()[0].exitcode == -signal.SIGTERM
        assert is_gone(worker)
        assert is_gone(grandchild)
    finally:
        if not is_gone(grandchild):
            os.kill(grandchild, signal.SIGKILL)


TERM_TRAP = """
    import os, signal, sys
    def on_term(signum, frame):
        mark = os.path.join(os.environ["MARK_DIR"], "term")
        with open(mark + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(mark + ".tmp", mark)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the stop's own SIGTERM then ends it
    signal.signal(signal.SIGTERM, on_term)
    print("ready")
    while True:
        signal.pause()
"""


def test_begin_stop_signals_at_once_and_stop_completes_it(
    tmp_path: Path, console: Console, cleanup: list[WorkerProcesses]
) -> None:
    group = start([launch(tmp_path, TERM_TRAP)], cleanup)
    wait_until(lambda: "ready" in console.lines(), 30, "ready")
    sent = group.begin_stop(signal.SIGTERM)
    assert sent is not None
    # The signal went without stop(): the worker saw it while begin_stop's caller goes on.
    wait_until((tmp_path / "term").exists, 30, "the worker to see SIGTERM")
    assert group.running()
    assert group.begin_stop(signal.SIGTERM) is None  # once
    group.stop(signal.SIGTERM, 10.0)
    assert group.poll()[0].exitcode == -signal.SIGTERM  # the stop's SIGTERM, not a SIGKILL
    assert group.begin_stop(signal.SIGTERM) is None  # nothing once stopped


FAKE_AGENT = """
    import os, signal, sys, threading
    from pathlib import Path
    from elastic_run.agent.config import Std
    from elastic_run.agent.workers.guardian import Guardian
    from elastic_run.agent.workers.processes import WorkerLaunch, WorkerProcesses

    mark_dir = Path(sys.argv[1])
    guardian = Guardian()
    guardian.start()
    env = dict(os.environ)
    env["MARK_DIR"] = str(mark_dir)
    group = WorkerProcesses([
        WorkerLaunch(
            local_rank=0, global_rank=0,
            argv=(sys.executable, "-u", str(mark_dir / "worker_0.py")),
            env=env, log_dir=None, redirect=Std.NONE, tee=Std.NONE, show_on_console=True,
            error_file=mark_dir / "error.json",
        )
    ], guardian=guardian)
    group.start()
    # Wait for the grandchild, then make sure the guardian has seen it (it may have left the
    # worker's session; the guardian notices that on its own only every half second).
    while not (mark_dir / "grandchild.pid").exists():
        threading.Event().wait(0.01)
    guardian.sync()
    (mark_dir / "agent.tmp").write_text(f"{group.pids[0]} {guardian.pid}")
    os.rename(mark_dir / "agent.tmp", mark_dir / "agent.pids")
    while True:
        signal.pause()
"""


@pytest.mark.parametrize("setsid", [False, True])
def test_sigkilled_agent_leaves_no_worker_nor_grandchild(tmp_path: Path, setsid: bool) -> None:
    (tmp_path / "worker_0.py").write_text(textwrap.dedent(GRANDCHILD.format(setsid=setsid)))
    agent_script = tmp_path / "agent.py"
    agent_script.write_text(textwrap.dedent(FAKE_AGENT))
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    agent = subprocess.Popen(
        [sys.executable, str(agent_script), str(tmp_path)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:
        grandchild = read_mark(tmp_path / "grandchild.pid")
        pids.append(grandchild)
        wait_until((tmp_path / "agent.pids").exists, 30, "the agent's pids")
        worker, guardian = (int(p) for p in (tmp_path / "agent.pids").read_text().split())
        pids += [worker, guardian]
        assert not is_gone(grandchild) and not is_gone(worker)
        agent.kill()
        agent.wait()
        wait_until(lambda: all(is_gone(p) for p in pids), 10, "worker tree and guardian to die")
    finally:
        agent.kill()
        agent.wait()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


LONE_AGENT = """
    import os, signal, sys
    from pathlib import Path
    from elastic_run.agent.workers import processes
    from elastic_run.agent.config import Std
    from elastic_run.agent.workers.processes import WorkerLaunch, WorkerProcesses

    mark_dir, how = Path(sys.argv[1]), sys.argv[2]
    if how == "preexec":
        processes.death_signal_prefix = lambda: ()  # as on a host without util-linux's setpriv
    else:
        assert processes.death_signal_prefix(), "setpriv --pdeathsig is not usable here"
    group = WorkerProcesses([  # no guardian: only the parent-death signal is left
        WorkerLaunch(
            local_rank=0, global_rank=0,
            argv=(sys.executable, "-c", "import signal; signal.pause()"),
            env=dict(os.environ), log_dir=None, redirect=Std.NONE, tee=Std.NONE,
            show_on_console=False, error_file=mark_dir / "error.json",
        )
    ])
    group.start()
    (mark_dir / "worker.tmp").write_text(str(group.pids[0]))
    os.rename(mark_dir / "worker.tmp", mark_dir / "worker.pid")
    while True:
        signal.pause()
"""


@pytest.mark.parametrize("how", ["setpriv", "preexec"])
def test_worker_dies_with_its_agent_by_the_parent_death_signal(tmp_path: Path, how: str) -> None:
    # Workers are spawned through setpriv where it exists (no fork of the whole agent) and with
    # a preexec_fn otherwise; either way a SIGKILLed agent takes its worker with it.
    agent_script = tmp_path / "agent.py"
    agent_script.write_text(textwrap.dedent(LONE_AGENT))
    agent = subprocess.Popen(
        [sys.executable, str(agent_script), str(tmp_path), how],
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        start_new_session=True,
    )
    worker = 0
    try:
        worker = read_mark(tmp_path / "worker.pid")
        wait_until(lambda: psutil.Process(worker).cmdline()[1:2] == ["-c"], 30, "the worker's exec")
        assert psutil.Process(worker).ppid() == agent.pid
        agent.kill()
        agent.wait()
        wait_until(lambda: is_gone(worker), 10, "the worker to die with its agent")
    finally:
        agent.kill()
        agent.wait()
        if worker:
            try:
                os.kill(worker, signal.SIGKILL)
            except ProcessLookupError:
                pass


SUBREAPER_AGENT = """
    import ctypes, os, signal, sys, threading
    from pathlib import Path
    import psutil
    from elastic_run.agent.config import Std
    from elastic_run.agent.workers.processes import WorkerLaunch, WorkerProcesses

    PR_SET_CHILD_SUBREAPER = 36
    assert ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    mark_dir = Path(sys.argv[1])
    env = dict(os.environ, MARK_DIR=str(mark_dir))
    group = WorkerProcesses([
        WorkerLaunch(
            local_rank=0, global_rank=0,
            argv=(sys.executable, "-u", str(mark_dir / "worker_0.py")),
            env=env, log_dir=None, redirect=Std.NONE, tee=Std.NONE, show_on_console=True,
            error_file=mark_dir / "error.json",
        )
    ])
    group.start()
    while not (mark_dir / "grandchild.pid").exists():
        threading.Event().wait(0.01)
    group.stop(signal.SIGTERM, 0.5)
    print("children left:", len(psutil.Process().children()))
"""


def test_subreaper_agent_reaps_adopted_grandchildren(tmp_path: Path) -> None:
    (tmp_path / "worker_0.py").write_text(textwrap.dedent(GRANDCHILD.format(setsid=True)))
    agent_script = tmp_path / "agent.py"
    agent_script.write_text(textwrap.dedent(SUBREAPER_AGENT))
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run(
        [sys.executable, str(agent_script), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    assert is_gone(grandchild)
    assert result.returncode == 0, result.stderr
    assert "children left: 0" in result.stdout


def test_guardian_kills_registered_sessions_on_close(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True
    )
    other = subprocess.Popen(
        [sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True
    )
    guardian = Guardian()
    try:
        guardian.start()
        guardian.register(sleeper.pid)
        guardian.register(other.pid)
        guardian.unregister(other.pid)
        guardian.close()
        assert not guardian.is_running()
        assert sleeper.wait(10) == -signal.SIGKILL
        assert other.poll() is None
    finally:
        guardian.close()
        for proc in (sleeper, other):
            proc.kill()
            proc.wait()
    with pytest.raises(AgentError):
        guardian.register(1)


# Each line is one write (``print`` makes two under ``-u``: the text, then the newline). A
# worker descheduled between the two for longer than the console's partial-line wait has its
# text shown as a partial line, and another worker's line glued to it, as on a terminal.
PRINTER = """
    import sys
    for i in range({n}):
        sys.stdout.write(f"out {{i}}\\n")
        sys.stderr.write(f"err {{i}}\\n")
"""


def test_redirect_tee_and_console(
    tmp_path: Path, console: Console, cleanup: list[WorkerProcesses]
) -> None:
    n = 300
    body = PRINTER.format(n=n)
    launches = [
        launch(tmp_path, body, local_rank=0, global_rank=4, redirect=Std.ALL),
        launch(tmp_path, body, local_rank=1, global_rank=5, tee=Std.ALL),
        launch(tmp_path, body, local_rank=2, global_rank=6),
        launch(tmp_path, body, local_rank=3, global_rank=7, redirect=Std.OUT, tee=Std.ERR),
    ]
    group = start(launches, cleanup)
    assert all(e.exitcode == 0 for e in wait_exits(group, 4).values())
    group.stop(signal.SIGTERM, 5)
    expected_out = [f"out {i}" for i in range(n)]
    expected_err = [f"err {i}" for i in range(n)]

    def file_lines(rank: int, name: str) -> list[str]:
        return (logs(launches[rank]) / f"{name}.log").read_text().splitlines()

    def console_lines(rank: int, stream: StreamName) -> list[str]:
        if rank == 6:  # neither redirected nor teed: passes through unprefixed
            return [line for line in console.lines(stream) if not line.startswith("[")]
        prefix = f"[rank {rank}]: "  # a teed stream: the launch's tee prefix
        return [line[len(prefix) :] for line in console.lines(stream) if line.startswith(prefix)]

    # rank 4: redirected, files only.
    assert file_lines(0, "stdout") == expected_out
    assert file_lines(0, "stderr") == expected_err
    assert console_lines(4, StreamName.STDOUT) == []
    assert console_lines(4, StreamName.STDERR) == []
    # rank 5: teed, files and console.
    assert file_lines(1, "stdout") == expected_out
    assert file_lines(1, "stderr") == expected_err
    assert console_lines(5, StreamName.STDOUT) == expected_out
    assert console_lines(5, StreamName.STDERR) == expected_err
    # rank 6: neither, console only and no files.
    assert not (logs(launches[2]) / "stdout.log").exists()
    assert not (logs(launches[2]) / "stderr.log").exists()
    assert console_lines(6, StreamName.STDOUT) == expected_out
    assert console_lines(6, StreamName.STDERR) == expected_err
    # rank 7: stdout redirected, stderr teed.
    assert file_lines(3, "stdout") == expected_out
    assert file_lines(3, "stderr") == expected_err
    assert console_lines(7, StreamName.STDOUT) == []
    assert console_lines(7, StreamName.STDERR) == expected_err
    # Every console line is whole and prefixed: nothing interleaved mid-line.
    pattern = re.compile(r"^(\[rank [57]\]: )?(out|err) \d+$")
    assert all(pattern.match(line) for line in console.lines())


def test_local_ranks_filter_hides_console_keeps_files(
    tmp_path: Path, console: Console, cleanup: list[WorkerProcesses]
) -> None:
    body = PRINTER.format(n=50)
    launches = [
        launch(tmp_path, body, local_rank=0, tee=Std.ALL, show_on_console=False),
        launch(tmp_path, body, local_rank=1, show_on_console=False),
        launch(tmp_path, body, local_rank=2, show_on_console=True),
    ]
    group = start(launches, cleanup)
    wait_exits(group, 3)
    group.stop(signal.SIGTERM, 5)
    assert (logs(launches[0]) / "stdout.log").read_text().splitlines() == [
        f"out {i}" for i in range(50)
    ]
    assert not (logs(launches[1]) / "stdout.log").exists()
    # Only rank 2 (console only, unprefixed) reaches the console.
    assert sorted(console.lines()) == sorted(
        [f"out {i}" for i in range(50)] + [f"err {i}" for i in range(50)]
    )


FLOOD = """
    import os, signal, sys
    for i in range(10000):
        sys.stdout.write(f"line {i}\\n")  # one write per line, as PRINTER
    mark = os.path.join(os.environ["MARK_DIR"], f"done_{os.environ['LOCAL_RANK']}")
    open(mark, "w").close()
    signal.pause()
"""


def test_killed_worker_output_is_complete(
    tmp_path: Path, console: Console, cleanup: list[WorkerProcesses]
) -> None:
    launches = [
        launch(tmp_path, FLOOD, local_rank=0, redirect=Std.OUT),
        launch(tmp_path, FLOOD, local_rank=1, tee=Std.OUT),
        launch(tmp_path, FLOOD, local_rank=2),
    ]
    group = start(launches, cleanup)
    for rank in range(3):
        wait_until((tmp_path / f"done_{rank}").exists, 60, f"worker {rank} to print")
    group.stop(signal.SIGKILL, 0)
    expected = [f"line {i}" for i in range(10000)]
    for rank in (0, 1):
        path = logs(launches[rank]) / "stdout.log"
        assert path.read_text().splitlines() == expected
    teed = [line[len("[rank 1]: ") :] for line in console.lines() if line.startswith("[rank 1]: ")]
    plain = [line for line in console.lines() if not line.startswith("[")]
    assert teed == expected
    assert plain == expected
    assert all(e.exitcode == -signal.SIGKILL for e in group.poll().values())


PARTIAL = """
    import os, sys, time
    sys.stdout.write("progress 50%")
    sys.stdout.flush()
    mark = os.path.join(os.environ["MARK_DIR"], "go")
    while not os.path.exists(mark):
        time.sleep(0.01)
    print(" done")
    print("two\\nlines")
"""


def test_console_only_output_is_unchanged_and_a_partial_line_shows_without_its_newline(
    tmp_path: Path, console: Console, cleanup: list[WorkerProcesses]
) -> None:
    group = start([launch(tmp_path, PARTIAL, local_rank=0)], cleanup)
    wait_until(lambda: console.lines() == ["progress 50%"], 30, "the partial line")
    (tmp_path / "go").touch()
    wait_exits(group, 1)
    group.stop(signal.SIGTERM, 5)
    assert "".join(text for _, text in console.blocks) == "progress 50% done\ntwo\nlines\n"


LONG = """
    import json, sys
    line = json.dumps(["é€𝄞" * 7 + str(i) for i in range(9000)], ensure_ascii=False)
    sys.stdout.write(line + "\\n")
    sys.stdout.write(line[:70001])  # a last line without its newline, cut inside a character
"""


def test_a_console_only_line_longer_than_the_pipe_reads_is_passed_on_as_written(
    tmp_path: Path, console: Console, cleanup: list[WorkerProcesses]
) -> None:
    group = start([launch(tmp_path, LONG, local_rank=0)], cleanup)
    wait_exits(group, 1)
    group.stop(signal.SIGTERM, 5)
    line = json.dumps(["é€𝄞" * 7 + str(i) for i in range(9000)], ensure_ascii=False)
    assert len(line.encode()) > 8 * 65536
    text = "".join(text for _, text in console.blocks)
    assert text == line + "\n" + line[:70001]
    assert json.loads(text.splitlines()[0]) == json.loads(line)
