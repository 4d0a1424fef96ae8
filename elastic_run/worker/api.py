"""What a training script may import: error recording, the watchdog client, the env contract.

This module is the worker's side of the agent's contracts and nothing else: it imports no part
of the agent, the CLI or the rendezvous, and no torch, so that importing it costs nothing.

- :func:`record` writes ``TORCHELASTIC_ERROR_FILE`` in torch's format when the wrapped main
  raises, so the agent can name the root cause of a failure.
- :func:`expires`, :func:`configure` and :class:`FileTimerClient` arm timers on the agent's
  file-timer watchdog (``TORCHELASTIC_TIMER_FILE``), called like torch's
  ``torch.distributed.elastic.timer`` and speaking its ``FileTimerClient`` protocol (the format:
  :mod:`elastic_run.worker.timer_wire`): one JSON line of at most ``PIPE_BUF`` bytes per request,
  written with a single ``write`` so it is atomic.
- :func:`progress` (one call per training step) and :func:`sync_point` feed the agent's hang
  and straggler verdicts through a shared-memory slot (:mod:`elastic_run.worker.beat_file`): no system
  call per call, well under a microsecond; a no-op when the agent gave no beat file.
- :class:`WorkerEnv` gives typed access to the environment the agent sets for each worker.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import signal as signal_module
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import ParamSpec, Protocol, TypeVar

from elastic_run.errors import ConfigurationError, ElasticRunError
from elastic_run.worker.beat_file import shared_writer
from elastic_run.worker.timer_wire import (
    RELEASE_EXPIRATION,
    FileTimerRequest,
    TimerWireError,
    encode_request,
)

__all__ = [
    "ERROR_FILE_ENV",
    "TIMER_FILE_ENV",
    "FileTimerClient",
    "FileTimerRequest",
    "TimerClient",
    "TimerClientError",
    "WatchdogUnreachableError",
    "WorkerEnv",
    "WorkerEnvError",
    "configure",
    "expires",
    "progress",
    "record",
    "sync_point",
    "write_error_data",
    "write_error_file",
]

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
TIMER_FILE_ENV = "TORCHELASTIC_TIMER_FILE"

_P = ParamSpec("_P")
_R = TypeVar("_R")


class TimerClientError(ElasticRunError, RuntimeError):
    """A timer request could not be made: no client, or a request the wire cannot carry.

    Also a ``RuntimeError``, as torch's ``expires`` raises without a configured client and
    torch's ``FileTimerClient`` raises for a request longer than ``PIPE_BUF``.
    """


class WatchdogUnreachableError(TimerClientError, BrokenPipeError):
    """No watchdog reads the timer pipe (it does not exist, has no reader, or is full).

    Also a ``BrokenPipeError``, as torch's ``FileTimerClient`` raises when its server is not
    available.
    """


class WorkerEnvError(ConfigurationError):
    """The worker's environment lacks a variable of the launcher contract or has a bad value."""


# --------------------------------------------------------------------------- error file


def _error_record(exc: BaseException, callstack: str) -> dict[str, object]:
    return {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {"py_callstack": callstack, "timestamp": str(int(time.time()))},
        }
    }


def write_error_file(path: str, exc: BaseException, callstack: str | None = None) -> None:
    """Write ``exc`` to ``path`` in torch's error-file format, atomically.

    The file is written to a temporary name in the same directory and renamed into place, so
    the agent never reads half a file.

    Args:
        path: the error file (usually the value of ``TORCHELASTIC_ERROR_FILE``).
        exc: the exception to record.
        callstack: the formatted traceback; by default the one of ``exc``.

    Raises:
        OSError: the file could not be written.
    """
    if callstack is None:
        callstack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    write_error_data(path, _error_record(exc, callstack))


def write_error_data(path: str, data: Mapping[str, object]) -> None:
    """Write an error record (the JSON object of an error file) to ``path``, atomically.

    Args:
        path: the error file.
        data: the record, e.g. a child's record passed up to the agent's own error file.

    Raises:
        OSError: the file could not be written.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(prefix=".error-", suffix=".json.tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            json.dump(data, tmp)
        os.replace(tmp_path, path)
    except BaseException:
        try:
            os.unlink(tmp_path)
        except FileNotFoundError:
            pass
        raise


def _is_failure(exc: BaseException) -> bool:
    if isinstance(exc, SystemExit):
        return exc.code not in (0, None)
    return isinstance(exc, Exception)


def record(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorate a worker's main so an uncaught exception is written to the error file.

    Like torch's ``torch.distributed.elastic.multiprocessing.errors.record``: when ``fn``
    raises, the exception is written to ``TORCHELASTIC_ERROR_FILE`` (when that variable is set)
    and re-raised. ``SystemExit`` with code 0 or None and ``KeyboardInterrupt`` are not errors.

    Args:
        fn: the function to wrap, usually ``main``.

    Returns:
        The wrapped function, with the same signature.
    """

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            path = os.environ.get(ERROR_FILE_ENV)
            if path and _is_failure(exc):
                try:
                    write_error_file(path, exc, traceback.format_exc())
                except OSError as write_exc:
                    print(
                        f"elastic_run.worker.record: cannot write the error file {path}: "
                        f"{write_exc}",
                        file=sys.stderr,
                    )
            raise

    return wrapper


# --------------------------------------------------------------------------- file timers


class TimerClient(Protocol):
    """What :func:`expires` needs of a timer client: torch's ``TimerClient`` methods.

    :class:`FileTimerClient` is one, and so is torch's ``FileTimerClient``.
    """

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Arm (or re-arm) the timer ``scope_id`` of this process to expire at the given time."""

    def release(self, scope_id: str) -> None:
        """Disarm the timer ``scope_id`` of this process."""


class FileTimerClient:
    """Client of the agent's file-timer watchdog, called and wire-compatible like torch's.

    Each request is one line (:func:`elastic_run.worker.timer_wire.encode_request`) written with a
    single ``os.write`` to the FIFO opened ``O_WRONLY | O_NONBLOCK``; lines are at most
    ``PIPE_BUF`` bytes so that writes from many workers never interleave.

    Args:
        file_path: the FIFO the watchdog serves (``TORCHELASTIC_TIMER_FILE``).
        signal: the signal the watchdog sends when a timer expires (0 or negative: none).
    """

    def __init__(self, file_path: str, signal: int = signal_module.SIGKILL) -> None:
        self.file_path = file_path
        self.signal = int(signal)

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Arm (or re-arm) the timer ``scope_id`` of this process.

        Args:
            scope_id: the timer's name, unique within this process.
            expiration_time: when it expires, epoch seconds (``time.time()`` based).

        Raises:
            WatchdogUnreachableError: no watchdog reads the pipe (a ``BrokenPipeError``).
            TimerClientError: the request is invalid or too long (a ``RuntimeError``).
        """
        self._send(scope_id, expiration_time, self.signal)

    def release(self, scope_id: str) -> None:
        """Disarm the timer ``scope_id`` of this process.

        Args:
            scope_id: the timer's name.

        Raises:
            WatchdogUnreachableError: no watchdog reads the pipe (a ``BrokenPipeError``).
            TimerClientError: the request is too long (a ``RuntimeError``).
        """
        self._send(scope_id, RELEASE_EXPIRATION, 0)

    def _send(self, scope_id: str, expiration_time: float, signo: int) -> None:
        try:
            line = encode_request(FileTimerRequest(os.getpid(), scope_id, expiration_time, signo))
        except TimerWireError as exc:
            raise TimerClientError(str(exc)) from exc
        try:
            fd = os.open(self.file_path, os.O_WRONLY | os.O_NONBLOCK)
        except FileNotFoundError as exc:
            raise WatchdogUnreachableError(
                f"the watchdog pipe {self.file_path} does not exist; is the agent's file timer "
                f"enabled (TORCHELASTIC_ENABLE_FILE_TIMER=1)?"
            ) from exc
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a FIFO that no process reads
                raise WatchdogUnreachableError(
                    f"no watchdog is reading the timer pipe {self.file_path}"
                ) from exc
            raise WatchdogUnreachableError(
                f"cannot open the watchdog pipe {self.file_path}: {exc.strerror}"
            ) from exc
        try:
            written = os.write(fd, line)
        except BlockingIOError as exc:
            raise WatchdogUnreachableError(
                f"the watchdog pipe {self.file_path} is full; the watchdog is not keeping up"
            ) from exc
        except OSError as exc:
            raise WatchdogUnreachableError(
                f"cannot write to the watchdog pipe {self.file_path}: {exc.strerror}"
            ) from exc
        finally:
            os.close(fd)
        if written != len(line):  # cannot happen for writes <= PIPE_BUF, but never be silent
            raise TimerClientError(
                f"short write to the watchdog pipe {self.file_path} ({written} of {len(line)})"
            )


_configured_client: TimerClient | None = None


def configure(timer_client: TimerClient | None) -> None:
    """Set the client :func:`expires` uses when it is given none (torch's ``configure``).

    Args:
        timer_client: any object with ``acquire(scope_id, expiration_time)`` and
            ``release(scope_id)``: a :class:`FileTimerClient`, or torch's. None forgets the
            configured client (then :func:`expires` uses ``TORCHELASTIC_TIMER_FILE``).
    """
    global _configured_client
    _configured_client = timer_client


def _caller_scope(depth: int) -> str:
    frame = sys._getframe(depth + 1)
    return f"{frame.f_code.co_filename}#{frame.f_lineno}"


@contextmanager
def _armed(client: TimerClient, scope: str, after: float) -> Iterator[None]:
    client.acquire(scope, time.time() + after)
    try:
        yield
    finally:
        client.release(scope)


def expires(
    after: float, scope: str | None = None, client: TimerClient | None = None
) -> AbstractContextManager[None]:
    """Arm a watchdog timer for the ``with`` block: the worker is killed if it overruns.

    Called like torch's ``expires``. Usage::

        with expires(after=60, scope="train_step"):
            train_step()

    Args:
        after: seconds from now after which the watchdog kills this process.
        scope: the timer's name; by default ``"<file>#<line>"`` of the caller.
        client: the client to use; by default the one given to :func:`configure`, else a
            :class:`FileTimerClient` on ``TORCHELASTIC_TIMER_FILE``.

    Returns:
        A context manager that arms the timer on entry and releases it on exit.

    Raises:
        TimerClientError: no client was given or configured and ``TORCHELASTIC_TIMER_FILE`` is
            not set (raised here), or the watchdog cannot be reached (raised on entry or exit).
    """
    if scope is None:
        scope = _caller_scope(1)
    if client is None:
        client = _configured_client
    if client is None:
        path = os.environ.get(TIMER_FILE_ENV)
        if not path:
            raise TimerClientError(
                f"{TIMER_FILE_ENV} is not set: the agent's file-timer watchdog is not enabled "
                f"(run with TORCHELASTIC_ENABLE_FILE_TIMER=1) and no client was given or "
                f"configured"
            )
        client = FileTimerClient(path)
    return _armed(client, scope, after)


# --------------------------------------------------------------------------- progress beats


def progress(step: int | None = None) -> None:
    """Tell the agent this worker finished a training step (a progress beat).

    Optional in a script that steps a torch optimizer: elastic-run beats once per optimizer step
    by itself (``--no-auto-progress`` turns it off). Call it to name the step (a call after an
    optimizer step takes that step's beat over: it is not counted twice), or to beat where no
    optimizer steps, once per step, at the step's end. The agent learns the usual gap between
    beats and judges a worker hung when it stays silent far longer (``--hang-timeout``); it also
    shows each rank's step time and flags slow ranks. A no-op outside an elastic-run worker. The
    first call maps the agent's beat file; every later call is a few stores into shared memory.

    Args:
        step: the step number to show in ``elastic-run status`` (default: the count of calls).

    Raises:
        TypeError: ``step`` is not an int.
    """
    writer = shared_writer()
    if writer is None:
        return
    try:
        writer.beat(step)
    except TypeError:
        raise TypeError(f"progress(step): step must be an int, got {type(step).__name__}") from None


def sync_point() -> None:
    """Optional: this rank's own work of the step is done; it now waits for its peers.

    Call it just before the step's first collective (``all_reduce``, the optimizer step). In
    synchronous training every rank's step takes as long as the slowest's, so the time between
    two :func:`progress` calls cannot tell which rank is slow; the time from a beat to the next
    ``sync_point()`` (this rank's own work) can, and straggler detection then compares that.
    A no-op outside an elastic-run worker and before the first :func:`progress`.
    """
    writer = shared_writer()
    if writer is not None:
        writer.sync_point()


# --------------------------------------------------------------------------- env contract


@dataclass(frozen=True)
class WorkerEnv:
    """The launcher's environment contract for one worker, typed.

    Attributes mirror torchrun's variables: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR,
    MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID.
    """

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int
    group_world_size: int
    role_rank: int
    role_world_size: int
    role_name: str
    master_addr: str
    master_port: int
    restart_count: int
    max_restarts: int
    run_id: str

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv:
        """Read the contract from ``environ`` (default: ``os.environ``).

        Args:
            environ: the environment to read.

        Returns:
            The typed environment.

        Raises:
            WorkerEnvError: a variable is missing or is not an integer where one is required.
        """
        env: Mapping[str, str] = os.environ if environ is None else environ

        def text(name: str) -> str:
            try:
                return env[name]
            except KeyError:
                raise WorkerEnvError(
                    f"environment variable {name} is not set; is this process started by "
                    f"elastic-run or torchrun?"
                ) from None

        def number(name: str) -> int:
            value = text(name)
            try:
                return int(value)
            except ValueError:
                raise WorkerEnvError(
                    f"environment variable {name} must be an integer, got {value!r}"
                ) from None

        return cls(
            rank=number("RANK"),
            local_rank=number("LOCAL_RANK"),
            world_size=number("WORLD_SIZE"),
            local_world_size=number("LOCAL_WORLD_SIZE"),
            group_rank=number("GROUP_RANK"),
            group_world_size=number("GROUP_WORLD_SIZE"),
            role_rank=number("ROLE_RANK"),
            role_world_size=number("ROLE_WORLD_SIZE"),
            role_name=text("ROLE_NAME"),
            master_addr=text("MASTER_ADDR"),
            master_port=number("MASTER_PORT"),
            restart_count=number("TORCHELASTIC_RESTART_COUNT"),
            max_restarts=number("TORCHELASTIC_MAX_RESTARTS"),
            run_id=text("TORCHELASTIC_RUN_ID"),
        )
