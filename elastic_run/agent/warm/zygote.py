"""Warm starts, the agent's side: one zygote per node forks the workers (``zygote_process.py``).

The agent starts the zygote from its main loop thread (its parent-death signal is tied to that
thread) with the environment every worker shares; the zygote imports torch and the preloads in
the background while the rendezvous runs. A worker is started warm when the zygote said it is
ready, the worker runs ``python [-u] script ...`` or ``python [-u] -m module ...`` with the
zygote's interpreter, and its environment differs from the zygote's only in per-worker keys
(ranks, sizes, the master address, ``TORCHELASTIC_*``, ``ELASTIC_RUN_*``): anything read at import
time is then what a cold start would have read. Otherwise it starts cold, as before.

Supervision is the cold one (``processes.py``): a warm worker has a pid, its own session, and a
``wait()`` that returns its exit status, which the zygote reports (it is the zygote's child). If
the zygote dies, its workers die by their parent-death signal; each is then waited for through a
pidfd opened when its pid arrived and reported as killed by SIGKILL.

The zygote also reports when a worker's script ended (``ended``: the script's code returned or
raised, with the exit status Python will exit with): :meth:`Zygote.script_end` gives it, with the
monotonic time it arrived, so the agent can bound how long a worker outlives its script
(``script_end.py``).

Invariants:
- One reader thread per zygote handles every message from it in order: a pid reply always
  precedes the exit report of that pid.
- ``spawn`` never leaves a request unanswered: an error reply, the zygote's death, or its reply
  timeout raises ``AgentError`` (the caller then starts that worker cold).
- ``close`` SIGKILLs the zygote (its workers are stopped before, by ``WorkerProcesses.stop``).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, ClassVar

from elastic_run.agent.workers.env import RANK_VARIABLES
from elastic_run.errors import AgentError
from elastic_run.parent_death import death_signal_prefix, set_parent_death_signal

__all__ = ["PER_WORKER_KEYS", "WarmCommand", "Zygote", "env_mismatch", "warm_command"]

logger = logging.getLogger(__name__)

PER_WORKER_KEYS = frozenset(RANK_VARIABLES) | frozenset({"CUDA_VISIBLE_DEVICES"})
"""Variables that differ per worker or per attempt and that nothing reads at import time.

``CUDA_VISIBLE_DEVICES`` (``--virtual-local-rank`` narrows it per worker) is read when CUDA
initializes, which the zygote never does (it refuses a preload that did), and torch does not
cache a device count before that: a forked worker's own value is the one CUDA sees."""
_PER_WORKER_PREFIXES = ("TORCHELASTIC_", "ELASTIC_RUN_")
_PROGRAM = Path(__file__).with_name("zygote_process.py")
_REPLY_TIMEOUT_S = 30.0
# Room in the zygote's argv area for a worker's command line (``ps`` shows the worker's command).
_PADDING = " " * 2048
# Room in its environment area for a worker's environment (what /proc/PID/environ shows).
_ENV_PADDING = "_" * 16384
_MAX_MESSAGE_BYTES = 1 << 20


@dataclass(frozen=True)
class WarmCommand:
    """A worker command that a zygote can run.

    Attributes:
        argv: the worker's ``sys.argv`` (the script, or the module name, then its arguments).
        module: run ``argv[0]`` as a module (``-m``).
        unbuffered: ``-u`` was given.
        path0: ``sys.path[0]`` as a cold start sets it (the script's directory, or the cwd).
    """

    argv: tuple[str, ...]
    module: bool
    unbuffered: bool
    path0: str


def warm_command(argv: Sequence[str], python: str, cwd: str) -> WarmCommand | str:
    """Parse ``python [-u] (script | -m module) args...``; return why not when it is not that."""
    if not argv or argv[0] != python:
        return f"the worker command is not {python} (--no-python or another interpreter)"
    rest = list(argv[1:])
    unbuffered = bool(rest) and rest[0] == "-u"
    if unbuffered:
        rest = rest[1:]
    if len(rest) >= 2 and rest[0] == "-m":
        return WarmCommand(tuple(rest[1:]), True, unbuffered, cwd)
    if not rest or rest[0].startswith("-"):
        return f"interpreter options other than -u ({' '.join(argv[1:3])})"
    script = os.path.join(cwd, rest[0])
    return WarmCommand(tuple(rest), False, unbuffered, os.path.dirname(os.path.realpath(script)))


def env_mismatch(zygote_env: Mapping[str, str], worker_env: Mapping[str, str]) -> list[str]:
    """The variables, not per-worker ones, whose value differs between the zygote and a worker."""
    keys = set(zygote_env) | set(worker_env)
    return sorted(
        k
        for k in keys
        if zygote_env.get(k) != worker_env.get(k)
        and k not in PER_WORKER_KEYS
        and not k.startswith(_PER_WORKER_PREFIXES)
    )


class _ZygoteChild:
    """A worker forked by the zygote, as ``WorkerProcesses`` waits for it."""

    def __init__(self, pid: int, zygote: Zygote) -> None:
        self._pid = pid
        self._zygote = zygote

    @property
    def pid(self) -> int:
        return self._pid

    def wait(self) -> int:
        return self._zygote.wait_exit(self._pid)


class Zygote:
    """One zygote process and the reader of its messages.

    Args:
        python: the interpreter (the workers').
        env: the environment every worker shares.
        path0: ``sys.path[0]`` while preloading (the script's directory).
        preload: modules to import after torch.
    """

    program: ClassVar[Path] = _PROGRAM
    """The script the zygote runs (by path, with the arguments of ``zygote_process.py``)."""

    def __init__(
        self, *, python: str, env: Mapping[str, str], path0: str, preload: Sequence[str]
    ) -> None:
        self.env = dict(env)
        self.python = python
        self._path0 = path0
        self._preload = tuple(preload)
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._cond = threading.Condition()
        self._ready: bool | None = None
        self._reason = ""
        self._dead = False
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._exits: dict[int, int] = {}
        self._ends: dict[int, tuple[int, int]] = {}
        self._pidfds: dict[int, int] = {}
        self._children: set[int] = set()
        self._send_lock = threading.Lock()
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        """The zygote's pid once started."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the zygote; call it from the agent's main loop thread. Does not wait."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        prefix = death_signal_prefix()
        try:
            self._proc = subprocess.Popen(
                [*prefix, self.python, str(self.program), str(child.fileno()), self._path0]
                + [",".join(self._preload), _PADDING],
                env={**self.env, "ELASTIC_RUN_ZYGOTE_PADDING": _ENV_PADDING},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(child.fileno(),),
                start_new_session=True,
                preexec_fn=None if prefix else set_parent_death_signal,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            parent.close()
            raise AgentError(f"cannot start the zygote: {exc}") from exc
        finally:
            child.close()
        self._sock = parent
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()

    def wait_ready(self, timeout_s: float) -> str | None:
        """Wait until the zygote is ready; None when it is, else why it is not."""
        with self._cond:
            self._cond.wait_for(lambda: self._ready is not None or self._dead, timeout_s)
            if self._ready:
                return None if not self._dead else "the zygote exited"
            if self._ready is None and not self._dead:
                return f"the zygote was not ready after {timeout_s:.0f} s"
            return self._reason or "the zygote exited before it was ready"

    @property
    def was_ready(self) -> bool:
        """Whether the zygote said it was ready (it may have died since)."""
        with self._cond:
            return self._ready is True

    @property
    def is_alive(self) -> bool:
        """Whether the zygote was started and has not exited."""
        with self._cond:
            return self._proc is not None and not self._dead

    def spawn(
        self,
        command: WarmCommand,
        launch_argv: Sequence[str],
        env: Mapping[str, str],
        stdout: int | IO[bytes],
        stderr: int | IO[bytes],
        cwd: str | None = None,
    ) -> _ZygoteChild:
        """Fork a worker from the zygote, in ``cwd`` (default: this process's).

        Raises:
            AgentError: the zygote is not ready, refused, died, or did not answer.
        """
        sock = self._sock
        if sock is None or not self.is_alive:
            raise AgentError("the zygote is not running")
        fds = [s if isinstance(s, int) else s.fileno() for s in (stdout, stderr)]
        if any(fd < 0 for fd in fds):  # subprocess.DEVNULL: the child opens /dev/null
            fds = []
        with self._cond:
            self._next_id += 1
            request_id = self._next_id
        request = {
            "id": request_id,
            "argv": list(command.argv),
            "command": list(launch_argv),
            "module": command.module,
            "unbuffered": command.unbuffered,
            "path0": command.path0,
            "cwd": os.getcwd() if cwd is None else cwd,
            "env": dict(env),
        }
        try:
            with self._send_lock:
                socket.send_fds(sock, [json.dumps(request).encode()], fds)
        except OSError as exc:
            raise AgentError(f"cannot send the spawn request to the zygote: {exc}") from exc
        with self._cond:
            self._cond.wait_for(lambda: request_id in self._replies or self._dead, _REPLY_TIMEOUT_S)
            reply = self._replies.pop(request_id, None)
        if reply is None:
            raise AgentError("the zygote exited or did not answer a spawn request")
        if "pid" not in reply:
            raise AgentError(f"the zygote could not fork: {reply.get('error')}")
        return _ZygoteChild(int(reply["pid"]), self)

    def wait_exit(self, pid: int) -> int:
        """Block until the worker ``pid`` exited; return its exit status."""
        code = self.exit_code(pid, None)
        assert code is not None
        return code

    def exit_code(self, pid: int, timeout_s: float | None = 0.0) -> int | None:
        """The exit status of ``pid`` once reported within ``timeout_s`` (None: however long it
        takes); None while it runs."""
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits, timeout_s)
            return self._exits.get(pid)

    def has_child(self, pid: int) -> bool:
        """Whether ``pid`` was forked by this zygote."""
        with self._cond:
            return pid in self._children

    def script_end(self, pid: int) -> tuple[int, int] | None:
        """When worker ``pid``'s script ended: (its exit status, monotonic ns the word arrived).

        None: it did not end (or is not this zygote's worker).
        """
        with self._cond:
            return self._ends.get(pid)

    def close(self) -> None:
        """Kill the zygote and wait for it and its reader. Idempotent."""
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
        if self._reader is not None:
            self._reader.join(5.0)
        if self._sock is not None:
            self._sock.close()

    def _read(self) -> None:
        sock = self._sock
        assert sock is not None
        while True:
            try:
                data = sock.recv(_MAX_MESSAGE_BYTES)
            except OSError:
                data = b""
            if not data:
                break
            self._handle(json.loads(data))
        with self._cond:
            self._dead = True
            orphans = {pid: self._pidfds.get(pid) for pid in self._children - set(self._exits)}
            self._cond.notify_all()
        for pid, fd in orphans.items():  # killed by their parent-death signal
            if fd is not None:
                _wait_gone(pid, fd)
            with self._cond:
                self._exits[pid] = -int(signal.SIGKILL)
                self._cond.notify_all()
        for fd in self._pidfds.values():
            os.close(fd)

    def _handle(self, message: dict[str, Any]) -> None:
        with self._cond:
            if "ready" in message:
                self._ready = bool(message["ready"])
                self._reason = str(message.get("reason", ""))
            elif "ended" in message:
                self._ends[int(message["ended"])] = (int(message["code"]), time.monotonic_ns())
            elif "exit" in message:
                pid = int(message["exit"])
                self._exits[pid] = int(message["code"])
                fd = self._pidfds.pop(pid, None)
                if fd is not None:
                    os.close(fd)
            elif "id" in message:
                if "pid" in message:
                    self._children.add(int(message["pid"]))
                    try:  # before the zygote can reap it: its exit comes after this reply
                        self._pidfds[int(message["pid"])] = os.pidfd_open(int(message["pid"]))
                    except OSError:
                        pass
                self._replies[int(message["id"])] = message
            self._cond.notify_all()


def _wait_gone(pid: int, pidfd: int) -> None:
    select.select([pidfd], [], [])
    logger.debug("worker pid %d ended with its zygote", pid)
