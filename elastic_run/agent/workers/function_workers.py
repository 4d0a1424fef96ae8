"""Callable entrypoints, the agent's side: start each worker as a process that runs the function.

torch runs a callable ``WorkerSpec.entrypoint`` in one :mod:`multiprocessing` process per local
worker, started by the agent's ``start_method``, and hands back each worker's return value in
``RunResult.return_values``. So does this module, inside the supervision that program workers
get (``processes.py``: a waiter per worker, the guardian, the stop of the whole tree, the
output plumbing), by giving each :class:`~elastic_run.agent.workers.processes.WorkerLaunch` a
``start`` that makes a multiprocessing process instead of running ``argv``. What the process
does before it calls the function (its own session, the parent-death signal, its output and
environment) is in ``function_call.py``.

Start methods: ``spawn`` (torch's default) and ``fork`` as multiprocessing does them;
``forkserver`` is started as ``spawn`` (the same fresh interpreter and the same rule that the
function and its arguments be picklable; a fork server would be a second parent that outlives
no one's supervision). Return values are written by each worker to a file in a private
directory of the agent's (mode 0700), one per local rank, cleared before every attempt and
removed by :meth:`FunctionWorkers.close`. The directory is an owned folder
(``$TMPDIR/elastic-run-results-*``, :mod:`elastic_run.rendezvous.owned_dir`): an agent SIGKILLed
leaves it, and the next agent (or ``elastic-run``) on the host removes it.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import threading
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import IO, Any, Literal

from elastic_run.agent.workers.function_call import ChildFd, FunctionCall, read_result, run_call
from elastic_run.agent.workers.guardian import Guardian
from elastic_run.agent.workers.processes import WorkerLaunch, WorkerProcess
from elastic_run.errors import AgentError, ConfigurationError
from elastic_run.rendezvous.owned_dir import MARKER, RESULTS_PREFIX, OwnedDir, reclaim_orphans

__all__ = ["START_METHODS", "FunctionWorkers"]

START_METHODS = ("spawn", "fork", "forkserver")
_REAP_PAUSE_S = 0.001


class _StartedProcess:
    """A started multiprocessing process, as ``WorkerProcesses`` waits for it."""

    def __init__(self, process: BaseProcess) -> None:
        self._process = process
        pid = process.pid
        if pid is None:
            raise AgentError("a function worker has no pid after its start")
        self._pid = pid

    @property
    def pid(self) -> int:
        return self._pid

    def wait(self) -> int:
        self._process.join()
        # multiprocessing's own bookkeeping (``Process.start`` polls every child) may reap it
        # first; it then records the exit code a moment later.
        pause = threading.Event()
        while (code := self._process.exitcode) is None:
            pause.wait(_REAP_PAUSE_S)
        return code


class FunctionWorkers:
    """How this agent's workers run a callable entrypoint, and what they returned.

    Args:
        fn: the entrypoint.
        args: its arguments (``${local_rank}`` in a string argument is replaced per worker).
        start_method: ``spawn``, ``fork`` or ``forkserver`` (started as spawn).
        guardian: the agent's guardian (asked at each start): a worker registers its own session
            on the guardian's pipe before it runs the entrypoint, and a forked worker closes the
            guardian's pipes.

    Raises:
        ConfigurationError: an unknown start method (also a ValueError).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        start_method: str,
        guardian: Callable[[], Guardian | None] = lambda: None,
    ) -> None:
        if start_method not in START_METHODS:
            raise ConfigurationError(
                f"start_method must be one of {', '.join(START_METHODS)}, not {start_method!r}"
            )
        self._fn = fn
        self._args = tuple(args)
        self._method: Literal["fork", "spawn"] = "fork" if start_method == "fork" else "spawn"
        self._guardian = guardian
        self._dir: Path | None = None
        self._owned: OwnedDir | None = None

    @property
    def name(self) -> str:
        """The entrypoint's name, for messages."""
        return str(getattr(self._fn, "__qualname__", repr(self._fn)))

    def args_for(self, local_rank: int) -> tuple[Any, ...]:
        """The arguments of worker ``local_rank``, ``${local_rank}`` replaced in strings."""
        return tuple(
            a.replace("${local_rank}", str(local_rank)) if isinstance(a, str) else a
            for a in self._args
        )

    def prepare_attempt(self) -> None:
        """Clear the return values of the previous attempt (call before starting workers).

        Raises:
            AgentError: the private directory cannot be created.
        """
        try:
            if self._dir is None:
                reclaim_orphans(RESULTS_PREFIX)  # those of agents that were SIGKILLed
                self._owned = OwnedDir.create(RESULTS_PREFIX)
                self._dir = self._owned.path
            for old in self._dir.iterdir():
                if old.name == MARKER:
                    continue
                old.unlink()
        except OSError as exc:
            raise AgentError(f"cannot prepare the function workers' directory: {exc}") from exc

    def _result_path(self, local_rank: int) -> str:
        if self._dir is None:
            raise AgentError("prepare_attempt() was not called before starting the workers")
        return str(self._dir / f"{local_rank}.result")

    def start(
        self, launch: WorkerLaunch, stdout: int | IO[bytes], stderr: int | IO[bytes]
    ) -> WorkerProcess:
        """Start one worker process running the entrypoint (a ``WorkerLaunch.start``).

        Args:
            launch: the worker's launch (its local rank and complete environment).
            stdout: where its stdout goes: a descriptor, a file, or ``subprocess.DEVNULL``.
            stderr: the same for its stderr.

        Returns:
            The started process.

        Raises:
            AgentError: the process cannot be started (e.g. the entrypoint or an argument
                cannot be pickled for a spawned process).
        """
        guardian = self._guardian()
        guardian_fd = guardian.write_fd if guardian is not None else None
        call = FunctionCall(
            fn=self._fn,
            args=self.args_for(launch.local_rank),
            env=dict(launch.env),
            stdout=_child_fd(stdout),
            stderr=_child_fd(stderr),
            result_path=self._result_path(launch.local_rank),
            agent_pid=os.getpid(),
            close_fds=guardian.pipe_fds if guardian is not None and self._method == "fork" else (),
            guardian=ChildFd(guardian_fd) if guardian_fd is not None else None,
        )
        context = (
            multiprocessing.get_context("fork")
            if self._method == "fork"
            else multiprocessing.get_context("spawn")
        )
        process = context.Process(
            target=run_call, args=(call,), name=f"{self.name}-{launch.local_rank}", daemon=False
        )
        try:
            if self._method == "fork":
                _fork_frozen(process)
            else:
                process.start()
        except Exception as exc:  # pickling: PicklingError, AttributeError, TypeError...
            hint = " (spawn needs a module-level function and picklable arguments)"
            raise AgentError(
                f"{type(exc).__name__}: {exc}{hint if self._method == 'spawn' else ''}"
            ) from exc
        return _StartedProcess(process)

    def return_value(self, local_rank: int) -> Any:
        """What worker ``local_rank`` of the last attempt returned (None: nothing recorded).

        Raises:
            AgentError: the value cannot be read back in the agent.
        """
        try:
            return read_result(self._result_path(local_rank))
        except Exception as exc:  # whatever unpickling the user's value raises
            raise AgentError(
                f"the return value of {self.name} on local_rank {local_rank} cannot be read "
                f"in the agent: {type(exc).__name__}: {exc}"
            ) from exc

    def close(self) -> None:
        """Remove the private directory. Idempotent."""
        if self._owned is not None:
            self._owned.remove()
            self._owned = None
        self._dir = None


def _child_fd(target: int | IO[bytes]) -> ChildFd | None:
    if isinstance(target, int):
        return ChildFd(target) if target >= 0 else None  # subprocess.DEVNULL is negative
    return ChildFd(target.fileno())


def _fork_frozen(process: BaseProcess) -> None:
    """Start a fork-method process with this process's objects in gc's permanent generation.

    The child's collector then never walks what it inherited. Among that are objects other
    threads of the agent's process were using at the fork, whose threads (and stacks) do not
    exist in the child; the suite saw a fork-started worker die by SIGSEGV in its first
    collection ("Garbage-collecting" in faulthandler's dump; twice in ~25 runs). The parent's
    objects are unfrozen right after the fork, unless something had frozen objects before (then
    they stay frozen, as that code wants).
    """
    frozen_before = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        process.start()
    finally:
        if not frozen_before:
            gc.unfreeze()
