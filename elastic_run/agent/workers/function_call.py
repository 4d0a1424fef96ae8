"""Inside a function worker: the callable entrypoint run under the worker contract of a program.

When ``WorkerSpec.entrypoint`` is a Python callable, each worker is a process that the agent
starts through :mod:`multiprocessing` (``agent/workers/function_workers.py``), whose target is
:func:`run_call`. Before it calls ``entrypoint(*args)``, the process puts itself where a
program worker stands from its first instruction:

1. its own session (process group), so the agent stops it and its whole tree as one, and the
   agent's terminal signals do not reach it directly;
2. a parent-death signal (SIGKILL) tied to the agent, and an exit if the agent is already gone;
   then its session registered with the agent's guardian by the worker itself, on the
   guardian's pipe (the agent registers it too, but may die before it does: a worker that
   holds the pipe's write end is registered before the guardian can see its end);
3. default signal dispositions (a forked worker inherits the agent's handlers);
4. its stdout and stderr on the agent's pipes or log files (line-buffered, as ``python -u``
   is for a console), no stdin;
5. the worker's torchrun environment in ``os.environ`` (a spawned interpreter starts with the
   agent's).

Then it calls the entrypoint as torch does, under ``@record``: an exception (or a non-zero
``SystemExit``) goes to ``TORCHELASTIC_ERROR_FILE`` in torch's format and the process exits 1;
a return value goes to ``result_path``, whence the agent reads it into
``RunResult.return_values``. Return values cross as multiprocessing pickles, as torch's return
queues carry them: the file lies in a directory only the agent's user can open, written by
the agent's own child, never in a store that other hosts can write.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing import reduction
from typing import Any

from elastic_run.parent_death import set_parent_death_signal
from elastic_run.worker import record

__all__ = ["AGENT_GONE_EXIT", "ChildFd", "FunctionCall", "read_result", "run_call"]

# A worker whose agent died before it could tie itself to it exits with this code, silently.
AGENT_GONE_EXIT = 70
# Signals the agent handles; a forked worker must not keep the agent's handlers for them.
_AGENT_SIGNALS = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


class ChildFd:
    """A file descriptor of the agent handed to a worker process under the same number.

    A forked worker inherits it; for a spawned one, pickling it (in ``Process.start``) asks
    multiprocessing to pass it on (``reduction.DupFd``).

    Args:
        fd: the descriptor in the agent.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Callable[[Any], ChildFd], tuple[Any]]:
        return _rebuild_fd, (reduction.DupFd(self.fd),)


def _rebuild_fd(dup: Any) -> ChildFd:
    return ChildFd(int(dup.detach()))


@dataclass(frozen=True)
class FunctionCall:
    """Everything a function worker needs, sent to it as its process target's argument.

    Attributes:
        fn: the entrypoint.
        args: its arguments.
        env: the worker's complete environment.
        stdout: where its stdout goes (None: nowhere).
        stderr: where its stderr goes (None: nowhere).
        result_path: where it writes its return value.
        agent_pid: the agent's process id (the worker's parent).
        close_fds: descriptors of the agent that a forked worker must close (the guardian's
            pipe, whose end-of-file means the agent is gone).
        guardian: the write end of the guardian's pipe, on which the worker registers its own
            session and which it then closes; None: no guardian.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    env: Mapping[str, str]
    stdout: ChildFd | None
    stderr: ChildFd | None
    result_path: str
    agent_pid: int
    close_fds: tuple[int, ...] = ()
    guardian: ChildFd | None = None


def run_call(call: FunctionCall) -> None:
    """The target of a function worker's process: settle in, then run the entrypoint.

    Args:
        call: what to run and where its output, return value and errors go.

    Raises:
        BaseException: whatever the entrypoint raised, after it was recorded (the process then
            exits 1, with its traceback on its stderr).
    """
    _detach(call.agent_pid)
    if call.guardian is not None:
        _register(call.guardian.fd)
    _default_signals()
    for fd in call.close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    _redirect(call.stdout, call.stderr)
    os.environ.clear()
    os.environ.update(call.env)
    record(_call_and_keep)(call)


def _call_and_keep(call: FunctionCall) -> None:
    value = call.fn(*call.args)
    data = reduction.ForkingPickler.dumps(value)
    tmp = f"{call.result_path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, call.result_path)


def read_result(path: str) -> Any:
    """Read a function worker's return value (in the agent).

    Args:
        path: the worker's ``result_path``.

    Returns:
        The value; None when the worker wrote none (it ended with ``sys.exit(0)``).

    Raises:
        OSError: the file cannot be read.
        Exception: the value cannot be unpickled here (whatever its class raises).
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return reduction.ForkingPickler.loads(data)


def _detach(agent_pid: int) -> None:
    try:
        os.setsid()
    except OSError:
        pass  # a session leader already
    set_parent_death_signal()
    if os.getppid() != agent_pid:  # the agent died before the signal was tied to it
        os._exit(AGENT_GONE_EXIT)


def _register(guardian_fd: int) -> None:
    try:
        os.write(guardian_fd, f"+{os.getsid(0)}\n".encode("ascii"))
    except OSError:
        pass  # the guardian is gone: the agent reports that on its own register
    finally:
        os.close(guardian_fd)


def _default_signals() -> None:
    for name in _AGENT_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)


def _redirect(stdout: ChildFd | None, stderr: ChildFd | None) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    for target, source in ((1, stdout), (2, stderr)):
        fd = source.fd if source is not None else devnull
        if fd != target:
            os.dup2(fd, target)
        if source is not None and source.fd > 2:
            os.close(source.fd)
    os.close(devnull)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(  # noqa: SIM115
        2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
    )
