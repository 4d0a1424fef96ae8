"""elastic_run.elastic.timer against torch.distributed.elastic.timer, call for call, from torch's docs.

Every pair of client and server (torch's client against our server, ours against torch's, ours
against ours, torch's against torch's as the reference) runs with real worker processes, a
real FIFO and real signals: a timer armed through ``configure`` and ``expires`` that expires
kills the worker with the client's signal, and a released one does not fire. Servers run in
their own processes (tests/compat/timer_roles.py), since torch's server signals its own process
too once it has killed a worker.
"""

from __future__ import annotations

import errno
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import elastic_run.elastic.timer as ours
from tests.helpers import REPO_ROOT, wait_until

pytestmark = pytest.mark.timeout(120)

ROLES = Path(__file__).with_name("timer_roles.py")
KINDS = ["torch", "ours"]
START_S = 60.0  # importing torch in a fresh process on a loaded 2-core machine


class Process:
    """A role of timer_roles.py, its stdout lines gathered by a thread, stderr in a file."""

    def __init__(self, args: list[str], log: Path) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        self.log = log
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", str(ROLES), *args],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self._lines.append(line.strip())

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    def describe(self) -> str:
        return f"pid {self.proc.pid}, exit {self.proc.poll()}, stdout {self.lines()}\n" + (
            self.log.read_text()
        )

    def wait_for_line(self, line: str) -> None:
        wait_until(
            lambda: line in self.lines() or self.proc.poll() is not None,
            START_S,
            message=self.describe,
        )
        assert line in self.lines(), self.describe()

    def wait_exit(self) -> int:
        wait_until(lambda: self.proc.poll() is not None, START_S, message=self.describe)
        assert self.proc.returncode is not None
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.stdin is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # a server stops at EOF
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(10)


class Server(Process):
    """A timer server of one kind, serving ``fifo``; its log events as dicts."""

    def __init__(self, kind: str, fifo: str, log: Path) -> None:
        super().__init__(["server", kind, fifo], log)
        self.fifo = fifo
        wait_until(lambda: self.events() or self.proc.poll() is not None, START_S)
        assert self.events()[:1] == [{"event": "watchdog started", "request": None}], (
            self.describe()
        )
        # torch's server opens the FIFO from its thread after start() returned.
        wait_until(self._has_reader, START_S, message=self.describe)

    def _has_reader(self) -> bool:
        try:
            fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno in (errno.ENXIO, errno.ENOENT):
                return False
            raise
        os.close(fd)
        return True

    def events(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.lines()]


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[Process]]:
    started: list[Process] = []
    try:
        yield started
    finally:
        for process in started:
            if process.proc.poll() is None and not isinstance(process, Server):
                process.proc.kill()
            process.close()


def run_pair(
    client: str, server: str, scenario: str, tmp_path: Path, processes: list[Process]
) -> tuple[int, Server]:
    """Start the server, then a worker of ``scenario``; return its exit code and the server."""
    fifo = str(tmp_path / "timer.fifo")
    serving = Server(server, fifo, tmp_path / "server.log")
    processes.append(serving)
    worker = Process(["worker", client, fifo, scenario], tmp_path / "worker.log")
    processes.append(worker)
    worker.wait_for_line("armed")
    code = worker.wait_exit()
    wait_until(
        lambda: any(e["event"] == "kill worker process" for e in serving.events()),
        START_S,
        message=serving.describe,
    )
    return code, serving


def expired_scopes(server: Server, event: str) -> list[object]:
    scopes = []
    for e in server.events():
        request = e["request"]
        if e["event"] == event and isinstance(request, dict):
            scopes.append(request["scope_id"])
    return scopes


@pytest.mark.parametrize("server", KINDS)
@pytest.mark.parametrize("client", KINDS)
def test_an_expired_timer_kills_the_worker_with_the_clients_signal(
    client: str, server: str, tmp_path: Path, processes: list[Process]
) -> None:
    code, serving = run_pair(client, server, "expire", tmp_path, processes)
    assert code == -signal.SIGTERM, serving.describe()
    assert expired_scopes(serving, "timer expired") == ["hang"]
    [killed] = [e for e in serving.events() if e["event"] == "kill worker process"]
    request = killed["request"]
    assert isinstance(request, dict)
    assert list(request) == ["version", "pid", "scope_id", "expiration_time", "signal"]
    assert (request["pid"], request["signal"]) == (processes[1].proc.pid, signal.SIGTERM)


@pytest.mark.parametrize("server", KINDS)
@pytest.mark.parametrize("client", KINDS)
def test_a_released_timer_does_not_fire(
    client: str, server: str, tmp_path: Path, processes: list[Process]
) -> None:
    code, serving = run_pair(client, server, "release", tmp_path, processes)
    assert code == -signal.SIGTERM, "the released SIGKILL timer fired: " + serving.describe()
    assert expired_scopes(serving, "timer expired") == ["fires"]
    assert expired_scopes(serving, "kill worker process") == ["fires"]


def test_our_server_logs_its_stop_as_torchs_does(tmp_path: Path) -> None:
    events: list[tuple[str, object]] = []
    server = ours.FileTimerServer(
        str(tmp_path / "t.fifo"),
        "run",
        0.1,
        True,
        lambda name, request: events.append((name, request)),
    )
    server.start()
    server.stop()
    assert events == [("watchdog started", None), ("watchdog stopped", None)]


def test_file_timer_request_is_torchs() -> None:
    from torch.distributed.elastic import timer as torchs

    cases: list[tuple[Any, ...]] = [(123, "step", 1700000000.5, 9), (123, "step", -1, 0)]
    for args in [*cases, (7, "ü/#1", 5.0)]:
        mine = ours.FileTimerRequest(*args)
        theirs = torchs.FileTimerRequest(*args)  # type: ignore[attr-defined]
        assert mine.to_json() == theirs.to_json()
        for name in ("worker_pid", "worker_id", "scope_id", "expiration_time", "signal", "version"):
            assert getattr(mine, name) == getattr(theirs, name), name


@pytest.mark.parametrize(
    "name", ["FileTimerServer", "FileTimerClient", "FileTimerRequest", "configure", "expires"]
)
def test_torchs_parameters_come_first_with_torchs_names_and_defaults(name: str) -> None:
    from torch.distributed.elastic import timer as torchs

    theirs = list(inspect.signature(getattr(torchs, name)).parameters.values())
    mine = list(inspect.signature(getattr(ours, name)).parameters.values())
    assert [p.name for p in mine[: len(theirs)]] == [p.name for p in theirs]
    for t, m in zip(theirs, mine, strict=False):
        assert m.kind == t.kind, t.name
        if t.default is not inspect.Parameter.empty:
            assert m.default == t.default, t.name
    extras = mine[len(theirs) :]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extras), extras
    assert all(p.default is not inspect.Parameter.empty for p in extras), extras


def test_importing_the_timer_api_imports_no_torch_and_no_agent() -> None:
    code = (
        "import sys, elastic_run.elastic.timer, elastic_run.worker\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'psutil')"
        " or m.startswith(('elastic_run.agent', 'elastic_run.cli', 'elastic_run.rendezvous'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    ).stdout
    assert out.strip() == "[]"
    assert ours.FileTimerServer.__module__ == "elastic_run.agent.watchdog.server"


def test_is_process_running_answers_as_torchs() -> None:
    """``FileTimerServer.is_process_running(pid)``, a static method on both: this process, a
    child that exited but is not reaped yet (a zombie: running, for torch's), the same pid once
    reaped, and pid values that are no process."""
    from torch.distributed.elastic.timer.file_based_local_timer import FileTimerServer as Theirs

    from elastic_run.elastic.timer.file_based_local_timer import FileTimerServer as Mirrored

    def both(pid: int) -> tuple[bool, bool]:
        return Theirs.is_process_running(pid), Mirrored.is_process_running(pid)

    assert both(os.getpid()) == (True, True)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_until(
            lambda: os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG),
            60,
            "the child to exit",
        )
        assert both(child.pid) == (True, True)  # a zombie
    finally:
        child.wait()
    assert both(child.pid) == (False, False)
    with open("/proc/sys/kernel/pid_max") as f:
        beyond = int(f.read()) + 1
    assert both(beyond) == (False, False)


def _recording_client(base: type, calls: list[tuple[object, ...]]) -> type:
    """A subclass of ``base`` (a ``TimerClient``) that records its calls in ``calls``."""

    class Recording(base):  # type: ignore[misc,valid-type]
        def acquire(self, scope_id: str, expiration_time: float) -> None:
            calls.append(("acquire", scope_id, type(expiration_time)))

        def release(self, scope_id: str) -> None:
            calls.append(("release", scope_id))

    return Recording


def test_expires_calls_the_client_as_torchs(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's file timer tests: ``expires(after, scope, client)`` acquires ``(scope, expiry)``
    and releases ``scope`` on the client given, an exception inside propagates, and with
    ``configure(None)`` (and no ``TORCHELASTIC_TIMER_FILE``) it raises ``RuntimeError``. The
    default scope is a documented difference: torch's reads the frame of contextlib, ours the
    caller's ``file#line``."""
    import torch.distributed.elastic.timer as theirs

    monkeypatch.delenv("TORCHELASTIC_TIMER_FILE", raising=False)
    seen: dict[str, list[tuple[object, ...]]] = {}
    for name, side in (("torch", theirs), ("ours", ours)):
        calls: list[tuple[object, ...]] = []
        Recording = _recording_client(side.TimerClient, calls)
        with side.expires(after=1, scope="test", client=Recording()):
            pass
        with pytest.raises(RuntimeError, match="foobar"):
            with side.expires(after=1, scope="inner", client=Recording()):
                raise RuntimeError("foobar")
        with side.expires(after=1, client=Recording()):
            pass
        side.configure(None)
        with pytest.raises(RuntimeError):
            with side.expires(after=1):
                pass
        seen[name] = calls
    # the last two calls: the block with the default scope, acquired then released
    default_scope = {}
    for name, calls in seen.items():
        (_, acquired, _), (_, released) = calls[-2:]
        assert acquired == released
        default_scope[name] = str(acquired)
        del calls[-2:]
    assert (
        seen["ours"]
        == seen["torch"]
        == [
            ("acquire", "test", float),
            ("release", "test"),
            ("acquire", "inner", float),
            ("release", "inner"),
        ]
    )
    assert default_scope["torch"].rsplit("#", 1)[0].endswith("contextlib.py")
    assert default_scope["ours"].rsplit("#", 1)[0] == __file__


@pytest.mark.parametrize("pid", [0, -3])
def test_a_timer_request_for_no_process_is_refused_where_torchs_is_sent(pid: int) -> None:
    """A documented difference: torch's request takes any pid (its server would ``os.kill`` a
    process group at expiry); ours refuses a pid that is not positive with a ValueError."""
    from torch.distributed.elastic.timer import FileTimerRequest as Theirs

    assert Theirs(worker_pid=pid, scope_id="s", expiration_time=-1).worker_pid == pid
    with pytest.raises(ValueError, match="positive"):
        ours.FileTimerRequest(worker_pid=pid, scope_id="s", expiration_time=-1)
