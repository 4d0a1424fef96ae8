"""Which workers start warm: the agent's policy around its zygote (``zygote.py``).

The agent calls :meth:`WarmStarts.begin` once from its main loop thread, before the rendezvous
(the zygote imports torch meanwhile), :meth:`WarmStarts.before_attempt` before each attempt (also
from the main loop thread: a zygote that died is replaced there, and the agent says so), and
:meth:`WarmStarts.start_for` for each worker, which returns the ``start`` of its launch: a fork
from the zygote, or None for a cold start. A warm start that fails at the last moment (the
zygote died between the check and the fork) starts that worker cold instead.

Invariants:
- Every reason to start cold is said once, as one event (one line on the console).
- A zygote that refused (a preload raised, started a thread, initialized CUDA) is not replaced:
  the job runs cold from then on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import IO, Any

from elastic_run.agent.warm.zygote import WarmCommand, Zygote, env_mismatch, warm_command
from elastic_run.agent.workers.env import cold_python_env
from elastic_run.agent.workers.processes import (
    WorkerLaunch,
    WorkerProcess,
    WorkerStart,
    start_program,
)
from elastic_run.errors import AgentError

__all__ = ["READY_TIMEOUT_S", "Emit", "WarmStarts"]

READY_TIMEOUT_S = 300.0
"""How long an attempt waits for the zygote's imports (a cold start would pay them too)."""

Emit = Callable[[str, str, Mapping[str, Any]], None]


class WarmStarts:
    """The warm-start policy of one agent.

    Args:
        enabled: ``--warm-start``.
        preload: ``--preload`` modules.
        emit: records an event ``(kind, message, fields)``.
    """

    def __init__(self, *, enabled: bool, preload: Sequence[str], emit: Emit) -> None:
        self._enabled = enabled
        self._preload = tuple(preload)
        self._emit = emit
        self._zygote: Zygote | None = None
        self._refused: str | None = None
        self._warned: set[str] = set()
        self._command: WarmCommand | None = None
        self._cwd = ""

    @property
    def zygote_pid(self) -> int | None:
        """The current zygote's pid, or None."""
        return self._zygote.pid if self._zygote is not None else None

    def begin(self, argv: Sequence[str], python: str, cwd: str, env: Mapping[str, str]) -> None:
        """Start the zygote when warm starts apply to this command (from the main loop thread).

        Args:
            argv: local rank 0's command.
            python: the interpreter that workers run.
            cwd: the workers' working directory.
            env: the environment every worker shares.
        """
        if not self._enabled:
            return
        command = warm_command(argv, python, cwd)
        if isinstance(command, str):
            self._refuse(command)
            return
        self._command, self._cwd = command, cwd
        self._start(python, env)

    def _start(self, python: str, env: Mapping[str, str]) -> None:
        assert self._command is not None
        zygote = Zygote(python=python, env=env, path0=self._command.path0, preload=self._preload)
        try:
            zygote.start()
        except AgentError as exc:
            self._refuse(str(exc))
            return
        self._zygote = zygote

    def before_attempt(self) -> None:
        """Wait for the zygote's imports; replace a zygote that died (main loop thread only)."""
        zygote = self._zygote
        if zygote is None or self._refused is not None:
            return
        reason = zygote.wait_ready(READY_TIMEOUT_S)
        if reason is not None and zygote.was_ready:  # it was killed after it was ready
            message = f"the zygote (pid {zygote.pid}) died; starting a new one for warm starts"
            self._emit("zygote.lost", message, {"pid": zygote.pid})
            zygote.close()
            self._start(zygote.python, zygote.env)
            if self._refused is not None or self._zygote is None:
                return
            reason = self._zygote.wait_ready(READY_TIMEOUT_S)
        if reason is not None:
            self._refuse(reason)

    def start_for(self, argv: Sequence[str], env: Mapping[str, str]) -> WorkerStart | None:
        """The ``start`` of a worker's launch: from the zygote, or None (cold)."""
        zygote = self._zygote
        if zygote is None or self._refused is not None or not zygote.is_alive:
            return None
        command = warm_command(argv, zygote.python, self._cwd)
        if isinstance(command, str):
            self._warn(f"starting a worker cold: {command}")
            return None
        mismatch = env_mismatch(zygote.env, env)
        if mismatch:
            self._warn(
                "starting workers cold: their environment differs from the zygote's in "
                + ", ".join(mismatch[:5])
            )
            return None

        def start(
            launch: WorkerLaunch, stdout: int | IO[bytes], stderr: int | IO[bytes]
        ) -> WorkerProcess:
            try:
                return zygote.spawn(command, launch.argv, launch.env, stdout, stderr)
            except AgentError as exc:
                self._warn(f"starting worker local_rank {launch.local_rank} cold: {exc}")
                cold = cold_python_env(launch.env, python=True)  # a warm command is Python's
                return start_program(replace(launch, env=cold), stdout, stderr)

        return start

    def script_end(self, pid: int) -> tuple[int, int] | None:
        """When warm worker ``pid``'s script ended: (its exit status, monotonic ns); None: not yet
        (or not a warm worker)."""
        zygote = self._zygote
        return zygote.script_end(pid) if zygote is not None else None

    def is_warm(self, pid: int) -> bool:
        """Whether worker ``pid`` was forked by the current zygote."""
        zygote = self._zygote
        return zygote is not None and zygote.has_child(pid)

    def close(self) -> None:
        """Kill the zygote. Idempotent."""
        if self._zygote is not None:
            self._zygote.close()

    def _refuse(self, reason: str) -> None:
        self._refused = reason
        self._warn(f"warm start off, workers start cold: {reason}")
        if self._zygote is not None:
            self._zygote.close()

    def _warn(self, message: str) -> None:
        if message in self._warned:
            return
        self._warned.add(message)
        self._emit("warm_start.cold", message, {})
