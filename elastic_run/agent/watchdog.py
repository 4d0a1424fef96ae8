"""The file-timer watchdog: kills a worker whose timer on the named pipe expired.

Workers arm and release timers by writing JSON lines to a FIFO, in the protocol of torch's
``FileTimerClient`` (one line per request, at most ``PIPE_BUF`` bytes so the write is atomic)::

    {"version": 1, "pid": 123, "scope_id": "step", "expiration_time": 1700000000.5, "signal": 9}

An ``expiration_time`` of -1 (any negative value) releases the timer ``(pid, scope_id)``.

Invariants:
- One thread owns the pipe and the timers' deadlines; it waits in ``select`` with the earliest
  deadline (capped at ``poll_interval_s``) as its timeout, so a timer is acted on within a few
  milliseconds of its expiry and an idle server wakes only ``1 / poll_interval_s`` times a second.
- The server never dies of its input: malformed or oversized lines, unknown pids and clients that
  vanish mid-write are logged as warnings and skipped.
- The pipe is held open read-write, so the server never sees EOF when the last writer closes.
- Timers of processes that have exited (or turned zombie) are dropped without a kill.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import select
import signal as signal_module
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from elastic_run.errors import AgentError, ConfigurationError

__all__ = ["ArmedTimer", "FileTimerServer", "TimerExpiry"]

logger = logging.getLogger(__name__)

_READ_CHUNK_BYTES = 65536
_VALID_SIGNALS = frozenset(int(s) for s in signal_module.valid_signals())
_RECORD_START = b'{"version"'
# Exited pids are also caught at expiry, so the sweep that frees their timers can be lazy.
_SWEEP_INTERVAL_S = 1.0


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


@dataclass(frozen=True)
class ArmedTimer:
    """A timer the server holds now.

    Attributes:
        pid: the process that armed it.
        scope_id: the name of its scope.
        expiration_time: when it expires, epoch seconds.
        signal: the signal sent at expiry.
    """

    pid: int
    scope_id: str
    expiration_time: float
    signal: int


@dataclass(frozen=True)
class _Request:
    pid: int
    scope_id: str
    expiration_time: float
    signal: int


class _BadRequest(ValueError):
    """A line from the pipe that is not a valid timer request."""


def _parse_request(line: bytes) -> _Request:
    """Decode one JSON line into a request, or raise _BadRequest saying why."""
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _BadRequest(f"not JSON ({exc})") from exc
    if not isinstance(record, dict):
        raise _BadRequest("not a JSON object")
    version = record.get("version", 1)
    if version != 1 or isinstance(version, bool):
        raise _BadRequest(f"unsupported version {version!r}")
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise _BadRequest(f"pid must be a positive integer, got {pid!r}")
    scope_id = record.get("scope_id")
    if not isinstance(scope_id, str):
        raise _BadRequest(f"scope_id must be a string, got {scope_id!r}")
    expiration = record.get("expiration_time")
    if (
        not isinstance(expiration, (int, float))
        or isinstance(expiration, bool)
        or not math.isfinite(expiration)
    ):
        raise _BadRequest(f"expiration_time must be a finite number, got {expiration!r}")
    signo = record.get("signal", int(signal_module.SIGKILL))
    if signo is None:
        signo = int(signal_module.SIGKILL)
    if not isinstance(signo, int) or isinstance(signo, bool):
        raise _BadRequest(f"signal must be an integer, got {signo!r}")
    if signo > 0 and signo not in _VALID_SIGNALS:
        raise _BadRequest(f"signal {signo} is not a valid signal number")
    return _Request(pid=pid, scope_id=scope_id, expiration_time=float(expiration), signal=signo)


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
    """Serve file timers on a FIFO and kill the workers whose timers expire.

    Args:
        file_path: path of the FIFO; created (mode 0600) if missing, removed on ``stop`` if
            this server created it.
        poll_interval_s: the longest the loop waits between turns (its progress heartbeat and
            the sweep for exited pids); expiries are acted on at their deadline, not at a poll.
        is_known_pid: answers whether a pid may be managed (a worker of this agent); requests
            for other pids are ignored with a warning.
        on_expired: called on the server's thread for every expired timer, after the kill.
        max_line_bytes: longest accepted request line, newline excluded.

    Raises:
        ConfigurationError: ``poll_interval_s`` or ``max_line_bytes`` is not positive.
    """

    def __init__(
        self,
        file_path: str,
        *,
        poll_interval_s: float = 0.1,
        is_known_pid: Callable[[int], bool],
        on_expired: Callable[[TimerExpiry], None],
        max_line_bytes: int = select.PIPE_BUF,
    ) -> None:
        if not poll_interval_s > 0:
            raise ConfigurationError(
                f"watchdog poll interval must be positive, got {poll_interval_s}"
            )
        if max_line_bytes <= 0:
            raise ConfigurationError(
                f"watchdog max line size must be positive, got {max_line_bytes}"
            )
        self._file_path = file_path
        self._poll_interval_s = poll_interval_s
        self._is_known_pid = is_known_pid
        self._on_expired = on_expired
        self._max_line_bytes = max_line_bytes
        self._lock = threading.Lock()
        self._timers: dict[tuple[int, str], _Request] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._fifo_fd = -1
        self._wake_r = -1
        self._wake_w = -1
        self._created_fifo = False
        self._last_progress = time.monotonic()
        # Reader state, touched only by the server thread.
        self._buffer = bytearray()
        self._discarding = False
        self._partial_since = 0.0
        self._next_sweep = 0.0

    @property
    def file_path(self) -> str:
        """The FIFO path workers write to (TORCHELASTIC_TIMER_FILE)."""
        return self._file_path

    @property
    def last_progress(self) -> float:
        """``time.monotonic()`` at the last turn of the server loop (for the health check)."""
        return self._last_progress

    def armed_timers(self) -> tuple[ArmedTimer, ...]:
        """Return a snapshot of the timers held now, earliest expiry first."""
        with self._lock:
            requests = sorted(self._timers.values(), key=lambda r: r.expiration_time)
        return tuple(ArmedTimer(r.pid, r.scope_id, r.expiration_time, r.signal) for r in requests)

    def clear_pid(self, pid: int) -> None:
        """Drop every timer of ``pid`` (the agent calls this when it stops a worker).

        Args:
            pid: the worker's process id.
        """
        with self._lock:
            for key in [k for k in self._timers if k[0] == pid]:
                del self._timers[key]

    def start(self) -> None:
        """Create the FIFO if needed, open it and start the server thread.

        Raises:
            ConfigurationError: the path exists and is not a FIFO, or cannot be created.
            AgentError: the server was already started.
        """
        if self._thread is not None:
            raise AgentError(f"watchdog on {self._file_path} is already started")
        self._open_fifo()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._stopping.clear()
        self._last_progress = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, name=f"file-timer-watchdog:{self._file_path}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (bounded join), close the FIFO and remove it if this server made it.

        Args:
            timeout_s: the longest to wait for the thread to end.

        Raises:
            AgentError: the thread did not end within ``timeout_s``.
        """
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        thread.join(timeout_s)
        if thread.is_alive():
            raise AgentError(f"watchdog thread on {self._file_path} did not stop in {timeout_s} s")
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
        with self._lock:
            self._timers.clear()

    def _open_fifo(self) -> None:
        try:
            mode = os.stat(self._file_path).st_mode
        except FileNotFoundError:
            try:
                os.mkfifo(self._file_path, 0o600)
            except OSError as exc:
                raise ConfigurationError(
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
            try:
                self._turn()
            except Exception:
                # A bug of ours, not the input's: keep watching rather than leave workers
                # unguarded, but say it loudly.
                logger.exception("watchdog on %s: unexpected error in the loop", self._file_path)
                self._stopping.wait(self._poll_interval_s)

    def _turn(self) -> None:
        timeout_s = self._poll_interval_s
        with self._lock:
            if self._timers:
                earliest = min(r.expiration_time for r in self._timers.values())
                timeout_s = min(timeout_s, max(0.0, earliest - time.time()))
        readable, _, _ = select.select([self._fifo_fd, self._wake_r], [], [], timeout_s)
        if self._fifo_fd in readable:
            self._read_pipe()
        if self._wake_r in readable:
            try:
                os.read(self._wake_r, 64)
            except BlockingIOError:
                pass
        self._expire_due()
        now = time.monotonic()
        if self._buffer or self._discarding:
            self._drop_partial_if_stale(now)
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
        if not self._buffer and not self._discarding:
            self._partial_since = time.monotonic()
        self._buffer.extend(chunk)
        while True:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                break
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            if self._discarding:
                self._discarding = False
                continue
            self._handle_line(line)
            self._partial_since = time.monotonic()
        if len(self._buffer) > self._max_line_bytes and not self._discarding:
            logger.warning(
                "watchdog on %s: dropping a request line longer than %d bytes",
                self._file_path,
                self._max_line_bytes,
            )
            self._discarding = True
        if self._discarding:
            self._buffer.clear()

    def _drop_partial_if_stale(self, now: float) -> None:
        # Conforming clients write whole lines atomically, so a tail that stays incomplete for a
        # whole poll interval was left by a client that died mid-write (or wrote garbage).
        if self._buffer and now - self._partial_since >= self._poll_interval_s:
            logger.warning(
                "watchdog on %s: dropping an incomplete request of %d bytes",
                self._file_path,
                len(self._buffer),
            )
            self._buffer.clear()
        if self._discarding and now - self._partial_since >= self._poll_interval_s:
            self._discarding = False

    def _handle_line(self, line: bytes) -> None:
        line = line.strip()
        if not line:
            return
        if len(line) > self._max_line_bytes:
            logger.warning(
                "watchdog on %s: dropping a request line of %d bytes (limit %d)",
                self._file_path,
                len(line),
                self._max_line_bytes,
            )
            return
        try:
            request = _parse_request(line)
        except _BadRequest as exc:
            # A client that died mid-write leaves a fragment that the next atomic line is
            # appended to: salvage that last record rather than lose it.
            start = line.rfind(_RECORD_START)
            if start > 0:
                logger.warning(
                    "watchdog on %s: dropping %d bytes of a broken request before a valid one",
                    self._file_path,
                    start,
                )
                self._handle_line(line[start:])
                return
            logger.warning(
                "watchdog on %s: ignoring a bad request (%s): %.200r",
                self._file_path,
                exc,
                line,
            )
            return
        self._apply(request)

    def _apply(self, request: _Request) -> None:
        key = (request.pid, request.scope_id)
        if request.expiration_time < 0:
            with self._lock:
                self._timers.pop(key, None)
            return
        try:
            known = self._is_known_pid(request.pid)
        except Exception:
            logger.exception(
                "watchdog on %s: is_known_pid(%d) failed", self._file_path, request.pid
            )
            known = False
        if not known:
            logger.warning(
                "watchdog on %s: ignoring a timer for pid %d, which is not a known worker",
                self._file_path,
                request.pid,
            )
            return
        with self._lock:
            self._timers[key] = request

    def _expire_due(self) -> None:
        now = time.time()
        with self._lock:
            due = [r for r in self._timers.values() if r.expiration_time <= now]
            for request in due:
                del self._timers[(request.pid, request.scope_id)]
        for request in sorted(due, key=lambda r: r.expiration_time):
            self._expire(request)

    def _expire(self, request: _Request) -> None:
        killed_at: float | None = None
        if request.signal > 0:
            if _has_exited(request.pid):
                return
            try:
                os.kill(request.pid, request.signal)
                killed_at = time.time()
            except ProcessLookupError:
                return
            except PermissionError:
                logger.warning(
                    "watchdog on %s: not allowed to signal pid %d for expired scope %r",
                    self._file_path,
                    request.pid,
                    request.scope_id,
                )
        logger.warning(
            "watchdog on %s: timer %r of pid %d expired %.3f s ago; %s",
            self._file_path,
            request.scope_id,
            request.pid,
            time.time() - request.expiration_time,
            f"sent signal {request.signal}" if killed_at is not None else "no signal sent",
        )
        expiry = TimerExpiry(
            pid=request.pid,
            scope_id=request.scope_id,
            signal=request.signal,
            expired_at=request.expiration_time,
            killed_at=killed_at,
        )
        try:
            self._on_expired(expiry)
        except Exception:
            logger.exception("watchdog on %s: on_expired callback failed", self._file_path)

    def _sweep_exited(self) -> None:
        with self._lock:
            pids = {pid for pid, _ in self._timers}
        gone = [pid for pid in pids if _has_exited(pid)]
        for pid in gone:
            self.clear_pid(pid)
