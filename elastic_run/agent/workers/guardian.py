"""The guardian: a tiny process that kills every worker session when the agent dies.

A worker's parent-death signal kills the worker when the agent dies, but not the worker's own
children. The agent therefore starts one guardian (``python -m elastic_run.agent.workers.guardian``, or this
file run by path) and tells it, over the guardian's stdin pipe, the session id of every worker it
spawns. The guardian holds nothing else: when the pipe reaches EOF (the agent exited or was
SIGKILLed, whichever of its threads was running), it SIGKILLs every process in those sessions,
every process that it saw descend from them (a grandchild that called ``setsid``), and every
process whose exec-time environment (``/proc/<pid>/environ``) carries this agent's token, then
exits.

The token closes the window between a worker's start and its registration: a worker runs its own
code at once, and an agent SIGKILLed before its ``+<sid>`` line was written leaves a session that
nobody guards. Every worker's environment holds ``ELASTIC_RUN_GUARDIAN=<token>`` (a random token
per agent, given to the guardian in its argv), so a cold worker, a warm worker (forked by the
zygote, whose exec environment carries it) and whatever either one starts, forked or exec'd, is
found by the token alone. A function worker's own ``/proc`` environment is the agent's (a fork,
or a spawned interpreter), so it registers its session itself, on the guardian's pipe, before it
runs the entrypoint (``function_call.py``); the grandchildren it execs carry the token too. What
still escapes, when the agent dies before registering: a process started with an environment
stripped of the token, in a session of its own.

Protocol (one ASCII line per command, each far below PIPE_BUF so writes are atomic)::

    +<sid>    start guarding session <sid> (sent by the agent, or by a function worker itself)
    -<sid>    stop guarding session <sid> (its processes are gone; the id may be reused)
    =         rescan /proc for escaped descendants now, then answer "=" on stdout

Invariants:
- The guardian process imports only the standard library (start-up time matters, and it runs with
  ``-I -S``): no torch, no psutil, nothing of elastic_run. It reads ``/proc`` itself.
- It runs in a session of its own and ignores SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2, so a
  Ctrl-C meant for the agent's process group, or a Slurm preemption notice sent to every process
  of the step, does not take it down before it has done its work.
- While sessions are registered it rescans ``/proc`` every ``_TRACK_INTERVAL_S`` to remember
  descendants that left their session (pid plus start time, so a reused pid is never killed).
- The pipe's write end is close-on-exec: only the agent holds it (and a function worker, for as
  long as it takes to register itself), so EOF means the agent is gone.
- The token is matched only in the final kill rounds, never to decide anything while the agent
  lives; the guardian never kills itself.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType

__all__ = ["GUARDIAN_ENV", "Guardian", "ProcInfo", "main", "scan_processes"]

# Signals the guardian ignores (it must outlive them until the agent is gone).
_IGNORED = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

GUARDIAN_ENV = "ELASTIC_RUN_GUARDIAN"
"""The worker variable that holds the agent's guardian token."""

_TRACK_INTERVAL_S = 0.5
_KILL_ROUNDS = 200
_KILL_ROUND_PAUSE_S = 0.01
_CLOSE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ProcInfo:
    """One process as its ``/proc/PID/stat`` reads (pid, parent, session, start time, zombie)."""

    pid: int
    ppid: int
    sid: int
    start_time: int
    is_zombie: bool


def _read_proc(pid: int) -> ProcInfo | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return ProcInfo(
            pid=pid,
            ppid=int(fields[1]),
            sid=int(fields[3]),
            start_time=int(fields[19]),
            is_zombie=fields[0] in (b"Z", b"X"),
        )
    except (IndexError, ValueError):
        return None


def _has_token(pid: int, needle: bytes) -> bool:
    """Whether the exec-time environment of ``pid`` holds the entry ``needle`` (``NAME=value``)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:  # gone, or not ours to read
        return False
    return b"\0" + needle + b"\0" in b"\0" + data + b"\0"


def scan_processes() -> list[ProcInfo]:
    """Every process, from one read of each ``/proc/PID/stat`` (the gone and unreadable left out)."""
    infos = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = _read_proc(int(name))
            if info is not None:
                infos.append(info)
    return infos


class _Watch:
    """The guardian's state: guarded sessions, escaped descendants (pid, start time), token."""

    def __init__(self, token: str = "") -> None:
        self.sessions: set[int] = set()
        self.escaped: set[tuple[int, int]] = set()
        self.needle = f"{GUARDIAN_ENV}={token}".encode() if token else b""

    def apply(self, line: str) -> None:
        line = line.strip()
        if line == "=":
            self.track()
            try:
                os.write(1, b"=\n")
            except OSError:
                pass  # the agent is going away; EOF on stdin follows
            return
        if len(line) < 2 or line[0] not in "+-" or not line[1:].isdigit():
            return
        sid = int(line[1:])
        if line[0] == "+":
            self.sessions.add(sid)
        else:
            self.sessions.discard(sid)

    def guarded(self, infos: Iterable[ProcInfo], *, by_token: bool = False) -> list[ProcInfo]:
        """Return the live processes to kill: the sessions, escapees, and their descendants.

        With ``by_token``, also every process whose environment carries the token, and its
        descendants (not its session: a token carrier may live in a session that is not ours).
        """
        by_parent: dict[int, list[ProcInfo]] = {}
        roots: list[ProcInfo] = []
        for info in infos:
            by_parent.setdefault(info.ppid, []).append(info)
            if info.sid in self.sessions or (info.pid, info.start_time) in self.escaped:
                roots.append(info)
            elif by_token and self.needle and not info.is_zombie:
                if _has_token(info.pid, self.needle):
                    roots.append(info)
        found: dict[int, ProcInfo] = {}
        stack = roots
        while stack:
            info = stack.pop()
            if info.pid in found:
                continue
            found[info.pid] = info
            stack.extend(by_parent.get(info.pid, ()))
        me = os.getpid()
        return [info for info in found.values() if info.pid != me]

    def track(self) -> None:
        """Remember the descendants of guarded sessions that now live outside them."""
        if not self.sessions and not self.escaped:
            return
        infos = scan_processes()
        alive = {(i.pid, i.start_time) for i in infos}
        self.escaped &= alive
        for info in self.guarded(infos):
            if info.sid not in self.sessions:
                self.escaped.add((info.pid, info.start_time))

    def kill_all(self) -> None:
        """SIGKILL every guarded process, rescanning until none is left alive."""
        for _ in range(_KILL_ROUNDS):
            victims = [
                info for info in self.guarded(scan_processes(), by_token=True) if not info.is_zombie
            ]
            if not victims:
                return
            for info in victims:
                try:
                    os.kill(info.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                except PermissionError:
                    pass
            _wait_exited([info.pid for info in victims], _KILL_ROUND_PAUSE_S)


def _wait_exited(pids: list[int], timeout_s: float) -> None:
    """Wait until every process of ``pids`` has exited, at most ``timeout_s``, then rescan.

    On the processes' pidfds (readable once a process ended), so the wait ends as soon as they
    are gone; the guardian imports only the standard library, not the package's clock. A pid
    already gone, or a kernel without pidfds, waits for nothing of it.
    """
    fds: list[int] = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except (OSError, AttributeError):  # gone already, or no pidfd (Linux < 5.3)
            pass
    try:
        deadline = time.monotonic() + timeout_s
        waiting = list(fds)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            ready, _, _ = select.select(waiting, [], [], left)
            waiting = [fd for fd in waiting if fd not in ready]
    finally:
        for fd in fds:
            os.close(fd)


def main(stdin_fd: int = 0, token: str = "") -> int:
    """Run the guardian: read commands from ``stdin_fd`` until EOF, then kill what it guards.

    Args:
        stdin_fd: the read end of the agent's pipe.
        token: the agent's token: processes whose environment carries it are killed too.

    Returns:
        The process exit status (0).
    """
    # SIGUSR1/2: Slurm (scancel --signal, sbatch --signal) signals every process of a step,
    # this one too, and their default action would end it before the agent is gone.
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _IGNORED)  # blocked by the agent until now
    watch = _Watch(token)
    pending = b""
    next_track = time.monotonic() + _TRACK_INTERVAL_S
    while True:
        timeout = max(0.0, next_track - time.monotonic()) if watch.sessions else None
        readable, _, _ = select.select([stdin_fd], [], [], timeout)
        if readable:
            try:
                chunk = os.read(stdin_fd, 4096)
            except InterruptedError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                watch.apply(raw.decode("ascii", errors="replace"))
        if time.monotonic() >= next_track:
            watch.track()
            next_track = time.monotonic() + _TRACK_INTERVAL_S
    watch.kill_all()
    return 0


class Guardian:
    """The agent's handle on its guardian process.

    Start it once, before the first worker; give every worker :meth:`worker_env`'s entry;
    :meth:`register` each worker's session id right after spawning it and :meth:`unregister` it
    once the session is gone. :meth:`close` ends the guardian (which kills whatever is still
    registered or carries the token). Thread-safe.
    """

    def __init__(self, python_exec: str | None = None) -> None:
        """Prepare a guardian; nothing runs until :meth:`start`.

        Args:
            python_exec: the interpreter to run it with (default: the agent's own).
        """
        self._python = python_exec or sys.executable
        self._token = secrets.token_hex(16)
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def token(self) -> str:
        """This agent's token: a process whose environment carries it dies with the agent."""
        return self._token

    def worker_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """Return a copy of ``env`` with this guardian's entry (``ELASTIC_RUN_GUARDIAN``) set.

        Args:
            env: a worker's environment (another agent's entry in it is replaced).
        """
        return {**env, GUARDIAN_ENV: self._token}

    @property
    def write_fd(self) -> int | None:
        """The write end of the guardian's input, or None when it is not running: a function
        worker writes its own ``+<sid>`` line on it before it closes it."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdin.closed:
            return None
        return proc.stdin.fileno()

    @property
    def pid(self) -> int | None:
        """The guardian's pid, or None before :meth:`start`."""
        return self._proc.pid if self._proc is not None else None

    @property
    def pipe_fds(self) -> tuple[int, ...]:
        """The agent's ends of the guardian's pipes: a forked child must close them (the end of
        the guardian's input means that the agent is gone)."""
        proc = self._proc
        if proc is None:
            return ()
        return tuple(
            f.fileno() for f in (proc.stdin, proc.stdout) if f is not None and not f.closed
        )

    def is_running(self) -> bool:
        """Whether the guardian process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the guardian process.

        Raises:
            AgentError: the interpreter could not be started.
        """
        from elastic_run.errors import AgentError

        with self._lock:
            if self._proc is not None:
                return
            # The signals the guardian ignores are blocked from its fork until it ignores them
            # (a blocked mask survives exec): a Slurm SIGUSR1 sent to the whole step while its
            # interpreter starts must not end it.
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, _IGNORED)
            try:
                self._proc = subprocess.Popen(
                    [self._python, "-I", "-S", os.path.abspath(__file__), self._token],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise AgentError(
                    f"cannot start the worker guardian with {self._python}: {exc}"
                ) from exc
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def register(self, sid: int) -> None:
        """Guard session ``sid``: its processes are killed when the agent dies.

        Args:
            sid: the session id (the pid of the worker that called setsid).

        Raises:
            AgentError: the guardian is not started or has died.
        """
        self._send(f"+{sid}\n")

    def unregister(self, sid: int) -> None:
        """Stop guarding session ``sid`` (call it once the session has no process left).

        Args:
            sid: a session id given to :meth:`register`.

        Raises:
            AgentError: the guardian is not started or has died.
        """
        self._send(f"-{sid}\n")

    def sync(self, timeout_s: float = _CLOSE_TIMEOUT_S) -> None:
        """Make the guardian rescan now for descendants that left their session; wait for it.

        The guardian rescans on its own every ``_TRACK_INTERVAL_S``; this is for callers (tests)
        that must know a new grandchild is tracked.

        Args:
            timeout_s: how long to wait for the guardian's answer.

        Raises:
            AgentError: the guardian is not running or did not answer in time.
        """
        from elastic_run.errors import AgentError

        with self._lock:
            proc = self._proc
            if proc is None or proc.stdin is None or proc.stdin.closed or proc.stdout is None:
                raise AgentError("the worker guardian is not running")
            self._write(proc, "=\n")
            fd = proc.stdout.fileno()
            deadline = time.monotonic() + timeout_s
            answer = b""
            while not answer.endswith(b"=\n"):
                remaining = deadline - time.monotonic()
                readable, _, _ = select.select([fd], [], [], max(0.0, remaining))
                chunk = os.read(fd, 64) if readable else b""
                if not chunk:
                    raise AgentError(f"the worker guardian (pid {proc.pid}) did not answer")
                answer += chunk

    def _write(self, proc: subprocess.Popen[bytes], line: str) -> None:
        from elastic_run.errors import AgentError

        assert proc.stdin is not None
        try:
            os.write(proc.stdin.fileno(), line.encode("ascii"))
        except OSError as exc:
            raise AgentError(f"the worker guardian (pid {proc.pid}) is gone: {exc}") from exc

    def _send(self, line: str) -> None:
        from elastic_run.errors import AgentError

        with self._lock:
            if self._proc is None or self._proc.stdin is None or self._proc.stdin.closed:
                raise AgentError("the worker guardian is not running")
            self._write(self._proc, line)

    def close(self, timeout_s: float = _CLOSE_TIMEOUT_S) -> None:
        """End the guardian: it kills what is still registered, then exits. Idempotent.

        Args:
            timeout_s: how long to wait for it to exit before killing it.
        """
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            if proc.stdin is not None and not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with self._lock:
            if proc.stdout is not None:
                proc.stdout.close()

    def __enter__(self) -> Guardian:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main(token=sys.argv[1] if len(sys.argv) > 1 else ""))
