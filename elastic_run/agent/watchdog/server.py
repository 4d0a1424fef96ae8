"""The file-timer watchdog server: the FIFO, the thread that reads it, and the kills.

Workers arm and release timers by writing request lines to a FIFO in torch's ``FileTimerClient``
protocol (the format: :mod:`elastic_run.worker.timer_wire`); which timers are armed and which are due
is decided by the pure :class:`~elastic_run.agent.watchdog.timer_table.TimerTable`. This module is the
I/O around them, and its :class:`FileTimerServer` is called like torch's
(``torch.distributed.elastic.timer.FileTimerServer``).

Invariants:
- One thread reads the pipe and acts on expiries; it waits in ``select`` until the earliest
  deadline (capped at ``max_interval``), so a timer is acted on within milliseconds of its
  expiry, not at the next poll, and an idle server wakes once per ``max_interval``.
- The server never dies of its input: malformed or oversized lines, unknown pids and clients
  that vanish mid-write are logged as warnings and skipped.
- The pipe is held open read-write, so the server never sees EOF when the last writer closes.
- Timers of processes that have exited (or turned zombie) are dropped without a kill, at
  expiry or by a sweep about once a second while timers are armed.
- Unlike torch's server, this one never signals its own process: the agent decides what a
  killed worker means for the group.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import select
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from elastic_run.agent.watchdog.timer_table import ArmedTimer, TimerTable
from elastic_run.errors import AgentError, ConfigurationError
from elastic_run.worker.timer_wire import MAX_LINE_BYTES, FileTimerRequest, RequestFramer

__all__ = ["ArmedTimer", "FileTimerServer", "LogEvent", "TimerExpiry", "WatchdogPipeNotFoundError"]

logger = logging.getLogger(__name__)

LogEvent = Callable[[str, FileTimerRequest | None], None]
"""torch's ``log_event`` callback: an event name and the request it is about (or None)."""

_READ_CHUNK_BYTES = 65536
# Exited pids are also caught at expiry, so the sweep that frees their timers can be lazy.
_SWEEP_INTERVAL_S = 1.0
# Conforming clients write whole lines at once: a tail this old was left by a dead client.
_PARTIAL_STALE_S = 0.1


class WatchdogPipeNotFoundError(ConfigurationError, FileNotFoundError):
    """The watchdog pipe cannot be made: its directory does not exist.

    A ``FileNotFoundError``, as torch's ``FileTimerServer`` raises, and a
    ``ConfigurationError`` (a ``ValueError``), as bad user input is here.
    """


@dataclass(frozen=True)
class TimerExpiry:
    """One timer that expired.

    Attributes:
        pid: the process the timer belonged to.
        scope_id: the name of the timer's scope.
        signal: the signal the client asked for (0 or negative: the process was not killed).
        expired_at: the timer's expiration time, epoch seconds.
        killed_at: when the signal was sent, epoch seconds; None if none was sent.
    """

    pid: int
    scope_id: str
    signal: int
    expired_at: float
    killed_at: float | None


def _has_exited(pid: int) -> bool:
    """Return True when ``pid`` no longer runs (gone, or a zombie waiting to be reaped)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        # Access denied and the like: the process exists, so keep its timers.
        return False


class FileTimerServer:
    """Serve file timers on a FIFO and signal the workers whose timers expire.

    The first five arguments are torch's, in torch's order; the rest are keyword-only.

    ``log_event(name, request)`` is called as torch's server calls it: ``("watchdog started",
    None)`` and ``("watchdog stopped", None)`` by :meth:`start` and :meth:`stop` (on the
    caller's thread); on the server's thread, ``("timer expired", request)`` for each expired
    timer of a running process, earliest first, then ``("kill worker process", request)`` once
    its signal was sent. ``request`` is the :class:`~elastic_run.worker.timer_wire.FileTimerRequest`
    that armed the timer. An exception from a callback is logged, never raised.

    Args:
        file_path: path of the FIFO; created (mode 0600) by :meth:`start` if missing, removed by
            :meth:`stop` if this server created it.
        run_id: the job's run id, named in the server's log lines.
        max_interval: the longest the loop waits between two turns, seconds (its progress
            heartbeat, :attr:`last_progress`); expiries are acted on at their deadline, not at
            a turn. torch's default of 10 s; the agent passes 0.1.
        daemon: whether the server's thread is a daemon thread.
        log_event: the event callback described above; None: no events.
        is_known_pid: answers whether a pid may be managed (a worker of this agent); requests
            arming timers for other pids are ignored with a warning. None: every pid is accepted.
        on_expired: called on the server's thread for every expired timer of a running process,
            after the signal was sent.
        on_request: called on the server's thread with the pid of every accepted request (an
            arm or a release: the agent counts it as a progress beat of that worker).
        before_kill: called on the server's thread with the pid of a process whose timer
            expired, before its signal is sent (the agent takes its stacks).
        max_line_bytes: longest accepted request line, newline excluded.

    Raises:
        ConfigurationError: ``max_interval`` is not positive and finite, or ``max_line_bytes``
            is not positive.
    """

    def __init__(
        self,
        file_path: str,
        run_id: str = "",
        max_interval: float = 10,
        daemon: bool = True,
        log_event: LogEvent | None = None,
        *,
        is_known_pid: Callable[[int], bool] | None = None,
        on_expired: Callable[[TimerExpiry], None] | None = None,
        max_line_bytes: int = MAX_LINE_BYTES,
        on_request: Callable[[int], None] | None = None,
        before_kill: Callable[[int], None] | None = None,
    ) -> None:
        if not (max_interval > 0 and math.isfinite(max_interval)):
            raise ConfigurationError(
                f"watchdog max_interval must be positive and finite, got {max_interval}"
            )
        if max_line_bytes <= 0:
            raise ConfigurationError(
                f"watchdog max line size must be positive, got {max_line_bytes}"
            )
        self._file_path = file_path
        self._name = f"watchdog on {file_path}" + (f" (run {run_id})" if run_id else "")
        self._max_interval = float(max_interval)
        self._daemon = daemon
        self._log_event = log_event
        self._is_known_pid = is_known_pid
        self._on_expired = on_expired
        self._on_request = on_request
        self._before_kill = before_kill
        self._max_line_bytes = max_line_bytes
        # Writers hold the lock; readers take the reference (a table is immutable).
        self._lock = threading.Lock()
        self._table = TimerTable()
        self._stopping = threading.Event()
        self._last_turn = threading.Event()  # run_once: one more full turn, then end
        self._thread: threading.Thread | None = None
        self._fifo_fd = -1
        self._wake_r = -1
        self._wake_w = -1
        self._created_fifo = False
        self._last_progress = time.monotonic()
        # Touched only by the server thread.
        self._framer = RequestFramer(max_line_bytes, _PARTIAL_STALE_S)
        self._next_sweep = 0.0

    @property
    def file_path(self) -> str:
        """The FIFO path workers write to (TORCHELASTIC_TIMER_FILE)."""
        return self._file_path

    @property
    def last_progress(self) -> float:
        """``time.monotonic()`` at the last turn of the server loop (for the health check)."""
        return self._last_progress

    def get_last_progress_time(self) -> int:
        """Return the last turn of the server loop in epoch seconds, as torch's server does.

        Returns:
            ``int(time.time())`` as it was at the loop's last turn.
        """
        return int(time.time() - (time.monotonic() - self._last_progress))

    def armed_timers(self) -> tuple[ArmedTimer, ...]:
        """Return a snapshot of the timers held now, earliest expiry first."""
        return self._table.armed()

    @staticmethod
    def is_process_running(pid: int) -> bool:
        """Return whether a signal could be sent to ``pid`` now (torch's ``is_process_running``).

        As torch's: ``os.kill(pid, 0)`` answers, so a zombie still runs and a process of another
        user (no permission) does not. The server itself drops a worker's timers only once it
        has exited or is a zombie.
        """
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True

    def clear_pid(self, pid: int) -> None:
        """Drop every timer of ``pid`` (the agent calls this when it stops a worker).

        Args:
            pid: the worker's process id.
        """
        with self._lock:
            self._table = self._table.without_pids((pid,))

    def start(self) -> None:
        """Create the FIFO if needed, open it and start the server thread.

        Raises:
            WatchdogPipeNotFoundError: the pipe's directory does not exist (also a
                ``FileNotFoundError``, as torch's).
            ConfigurationError: the path exists and is not a FIFO, or cannot be created.
            AgentError: the server was already started.
        """
        if self._thread is not None:
            raise AgentError(f"{self._name} is already started")
        self._open_fifo()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._stopping.clear()
        self._last_turn.clear()
        with self._lock:
            self._table = TimerTable()
        self._last_progress = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, name=f"file-timer-{self._name}", daemon=self._daemon
        )
        self._thread.start()
        self._emit("watchdog started", None)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (bounded join), close the FIFO and remove it if this server made it.

        Args:
            timeout_s: the longest to wait for the thread to end.

        Raises:
            AgentError: the thread did not end within ``timeout_s``.
        """
        self._end(self._stopping, timeout_s, last_turn=False)

    def run_once(self, timeout_s: float = 5.0) -> None:
        """Serve what is there now, then stop (torch's ``run_once``).

        The server's thread reads every request already written to the pipe, acts on the
        timers due by then (signals and events as usual), and ends; the FIFO is then closed and
        removed as by :meth:`stop`. The timers still armed stay readable
        (:meth:`armed_timers`) until the next :meth:`start`; no ``watchdog stopped`` event, as
        with torch's. Without a running thread it does nothing.

        Args:
            timeout_s: the longest to wait for the thread to end.

        Raises:
            AgentError: the thread did not end within ``timeout_s``.
        """
        self._end(self._last_turn, timeout_s, last_turn=True)

    def _end(self, flag: threading.Event, timeout_s: float, *, last_turn: bool) -> None:
        thread = self._thread
        if thread is None:
            return
        flag.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        thread.join(timeout_s)
        if thread.is_alive():
            raise AgentError(f"{self._name}: the thread did not stop in {timeout_s} s")
        self._thread = None
        for fd in (self._fifo_fd, self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._fifo_fd = self._wake_r = self._wake_w = -1
        if self._created_fifo:
            try:
                os.unlink(self._file_path)
            except FileNotFoundError:
                pass
            self._created_fifo = False
        self._framer = RequestFramer(self._max_line_bytes, _PARTIAL_STALE_S)
        if last_turn:  # as torch's run_once: no event, and the timers stay readable
            return
        with self._lock:
            self._table = TimerTable()
        self._emit("watchdog stopped", None)

    def _open_fifo(self) -> None:
        try:
            mode = os.stat(self._file_path).st_mode
        except FileNotFoundError:
            try:
                os.mkfifo(self._file_path, 0o600)
            except OSError as exc:
                error = (
                    WatchdogPipeNotFoundError
                    if isinstance(exc, FileNotFoundError)
                    else ConfigurationError
                )
                raise error(
                    f"cannot create the watchdog pipe {self._file_path}: {exc.strerror}"
                ) from exc
            self._created_fifo = True
        else:
            if not stat.S_ISFIFO(mode):
                raise ConfigurationError(
                    f"watchdog pipe path {self._file_path} exists and is not a FIFO"
                )
        # Read-write, so that the pipe always has a writer and select never reports a
        # spinning EOF when the last client closes.
        try:
            self._fifo_fd = os.open(self._file_path, os.O_RDWR | os.O_NONBLOCK)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot open the watchdog pipe {self._file_path}: {exc.strerror}"
            ) from exc

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._last_progress = time.monotonic()
            last = self._last_turn.is_set()
            try:
                if last:
                    self._drain_pipe()
                    self._expire_due()
                    return
                self._turn()
            except Exception:
                # A bug of ours, not the input's: keep watching rather than leave workers
                # unguarded, but say it loudly.
                logger.exception("%s: unexpected error in the loop", self._name)
                if last:
                    return
                self._stopping.wait(min(self._max_interval, 1.0))

    def _wait_s(self) -> float:
        """How long the next ``select`` may wait: to the first deadline, at most max_interval."""
        wall, mono = time.time(), time.monotonic()
        deadlines = [mono + self._max_interval]
        expiration = self._table.next_expiration()
        if expiration is not None:
            deadlines.append(mono + (expiration - wall))
            deadlines.append(self._next_sweep)
        stale_at = self._framer.stale_at
        if stale_at is not None:
            deadlines.append(stale_at)
        return max(0.0, min(deadlines) - mono)

    def _turn(self) -> None:
        readable, _, _ = select.select([self._fifo_fd, self._wake_r], [], [], self._wait_s())
        if self._fifo_fd in readable:
            self._read_pipe()
        if self._wake_r in readable:
            try:
                os.read(self._wake_r, 64)
            except BlockingIOError:
                pass
        self._expire_due()
        now = time.monotonic()
        self._warn(self._framer.drop_stale(now))
        if now >= self._next_sweep:
            self._next_sweep = now + _SWEEP_INTERVAL_S
            self._sweep_exited()

    def _read_pipe(self) -> None:
        try:
            chunk = os.read(self._fifo_fd, _READ_CHUNK_BYTES)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno == errno.EINTR:
                return
            raise
        if not chunk:
            return
        framed = self._framer.feed(chunk, time.monotonic())
        self._warn(framed.problems)
        for request in framed.requests:
            self._apply(request)

    def _drain_pipe(self) -> None:
        """Read the pipe until it is empty (the last turn of :meth:`run_once`)."""
        while select.select([self._fifo_fd], [], [], 0)[0]:
            self._read_pipe()

    def _warn(self, problems: tuple[str, ...]) -> None:
        for problem in problems:
            logger.warning("%s: %s", self._name, problem)

    def _apply(self, request: FileTimerRequest) -> None:
        if not request.is_release and not self._accepts(request.worker_pid):
            logger.warning(
                "%s: ignoring a timer for pid %d, which is not a known worker",
                self._name,
                request.worker_pid,
            )
            return
        with self._lock:
            self._table = self._table.apply(request)
        if self._on_request is not None:
            self._call(self._on_request, request.worker_pid, "on_request")

    def _call(self, callback: Callable[[int], None], pid: int, name: str) -> None:
        try:
            callback(pid)
        except Exception:
            logger.exception("%s: %s(%d) failed", self._name, name, pid)

    def _accepts(self, pid: int) -> bool:
        if self._is_known_pid is None:
            return True
        try:
            return self._is_known_pid(pid)
        except Exception:
            logger.exception("%s: is_known_pid(%d) failed", self._name, pid)
            return False

    def _expire_due(self) -> None:
        with self._lock:
            due, self._table = self._table.split_due(time.time())
        for timer in due:
            self._expire(timer)

    def _expire(self, timer: ArmedTimer) -> None:
        if _has_exited(timer.pid):
            return
        request = timer.as_request()
        self._emit("timer expired", request)
        killed_at: float | None = None
        if timer.signal > 0:
            if self._before_kill is not None:
                self._call(self._before_kill, timer.pid, "before_kill")
            try:
                os.kill(timer.pid, timer.signal)
                killed_at = time.time()
            except ProcessLookupError:
                return
            except PermissionError:
                logger.warning(
                    "%s: not allowed to signal pid %d for expired scope %r",
                    self._name,
                    timer.pid,
                    timer.scope_id,
                )
        logger.warning(
            "%s: timer %r of pid %d expired %.3f s ago; %s",
            self._name,
            timer.scope_id,
            timer.pid,
            time.time() - timer.expiration_time,
            f"sent signal {timer.signal}" if killed_at is not None else "no signal sent",
        )
        if killed_at is not None:
            self._emit("kill worker process", request)
        if self._on_expired is not None:
            expiry = TimerExpiry(
                timer.pid, timer.scope_id, timer.signal, timer.expiration_time, killed_at
            )
            try:
                self._on_expired(expiry)
            except Exception:
                logger.exception("%s: on_expired callback failed", self._name)

    def _emit(self, name: str, request: FileTimerRequest | None) -> None:
        if self._log_event is None:
            return
        try:
            self._log_event(name, request)
        except Exception:
            logger.exception("%s: log_event callback failed on %r", self._name, name)

    def _sweep_exited(self) -> None:
        gone = [pid for pid in self._table.pids() if _has_exited(pid)]
        if gone:
            with self._lock:
                self._table = self._table.without_pids(gone)
