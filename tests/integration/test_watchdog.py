"""The file-timer watchdog against real FIFOs, real worker processes and real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from elastic_run.agent.watchdog.server import FileTimerServer, TimerExpiry
from elastic_run.errors import ConfigurationError
from elastic_run.worker.timer_wire import FileTimerRequest
from tests.helpers import REPO_ROOT, wait_until


class Harness:
    """A started server, the expiries and events it reported and the workers of one test.

    By default the server is built as the agent builds it (torch's arguments, then ours).
    """

    def __init__(self, fifo: str, server: FileTimerServer | None = None) -> None:
        self.fifo = fifo
        self.rejected: set[int] = set()
        self._lock = threading.Lock()
        self._expiries: list[TimerExpiry] = []
        self._events: list[tuple[str, FileTimerRequest | None]] = []
        self.procs: list[subprocess.Popen[str]] = []
        self.server = server or FileTimerServer(
            fifo,
            "test-run",
            max_interval=0.1,
            log_event=self._log_event,
            is_known_pid=self._is_known_pid,
            on_expired=self._on_expired,
        )

    def _is_known_pid(self, pid: int) -> bool:
        if pid in self.rejected:
            return False
        try:
            return psutil.Process(pid).ppid() == os.getpid()
        except psutil.NoSuchProcess:
            return False

    def _on_expired(self, expiry: TimerExpiry) -> None:
        with self._lock:
            self._expiries.append(expiry)

    def _log_event(self, name: str, request: FileTimerRequest | None) -> None:
        with self._lock:
            self._events.append((name, request))

    def expiries(self) -> list[TimerExpiry]:
        with self._lock:
            return list(self._expiries)

    def events(self) -> list[tuple[str, FileTimerRequest | None]]:
        with self._lock:
            return list(self._events)

    def spawn(self, code: str) -> subprocess.Popen[str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["TORCHELASTIC_TIMER_FILE"] = self.fifo
        proc = subprocess.Popen(
            [sys.executable, "-u", "-c", textwrap.dedent(code)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def write_raw(self, data: bytes) -> None:
        fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)
        self.server.stop()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(str(tmp_path / "timer.fifo"))
    h.server.start()
    try:
        yield h
    finally:
        h.cleanup()


def read_line(proc: subprocess.Popen[str]) -> str:
    """The next stdout line of ``proc``; on EOF, fail with its stderr."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"worker exited with {proc.returncode} before a line:\n{err}")
    return line.strip()


def wait_exit(proc: subprocess.Popen[str], timeout_s: float = 30) -> int:
    wait_until(lambda: proc.poll() is not None, timeout_s, message=f"worker {proc.pid} to exit")
    assert proc.returncode is not None
    return proc.returncode


HANGING_WORKER = """
    import signal
    from elastic_run.worker import expires
    with expires(after=1, scope="hang"):
        print("armed", flush=True)
        signal.pause()
"""


def test_hung_worker_is_killed_with_sigkill(harness: Harness) -> None:
    proc = harness.spawn(HANGING_WORKER)
    assert read_line(proc) == "armed"
    assert wait_exit(proc) == -signal.SIGKILL
    wait_until(lambda: bool(harness.expiries()), 10, message="the expiry callback")
    [expiry] = harness.expiries()
    assert expiry.pid == proc.pid
    assert expiry.scope_id == "hang"
    assert expiry.signal == signal.SIGKILL
    assert expiry.killed_at is not None and expiry.killed_at >= expiry.expired_at
    assert harness.server.armed_timers() == ()


def test_torch_file_timer_client_is_served(harness: Harness) -> None:
    proc = harness.spawn(
        """
        import os, signal
        from torch.distributed.elastic import timer
        timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
        with timer.expires(after=1, scope="torch-scope"):
            print("armed", flush=True)
            signal.pause()
        """
    )
    assert read_line(proc) == "armed"
    assert wait_exit(proc, timeout_s=60) == -signal.SIGKILL
    wait_until(lambda: bool(harness.expiries()), 10, message="the expiry callback")
    [expiry] = harness.expiries()
    assert (expiry.pid, expiry.scope_id, expiry.signal) == (proc.pid, "torch-scope", 9)


def test_bad_input_does_not_stop_the_server(harness: Harness) -> None:
    bystander = harness.spawn("import signal; print('up', flush=True); signal.pause()")
    assert read_line(bystander) == "up"
    harness.rejected.add(bystander.pid)
    past = time.time() - 1
    oversized = json.dumps(
        {"version": 1, "pid": bystander.pid, "scope_id": "x" * 10_000, "expiration_time": past}
    )
    for data in [
        b"not json\n",
        b"\xff\xfe\n",
        b"[1, 2]\n",
        b"\n",
        b'{"version": 1, "pid": "12", "scope_id": "s", "expiration_time": 0}\n',
        b'{"version": 1, "pid": true, "scope_id": "s", "expiration_time": 0}\n',
        b'{"version": 1, "pid": 12, "scope_id": 5, "expiration_time": 0}\n',
        b'{"version": 1, "pid": 12, "scope_id": "s", "expiration_time": NaN}\n',
        b'{"version": 2, "pid": 12, "scope_id": "s", "expiration_time": 0}\n',
        b'{"version": 1, "pid": 12, "scope_id": "s", "expiration_time": 0, "signal": 999}\n',
        oversized.encode() + b"\n",
        # A timer for a pid the agent does not own (already expired): must be ignored.
        json.dumps(
            {"version": 1, "pid": bystander.pid, "scope_id": "s", "expiration_time": past}
        ).encode()
        + b"\n",
        # A client that died mid-write: a fragment without its newline.
        b'{"version": 1, "pid": 12',
    ]:
        harness.write_raw(data)

    proc = harness.spawn(HANGING_WORKER)
    assert read_line(proc) == "armed"
    assert wait_exit(proc) == -signal.SIGKILL
    wait_until(lambda: bool(harness.expiries()), 10, message="the expiry callback")
    assert [(e.pid, e.scope_id) for e in harness.expiries()] == [(proc.pid, "hang")]
    # Requests are handled in order, so the bystander's was handled, and ignored, before.
    assert bystander.poll() is None


def test_fragment_followed_by_valid_request_is_salvaged(harness: Harness) -> None:
    proc = harness.spawn("import signal; print('up', flush=True); signal.pause()")
    assert read_line(proc) == "up"
    request = {"version": 1, "pid": proc.pid, "scope_id": "salvaged", "expiration_time": 0}
    # Both in one write, as the reader would see a dead client's fragment and the next line.
    harness.write_raw(b'{"version": 1, "pid": 4' + json.dumps(request).encode() + b"\n")
    assert wait_exit(proc) == -signal.SIGKILL
    wait_until(lambda: bool(harness.expiries()), 10, message="the expiry callback")
    assert harness.expiries()[0].scope_id == "salvaged"


def test_release_disarms_the_timer(harness: Harness) -> None:
    # Requests are handled in order: once the second timer is armed, the first one's release
    # was handled, so the table shows whether it disarmed (the pure table's unit tests show
    # that a released timer never comes due).
    proc = harness.spawn(
        """
        import sys
        from elastic_run.worker import expires
        with expires(after=30, scope="released"):
            pass
        with expires(after=60, scope="marker"):
            print("armed", flush=True)
            sys.stdin.readline()
        """
    )
    assert read_line(proc) == "armed"

    def scopes() -> list[str]:
        return [t.scope_id for t in harness.server.armed_timers()]

    wait_until(lambda: "marker" in scopes(), 10, message=lambda: f"armed: {scopes()}")
    assert scopes() == ["marker"]
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert wait_exit(proc) == 0
    wait_until(lambda: scopes() == [], 10, message=lambda: f"armed: {scopes()}")
    assert harness.expiries() == []


def test_log_event_is_called_as_torchs_server_calls_it(harness: Harness) -> None:
    proc = harness.spawn(HANGING_WORKER)
    assert read_line(proc) == "armed"
    assert wait_exit(proc) == -signal.SIGKILL
    wait_until(lambda: len(harness.events()) >= 3, 10, message=lambda: f"{harness.events()}")
    harness.server.stop()
    names = [name for name, _ in harness.events()]
    assert names == ["watchdog started", "timer expired", "kill worker process", "watchdog stopped"]
    requests = [request for _, request in harness.events()]
    assert requests[0] is None and requests[-1] is None
    assert requests[1] == requests[2]
    assert isinstance(requests[1], FileTimerRequest)
    assert (requests[1].worker_pid, requests[1].scope_id, requests[1].signal) == (
        proc.pid,
        "hang",
        signal.SIGKILL,
    )
    [expiry] = harness.expiries()
    assert expiry.expired_at == requests[1].expiration_time


def test_the_agents_first_call_still_serves(tmp_path: Path) -> None:
    """``FileTimerServer(path, is_known_pid=..., on_expired=...)``, torch's max_interval."""
    expiries: list[TimerExpiry] = []
    fifo = str(tmp_path / "timer.fifo")
    server = FileTimerServer(fifo, is_known_pid=lambda pid: True, on_expired=expiries.append)
    harness = Harness(fifo, server)
    server.start()
    try:
        proc = harness.spawn(HANGING_WORKER)
        assert read_line(proc) == "armed"
        assert wait_exit(proc) == -signal.SIGKILL
        wait_until(lambda: bool(expiries), 10, message="the expiry callback")
        assert (expiries[0].pid, expiries[0].scope_id) == (proc.pid, "hang")
    finally:
        harness.cleanup()


def test_without_is_known_pid_every_pid_is_served(tmp_path: Path) -> None:
    fifo = str(tmp_path / "timer.fifo")
    harness = Harness(fifo, FileTimerServer(fifo, "torch-like", max_interval=0.1))
    harness.server.start()
    try:
        proc = harness.spawn(HANGING_WORKER)
        assert read_line(proc) == "armed"
        assert wait_exit(proc) == -signal.SIGKILL
        assert harness.server.armed_timers() == ()
        assert abs(harness.server.get_last_progress_time() - time.time()) < 60
    finally:
        harness.cleanup()


def test_custom_signal_is_sent(harness: Harness) -> None:
    proc = harness.spawn(
        """
        import os, signal
        from elastic_run.worker import FileTimerClient, expires
        client = FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"], signal=signal.SIGTERM)
        with expires(after=2, scope="term", client=client):  # time to say "armed" first
            print("armed", flush=True)
            signal.pause()
        """
    )
    assert read_line(proc) == "armed"
    assert wait_exit(proc) == -signal.SIGTERM
    wait_until(lambda: bool(harness.expiries()), 10, message="the expiry callback")
    assert harness.expiries()[0].signal == signal.SIGTERM


def test_timers_of_exited_workers_are_dropped(harness: Harness) -> None:
    proc = harness.spawn(
        """
        import os, sys
        from elastic_run.worker import expires
        with expires(after=60, scope="left"):
            print("armed", flush=True)
            sys.stdin.readline()
            os._exit(0)
        """
    )
    assert read_line(proc) == "armed"
    wait_until(lambda: bool(harness.server.armed_timers()), 10, message="the timer to be armed")
    [armed] = harness.server.armed_timers()
    assert (armed.pid, armed.scope_id) == (proc.pid, "left")
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert wait_exit(proc) == 0
    wait_until(lambda: harness.server.armed_timers() == (), 10, message="the timer to be dropped")
    assert harness.expiries() == []


def test_clear_pid_drops_timers(harness: Harness) -> None:
    proc = harness.spawn("import signal; print('up', flush=True); signal.pause()")
    assert read_line(proc) == "up"
    request = {"version": 1, "pid": proc.pid, "scope_id": "a", "expiration_time": time.time() + 60}
    harness.write_raw(json.dumps(request).encode() + b"\n")
    wait_until(lambda: bool(harness.server.armed_timers()), 10, message="the timer to be armed")
    harness.server.clear_pid(proc.pid)
    assert harness.server.armed_timers() == ()


def test_progress_advances_while_idle(harness: Harness) -> None:
    first = harness.server.last_progress
    wait_until(lambda: harness.server.last_progress > first, 10, message="a loop turn")


def test_fifo_lifecycle(tmp_path: Path) -> None:
    fifo = tmp_path / "w.fifo"
    server = FileTimerServer(str(fifo), is_known_pid=lambda pid: False, on_expired=print)
    server.start()
    try:
        assert fifo.is_fifo()
    finally:
        server.stop()
    assert not fifo.exists()

    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(ConfigurationError, match="not a FIFO"):
        FileTimerServer(str(plain), is_known_pid=lambda pid: False, on_expired=print).start()
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ConfigurationError, match="max_interval must be positive and finite"):
            FileTimerServer(str(fifo), "run", bad)
    with pytest.raises(ConfigurationError, match="max line size must be positive"):
        FileTimerServer(str(fifo), "run", max_line_bytes=0)

    os.mkfifo(fifo)
    server = FileTimerServer(str(fifo), is_known_pid=lambda pid: False, on_expired=print)
    server.start()
    server.stop()
    assert fifo.is_fifo(), "a FIFO the server did not create is left in place"
