"""A child process that cannot outlive its deadline: the one way the node check runs anything.

One concept: run a command in a session of its own, collect its output (stdout and stderr
together, the first :data:`MAX_OUTPUT_BYTES` kept), and end its whole process group with SIGKILL
when its leader exits or the deadline comes, whichever is first. So a user's command that forks
a sleeping child and hangs, or a device probe stuck in a wedged driver, never hangs the agent
and leaves nothing running behind it.

How, and why:
- the leader's exit is seen without reaping it (``waitid(..., WNOWAIT)``), so the group is
  killed while the leader's id still names it: the id cannot have been given to another process;
- the output pipe is read all along (a chatty child never blocks on a full pipe), and after the
  group is killed only until :data:`DRAIN_S` has passed: a process that left the group
  (``setsid``) and holds the pipe does not hold the agent;
- a process that does not die on SIGKILL (stuck in the kernel, a wedged driver) is waited for
  :data:`REAP_S` at most and then left to the interpreter to reap; the result says so. So a
  run ends by its deadline, plus at most DRAIN_S + REAP_S (2.5 s) where something resists;
- the leader gets the parent-death signal (``parent_death``): when the agent itself is
  SIGKILLed mid-check, the child dies with it.

What it cannot catch: a descendant that made a session of its own (``setsid``, a daemon) is
outside the group and is not killed.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from elastic_run.parent_death import death_signal_prefix, set_parent_death_signal

__all__ = ["BoundedRun", "DRAIN_S", "MAX_OUTPUT_BYTES", "REAP_S", "run_bounded"]

MAX_OUTPUT_BYTES = 64 * 1024
"""The output kept of a child: its first 64 KiB (the rest is read and dropped)."""
DRAIN_S = 0.5
"""How long the pipe is read after the group was killed, for what the child wrote last."""
REAP_S = 2.0
"""How long a killed leader is waited for before it is left to the interpreter to reap."""
_POLL_S = 0.05  # where no pidfd tells of the leader's exit: how often to look


@dataclass(frozen=True)
class BoundedRun:
    """How a bounded child ended.

    Attributes:
        exit_code: the leader's exit status (negative: killed by that signal, as
            ``subprocess``); None when it was cut at its deadline or never started.
        output: what it wrote (stdout and stderr together, the first MAX_OUTPUT_BYTES), decoded
            as UTF-8 with undecodable bytes replaced.
        timed_out: it was still running at its deadline and was killed.
        duration_s: from the start to the end of the run, the clean-up included.
        error: why it could not be started, or that its leader did not die on SIGKILL; None
            otherwise.
    """

    exit_code: int | None
    output: str
    timed_out: bool
    duration_s: float
    error: str | None = None


def run_bounded(
    argv: Sequence[str],
    timeout_s: float,
    *,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> BoundedRun:
    """Run ``argv`` for at most ``timeout_s``; nothing in its process group survives the call.

    Args:
        argv: the program and its arguments (no shell: pass ``/bin/sh -c CMD`` for one).
        timeout_s: its deadline from now (0 or less: it is started and killed at once).
        env: its environment; None: this process's.
        clock: monotonic seconds (the deadline and the duration).

    Returns:
        How it ended.
    """
    start = clock()
    deadline = start + timeout_s
    prefix = death_signal_prefix()
    try:
        proc = subprocess.Popen(
            [*prefix, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            start_new_session=True,
            preexec_fn=None if prefix else set_parent_death_signal,
        )
    except OSError as exc:
        return BoundedRun(None, "", False, clock() - start, f"cannot start {argv[0]}: {exc}")
    assert proc.stdout is not None
    reader = _Output(proc.stdout.fileno())
    exited = _ExitWatch(proc)
    timed_out = False
    try:
        while not exited.has_exited():
            left = deadline - clock()
            if left <= 0:
                timed_out = True
                break
            reader.read_for(min(left, _POLL_S) if exited.fd is None else left, exited.fd)
    finally:
        _kill_group(proc.pid)  # the leader, dead or alive, still holds the group's id
        exited.close()
    reader.drain(DRAIN_S, clock)
    proc.stdout.close()
    error = None
    try:
        proc.wait(REAP_S)
    except subprocess.TimeoutExpired:
        name = os.path.basename(argv[0])
        error = f"{name} did not die on SIGKILL within {REAP_S:g} s (stuck in the kernel?)"
    return BoundedRun(
        exit_code=None if timed_out else proc.returncode,
        output=reader.text(),
        timed_out=timed_out,
        duration_s=clock() - start,
        error=error,
    )


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # every member is gone already
    except PermissionError:
        pass  # the group holds only a zombie leader on some kernels: nothing left to kill


class _ExitWatch:
    """Whether the child has exited, told without reaping it (its id keeps naming its group).

    A pidfd (Linux 5.3+) becomes readable at the exit, so the read loop wakes at once; where
    there is none (an older kernel, a sandbox), the loop looks every ``_POLL_S``. Where
    ``waitid(WNOWAIT)`` itself is refused (a sandbox that lacks it), the child is reaped by
    ``Popen.poll`` instead: its group is killed a moment after its id was freed, which only a
    process that took that id and made it its group's in that moment could feel.
    """

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        self._peek = True
        self.fd: int | None = None
        try:
            self.fd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            self.fd = None

    def has_exited(self) -> bool:
        """Whether the child is a zombie (or gone); not reaped where ``waitid`` allows."""
        if self._peek:
            try:
                flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
                return os.waitid(os.P_PID, self._proc.pid, flags) is not None
            except ChildProcessError:
                return True
            except OSError:
                self._peek = False
        return self._proc.poll() is not None

    def close(self) -> None:
        """Close the pidfd, if any."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _Output:
    """The child's output pipe, read without blocking; keeps the first MAX_OUTPUT_BYTES."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._kept = bytearray()
        self._eof = False
        os.set_blocking(fd, False)

    def read_for(self, wait_s: float, wake_fd: int | None) -> None:
        """Read what comes within ``wait_s``, returning early when ``wake_fd`` is readable.

        With the pipe at its end and no ``wake_fd``, this only waits ``wait_s`` (an empty
        selector still honours its timeout), so the caller's loop never spins.
        """
        with selectors.DefaultSelector() as selector:
            if not self._eof:
                selector.register(self._fd, selectors.EVENT_READ)
            if wake_fd is not None:
                selector.register(wake_fd, selectors.EVENT_READ)
            for key, _ in selector.select(max(0.0, wait_s)):
                if key.fd == self._fd:
                    self._read_once()

    def drain(self, limit_s: float, clock: Callable[[], float]) -> None:
        """Read until the end of the pipe, for at most ``limit_s``."""
        until = clock() + limit_s
        while not self._eof:
            left = until - clock()
            if left <= 0:
                return
            self.read_for(left, None)

    def text(self) -> str:
        """What was kept, decoded."""
        return self._kept.decode("utf-8", errors="replace")

    def _read_once(self) -> None:
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        if not data:
            self._eof = True
            return
        room = MAX_OUTPUT_BYTES - len(self._kept)
        if room > 0:
            self._kept += data[:room]
