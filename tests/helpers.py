"""What tests share: waiting for a condition, free ports, process accounting, the CLI.

``wait_until`` is the one place in the tests that sleeps between polls: every wait for another
thread or process goes through it, and it raises when the condition does not come true in time.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "REPO_ROOT",
    "agent_env",
    "ProcessTable",
    "alive_descendants",
    "free_port",
    "freeze",
    "is_alive",
    "no_process_left",
    "run_cli",
    "WaitTimeout",
    "wait_until",
]

REPO_ROOT = Path(__file__).resolve().parent.parent


class WaitTimeout(AssertionError):
    """A :func:`wait_until` whose condition never held in time (a test failure)."""


def wait_until(
    predicate: Callable[[], object],
    timeout_s: float,
    what: str | Callable[[], str] = "condition not met",
    *,
    interval_s: float = 0.02,
    message: str | Callable[[], str] | None = None,
) -> None:
    """Poll ``predicate`` until it returns a truthy value: the one wait of the test suite.

    Args:
        predicate: checked first at once, then every ``interval_s``.
        timeout_s: how long to wait in all.
        what: what is awaited, for the failure text, or a callable that builds it (to show the
            state at the deadline, e.g. a server's log).
        interval_s: the pause between two checks.
        message: the same as ``what`` (its keyword name in older call sites).

    Raises:
        WaitTimeout: ``predicate`` stayed falsy for ``timeout_s`` seconds (an AssertionError).
    """
    said = message if message is not None else what
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return
        if time.monotonic() >= deadline:
            text = said() if callable(said) else said
            raise WaitTimeout(f"timed out after {timeout_s} s: {text}")
        time.sleep(interval_s)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    Returns:
        The port number. Another process may take it before the caller binds it: prefer port 0
        where the server reports the port it got.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_port_pair() -> int:
    """A port on 127.0.0.1 that was free a moment ago with the next one free too.

    For an embedded etcd member, whose peer port is its client port + 1.

    Returns:
        The lower port of the pair (the same race as :func:`free_port`).
    """
    while True:
        port = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port


def is_alive(pid: int) -> bool:
    """Whether ``pid`` names a running process (a zombie counts as gone).

    Args:
        pid: the process id.

    Returns:
        True while the process exists and is not a zombie.
    """
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stat_fields(path: str) -> list[bytes] | None:
    """The fields of a ``/proc`` stat file after the command name (state first), or None when
    the process or thread is gone. The name may hold spaces and parentheses: the fields follow
    its last ")"."""
    try:
        with open(path, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped by a signal (state ``T`` in its stat)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False  # the process is gone
    states = [f[0] for t in tasks if (f := _stat_fields(f"/proc/{pid}/task/{t}/stat"))]
    return bool(states) and all(state == b"T" for state in states)


def freeze(pid: int, timeout_s: float = 30.0) -> None:
    """SIGSTOP ``pid`` and wait until every one of its threads has stopped.

    A group stop is not instant: the kernel wakes one thread to take the signal, and on a busy
    machine the process's other threads may run on meanwhile. Stop 34's ci: an etcd member
    answered one more request after ``kill(pid, SIGSTOP)`` had returned.

    Args:
        pid: the process to freeze (resume it with SIGCONT).
        timeout_s: how long its threads may take to stop.

    Raises:
        WaitTimeout: some thread was still not stopped after ``timeout_s``.
    """
    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: _all_threads_stopped(pid), timeout_s, f"every thread of {pid} to stop")


TICKS_PER_S = os.sysconf("SC_CLK_TCK")


class ProcessTable:
    """Every process of the machine at one moment: one read of each ``/proc/PID/stat``.

    The tests' process accounting polls (the leak guard around every test, a job's workers while
    it waits for them). ``psutil.Process.children(recursive=True)`` reads every process's stat
    once per call and each child's again for its start time and status: with a few hundred
    processes on the machine, that polling was about a third of the pytest workers' samples
    (py-spy). One table answers all of a poll's questions.

    A process is identified by ``(pid, start)``, its start in clock ticks since boot: a pid
    alone may be reused.
    """

    def __init__(self) -> None:
        self._state: dict[int, str] = {}
        self._start: dict[int, int] = {}
        self._children: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            fields = _stat_fields(f"/proc/{name}/stat") if name.isdigit() else None
            if fields is None:
                continue  # not a process, or exited meanwhile
            pid = int(name)
            self._state[pid] = fields[0].decode()
            self._children.setdefault(int(fields[1]), []).append(pid)
            self._start[pid] = int(fields[19])

    def key(self, pid: int) -> tuple[int, int] | None:
        """``(pid, start)`` of a process in the table, or None."""
        start = self._start.get(pid)
        return None if start is None else (pid, start)

    def alive(self, pid: int) -> bool:
        """Whether ``pid`` was running (a zombie counts as gone)."""
        return self._state.get(pid, "Z") != "Z"

    def marked(self, variable: str, value: str, since: int) -> list[int]:
        """The living processes started at or after tick ``since`` with ``variable=value`` in
        their environment (as it was when they started), this one excepted."""
        entry = f"{variable}={value}".encode()
        me = os.getpid()
        found = []
        for pid, start in self._start.items():
            if pid == me or start < since or not self.alive(pid):
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read()
            except OSError:
                continue  # gone, or not ours to read
            if entry in environ.split(b"\0"):
                found.append(pid)
        return found

    @staticmethod
    def now() -> int:
        """Clock ticks since boot: the unit of a process's start."""
        with open("/proc/uptime") as f:
            return int(float(f.read().split()[0]) * TICKS_PER_S)

    def descendants(self, pid: int) -> list[int]:
        """The living descendants of ``pid`` (children, grandchildren, ...), zombies excluded."""
        found: list[int] = []
        todo = list(self._children.get(pid, ()))
        while todo:
            child = todo.pop()
            if self.alive(child):
                found.append(child)
            todo.extend(self._children.get(child, ()))
        return found


def alive_descendants(pid: int) -> list[psutil.Process]:
    """The living descendants of ``pid`` (children, grandchildren, ...), zombies excluded.

    Args:
        pid: the root process.

    Returns:
        The descendants still running; empty when ``pid`` itself is gone.
    """
    found = []
    for child in ProcessTable().descendants(pid):
        try:
            found.append(psutil.Process(child))
        except psutil.NoSuchProcess:
            continue
    return found


def no_process_left(pids: Iterable[int]) -> bool:
    """Whether every process in ``pids`` has exited (zombies count as exited).

    Args:
        pids: process ids.

    Returns:
        True when none of them is running.
    """
    return not any(is_alive(pid) for pid in pids)


def _kill_tree(pid: int) -> None:
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def agent_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for an ``elastic-run`` child: unbuffered (as every agent of the
    tests), ``extra`` on top, the repository first on PYTHONPATH."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    python_path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *([python_path] if python_path else [])])
    return env


def run_cli(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``elastic-run ARGS`` to completion and capture its output (as text, as
    ``subprocess.run(..., capture_output=True, text=True)``): the console script, forked from a
    template that imported torch (``tests/forked_agents.py``) when it can.

    Args:
        args: the command-line arguments.
        env: variables set on top of this process's environment. PYTHONPATH gets the repository
            root in front.
        timeout_s: how long the command may run; then it and its descendants are killed.
        cwd: the working directory (default: the current one).

    Returns:
        The finished process with ``stdout`` and ``stderr`` as text.

    Raises:
        AssertionError: the command ran past ``timeout_s`` (the message holds its output).
    """
    from tests.forked_agents import start_agent

    deadline = time.monotonic() + timeout_s
    full_env = agent_env(env)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        proc = start_agent(args, env=full_env, stdout=out_w, stderr=err_w, cwd=cwd)
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    code = None
    try:
        (stdout, stderr), ended = _read_to_end([out_r, err_r], deadline)
        if ended:
            code = proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    except BaseException:
        _kill_tree(proc.pid)
        raise
    if code is None:  # still running, or something it started still holds its output
        _kill_tree(proc.pid)
        raise AssertionError(
            f"elastic-run {' '.join(args)} ran past {timeout_s} s\n"
            f"--- stdout\n{stdout}\n--- stderr\n{stderr}"
        )
    return subprocess.CompletedProcess(proc.args, code, stdout, stderr)


def _read_to_end(fds: list[int], deadline: float) -> tuple[list[str], bool]:
    """Read each pipe until its end or ``deadline``, then close it.

    Returns:
        The text of each (newlines universal, as ``text=True``), and whether every one ended.
    """
    chunks: dict[int, list[bytes]] = {fd: [] for fd in fds}
    try:
        with selectors.DefaultSelector() as selector:
            for fd in fds:
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map() and time.monotonic() < deadline:
                for key, _ in selector.select(deadline - time.monotonic()):
                    data = os.read(key.fd, 1 << 16)
                    if data:
                        chunks[key.fd].append(data)
                    else:
                        selector.unregister(key.fd)
            ended = not selector.get_map()
    finally:
        for fd in fds:
            os.close(fd)
    texts = [b"".join(chunks[fd]).decode(errors="replace") for fd in fds]
    return [t.replace("\r\n", "\n").replace("\r", "\n") for t in texts], ended


def run_cli_in_process(
    args: Sequence[str], *, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run the CLI's command group on ``args`` in this process (click's test runner) and capture
    what it printed and its exit code, as ``run_cli`` does for a child process.

    For polling a read-only command (``status --json``) in a wait loop: a child process imports
    torch for each call (about 3 s of CPU here), which starved the jobs under test. A test that
    polls this way still runs the real command once in a child for what it asserts last.

    Raises:
        AssertionError: the command raised, or ran past ``timeout_s``.
    """
    from click.testing import CliRunner

    from elastic_run.cli.main import cli

    done: list[Any] = []
    runner = threading.Thread(
        target=lambda: done.append(CliRunner().invoke(cli, list(args), prog_name="elastic-run")),
        daemon=True,
    )
    runner.start()
    runner.join(timeout_s)
    if not done:
        raise AssertionError(f"elastic-run {' '.join(args)} ran past {timeout_s} s (in process)")
    result = done[0]
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"elastic-run {' '.join(args)} raised {result.exception!r}")
    return subprocess.CompletedProcess(
        ["elastic-run", *args], result.exit_code, result.stdout, result.stderr
    )


def join_into(outcome: dict[Any, Any], key: Any, handler: Any) -> None:
    """``outcome[key] = handler.next_rendezvous()``, or the exception it raised (a test thread's
    target: the test reads the outcome)."""
    try:
        outcome[key] = handler.next_rendezvous()
    except BaseException as exc:  # the test reads it
        outcome[key] = exc
