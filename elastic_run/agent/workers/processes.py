"""Worker process supervision: spawn one attempt's workers, watch them exit, stop their whole tree.

Each worker runs in a session (and process group) of its own, so a signal reaches it and every
child that stayed in its group, and the agent's terminal signals do not reach it directly. It gets
a parent-death signal (SIGKILL), so it never outlives the agent: set by util-linux's ``setpriv``,
which then execs the worker, or where there is none by a ``preexec_fn`` (which makes subprocess
fork the whole agent instead of vfork-and-exec, about 30 times slower). Note that Linux fires that signal
when the *thread* that spawned the worker exits, not the process: the agent must spawn workers
from its main loop thread (the thread that lives as long as the agent). Grandchildren are covered
by the :class:`~elastic_run.agent.workers.guardian.Guardian` (when given one) and by :meth:`stop`, which
signals first and looks after: each worker's process group and pid, and the descendants known
before the signal (those ``/proc/PID/task/*/children`` names, or where the kernel has no such
file one read of each ``/proc/PID/stat``: a grandchild in a session of its own is reparented the
moment its worker dies, so it must be known before), get the signal first; then every descendant
found by a scan of every process (also those that left the group) and everything left in the
workers' sessions get it too. A stop is the time
from a round's end to its workers gone on every node: a scan of every process first (psutil,
about 30 ms with 130 processes on a loaded host) was most of it, and the scans that remain read
each ``/proc/PID/stat`` once (``_process_table``). :meth:`begin_stop` sends those first signals
alone, at once, so the agent can do its bookkeeping (events, the store) while the workers
exit; :meth:`stop` then waits, its grace counted from that first signal. A worker's session is registered with the guardian as soon as it is spawned, before its
output readers start; what the worker starts before even that is found by the guardian's token in
the worker's environment (``ELASTIC_RUN_GUARDIAN``, put there by the agent).

A worker that is not a program (a callable entrypoint, ``function_workers.py``) comes with a
``start`` in its launch: it is started by that instead of ``argv``, and supervised the same way.
It joins its own session itself, as its first act; until then :meth:`stop` reaches it by pid.

Invariants:
- One waiter thread per worker reaps it the moment it exits, records a :class:`WorkerExit` and
  calls ``on_exit``, so the agent loop can wake at once instead of at its next monitor tick.
- :meth:`WorkerProcesses.stop` returns only when every worker is reaped, no process of the tree is
  alive (zombies reparented elsewhere count as gone), and the output has been drained to EOF.
- ``stop`` and ``close`` are idempotent; ``close`` kills with SIGKILL if nothing stopped the workers.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

import psutil

from elastic_run.agent.config import Std
from elastic_run.agent.workers.guardian import Guardian, ProcInfo, scan_processes
from elastic_run.agent.workers.output import LineFilter, StreamName, WorkerOutput
from elastic_run.errors import AgentError
from elastic_run.parent_death import death_signal_prefix, set_parent_death_signal

__all__ = [
    "WorkerExit",
    "WorkerLaunch",
    "WorkerProcess",
    "WorkerProcesses",
    "WorkerStart",
    "start_program",
]

logger = logging.getLogger(__name__)

_KILL_ROUNDS = 100
_POLL_S = 0.01
# After SIGKILL, processes vanish within milliseconds; this bounds a wait on an unkillable one (D).
_KILL_WAIT_S = 10.0
_OUTPUT_JOIN_S = 5.0


class WorkerProcess(Protocol):
    """A started worker as it is waited for (a ``subprocess.Popen`` is one)."""

    @property
    def pid(self) -> int:
        """Its process id."""

    def wait(self) -> int:
        """Block until it exits; return its exit status (``-signum`` for a signal)."""


WorkerStart = Callable[["WorkerLaunch", "int | IO[bytes]", "int | IO[bytes]"], WorkerProcess]
"""Starts a worker that is not a program: ``(launch, stdout, stderr) -> process``, where the
streams are what ``subprocess.Popen`` would be given (a descriptor, a file, or DEVNULL)."""


@dataclass(frozen=True)
class WorkerLaunch:
    """Everything needed to start one worker.

    Attributes:
        local_rank: the worker's rank on this node.
        global_rank: the worker's rank in the job (shown in the console prefix).
        argv: the full command, e.g. ``(sys.executable, "-u", "train.py", "--lr", "1")``.
        env: the complete environment of the worker.
        log_dir: ``<log-dir>/<run-id>/attempt_<n>/<local_rank>/``, where ``stdout.log`` and
            ``stderr.log`` are written for redirected or teed streams; None for no files.
        redirect: the streams that go only to files.
        tee: the streams that go to files and the console.
        show_on_console: False when --local-ranks-filter excludes this rank (files still written).
        error_file: the worker's TORCHELASTIC_ERROR_FILE (already in ``env``).
        start: starts a worker that is not a program (``argv`` then only names it); None runs
            ``argv``.
        tee_prefix: the prefix of a teed stream's console lines (torchrun's ``[default0]:``).
        duplicates: per stream, the shared file of a teed stream's lines that match a filter.
    """

    local_rank: int
    global_rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_dir: Path | None
    redirect: Std
    tee: Std
    show_on_console: bool
    error_file: Path
    start: WorkerStart | None = None
    tee_prefix: str = ""
    duplicates: Mapping[StreamName, LineFilter] | None = None


@dataclass(frozen=True)
class WorkerExit:
    """How one worker ended.

    Attributes:
        local_rank: the worker's rank on this node.
        pid: its process id.
        exitcode: its exit status (>= 0), or ``-signum`` when a signal killed it.
        finished_at: when it was reaped, epoch seconds (``time.time()``).
    """

    local_rank: int
    pid: int
    exitcode: int
    finished_at: float


def start_program(
    launch: WorkerLaunch, stdout: int | IO[bytes], stderr: int | IO[bytes]
) -> WorkerProcess:
    """Start ``launch.argv`` cold: a new interpreter in its own session, with the death signal.

    Raises:
        OSError: the program cannot be started.
        subprocess.SubprocessError: ``preexec_fn`` failed.
    """
    argv, env = list(launch.argv), dict(launch.env)
    prefix = death_signal_prefix()
    if prefix and argv and shutil.which(argv[0], path=env.get("PATH")) is None:
        # Found by Popen itself otherwise: say so the same way, not as exit 127.
        raise FileNotFoundError(f"no such executable: {argv[0]!r}")
    return subprocess.Popen(
        [*prefix, *argv],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        preexec_fn=None if prefix else set_parent_death_signal,
        close_fds=True,
    )


class _Worker:
    def __init__(self, launch: WorkerLaunch, proc: WorkerProcess, output: WorkerOutput) -> None:
        self.launch = launch
        self.proc = proc
        self.output = output
        self.waiter: threading.Thread | None = None


class WorkerProcesses:
    """The processes of one attempt of this node's workers.

    Call :meth:`start` from the agent's main loop thread (see the module docstring), then
    :meth:`poll` on each monitor tick (or when ``on_exit`` fires), and :meth:`stop` or
    :meth:`close` before the next attempt.
    """

    def __init__(
        self,
        launches: Sequence[WorkerLaunch],
        *,
        on_exit: Callable[[], None] | None = None,
        guardian: Guardian | None = None,
    ) -> None:
        """Prepare the workers; nothing runs until :meth:`start`.

        Args:
            launches: one launch per local worker, with distinct local ranks.
            on_exit: called (from a waiter thread, with no lock held) each time a worker exits.
            guardian: a started guardian to register each worker's session with, or None.

        Raises:
            AgentError: two launches share a local rank.
        """
        ranks = [launch.local_rank for launch in launches]
        if len(set(ranks)) != len(ranks):
            raise AgentError(f"duplicate local ranks in the worker launches: {ranks}")
        self._launches = tuple(launches)
        self._on_exit = on_exit
        self._guardian = guardian
        self._workers: dict[int, _Worker] = {}
        self._exits: dict[int, WorkerExit] = {}
        self._cond = threading.Condition()
        self._started = False
        self._stopped = False
        # begin_stop's signal, when (monotonic), and the descendants it found before signalling.
        self._begun: tuple[int, float, set[psutil.Process]] | None = None
        self._stop_lock = threading.Lock()

    @property
    def pids(self) -> dict[int, int]:
        """The pid of each started worker, by local rank."""
        return {rank: worker.proc.pid for rank, worker in self._workers.items()}

    def start(self) -> None:
        """Spawn every worker.

        Raises:
            AgentError: a worker could not be started (bad executable, log dir not writable, ...);
                the workers already started are killed first.
        """
        if self._started:
            raise AgentError("these workers were already started")
        self._started = True
        for launch in self._launches:
            try:
                self._spawn(launch)
            except AgentError:
                self.stop(signal.SIGKILL, 0.0)
                raise

    def _spawn(self, launch: WorkerLaunch) -> None:
        try:
            output = WorkerOutput(
                global_rank=launch.global_rank,
                log_dir=launch.log_dir,
                redirect=launch.redirect,
                tee=launch.tee,
                show_on_console=launch.show_on_console,
                tee_prefix=launch.tee_prefix,
                duplicates=dict(launch.duplicates or {}),
            )
        except (OSError, ValueError) as exc:
            raise AgentError(
                f"cannot set up the output of worker local_rank {launch.local_rank}: {exc}"
            ) from exc
        proc: WorkerProcess
        try:
            if launch.start is not None:
                proc = launch.start(launch, output.stdout, output.stderr)
            else:
                proc = start_program(launch, output.stdout, output.stderr)
        except (OSError, subprocess.SubprocessError, AgentError) as exc:
            output.close(timeout_s=0.0)
            argv0 = launch.argv[0] if launch.argv else "<empty command>"
            raise AgentError(
                f"cannot start worker local_rank {launch.local_rank} ({argv0}): {exc}"
            ) from exc
        worker = _Worker(launch, proc, output)
        self._workers[launch.local_rank] = worker
        if self._guardian is not None:  # first: the worker already runs (the token covers it)
            self._guardian.register(proc.pid)
        output.after_spawn()
        worker.waiter = threading.Thread(
            target=self._wait_for,
            args=(worker,),
            name=f"worker-waiter-{launch.local_rank}",
            daemon=True,
        )
        worker.waiter.start()

    def _wait_for(self, worker: _Worker) -> None:
        exitcode = worker.proc.wait()
        record = WorkerExit(
            local_rank=worker.launch.local_rank,
            pid=worker.proc.pid,
            exitcode=exitcode,
            finished_at=time.time(),
        )
        with self._cond:
            self._exits[record.local_rank] = record
            self._cond.notify_all()
        if self._on_exit is not None:
            try:
                self._on_exit()
            except Exception:
                logger.exception("the on_exit callback failed")

    def poll(self) -> dict[int, WorkerExit]:
        """Return the workers that have exited so far, by local rank (does not block)."""
        with self._cond:
            return dict(self._exits)

    def running(self) -> bool:
        """Whether any started worker has not exited yet."""
        with self._cond:
            return any(rank not in self._exits for rank in self._workers)

    def _live_workers(self) -> list[_Worker]:
        with self._cond:
            return [w for rank, w in self._workers.items() if rank not in self._exits]

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the process group of every worker that has not exited.

        Args:
            sig: the signal number.
        """
        for worker in self._live_workers():
            _signal_group(worker.proc.pid, sig)

    def stop(
        self, sig: int, timeout_s: float, *, escalate: Callable[[], bool] | None = None
    ) -> None:
        """Stop every worker and all of its descendants; reap them; drain and close their output.

        Sends ``sig`` to each worker's process group, to every process in its session, and to
        every descendant found before signalling (also those that left the group), waits up to
        ``timeout_s`` for all of them to exit, then SIGKILLs whatever is left. Idempotent.

        Args:
            sig: the first signal, e.g. SIGTERM (SIGKILL to kill at once).
            timeout_s: the grace period before SIGKILL.
            escalate: checked while waiting; once it returns True the grace period ends and
                what is left is SIGKILLed (a second signal to the agent).
        """
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            workers = list(self._workers.values())
            sessions = {w.proc.pid for w in workers}
            begun = self._begun
            if begun is None or begun[0] != sig:
                began_at = time.monotonic()
                tree = self._signal_first(sessions, sig)
            else:
                began_at, tree = begun[1], set(begun[2])
            # After the first signals: the scan of every process finds what left the groups.
            tree |= self._snapshot_descendants(workers)
            self._signal_tree(sessions, tree, sig, groups=False)
            deadline = began_at + max(0.0, timeout_s)
            if not self._wait_tree_gone(sessions, tree, deadline, escalate):
                if sig != signal.SIGKILL or timeout_s > 0:
                    logger.info(
                        "workers still alive %.1f s after signal %s; sending SIGKILL",
                        timeout_s,
                        _signal_name(sig),
                    )
                for _ in range(_KILL_ROUNDS):
                    tree |= self._snapshot_descendants(workers)
                    self._signal_tree(sessions, tree, signal.SIGKILL)
                    if self._wait_tree_gone(sessions, tree, time.monotonic() + _POLL_S * 5):
                        break
                else:
                    self._wait_tree_gone(sessions, tree, time.monotonic() + _KILL_WAIT_S)
            _reap_adopted(sessions, tree, worker_pids=sessions)
            for worker in workers:
                if worker.waiter is not None:
                    worker.waiter.join(_KILL_WAIT_S)
                    if worker.waiter.is_alive():
                        logger.warning(
                            "worker local_rank %d (pid %d) survived SIGKILL (uninterruptible?)",
                            worker.launch.local_rank,
                            worker.proc.pid,
                        )
            for worker in workers:
                if not worker.output.close(timeout_s=_OUTPUT_JOIN_S):
                    logger.warning(
                        "the output of worker local_rank %d is still open after it was stopped",
                        worker.launch.local_rank,
                    )
            if self._guardian is not None:
                for sid in sessions:
                    try:
                        self._guardian.unregister(sid)
                    except AgentError as exc:
                        logger.warning("%s", exc)

    def begin_stop(self, sig: int) -> float | None:
        """Send ``sig`` now to every worker, its process group and the descendants found without
        a scan of every process; return at once (:meth:`stop` completes the stop).

        Where a round ended, the agent signals first and does its bookkeeping while the workers
        exit. Idempotent; nothing is sent once a stop began or ended.

        Args:
            sig: the stopping signal (:meth:`stop` counts its grace from here when given the same).

        Returns:
            When the signals went (epoch seconds), or None when nothing was sent now.
        """
        with self._stop_lock:
            if self._stopped or self._begun is not None or not self._workers:
                return None
            began_at = time.monotonic()
            sessions = {w.proc.pid for w in self._workers.values()}
            self._begun = (sig, began_at, self._signal_first(sessions, sig))
            return time.time()

    def close(self) -> None:
        """Kill the workers if nothing stopped them, and release their output. Idempotent."""
        self.stop(signal.SIGKILL, 0.0)

    def _signal_first(self, sessions: set[int], sig: int) -> set[psutil.Process]:
        """Signal the live workers, their groups, and their descendants as found before the
        signal; return those descendants."""
        found = _proc_descendants(sessions)
        if found is None:  # no ``children`` file: one read of each /proc/PID/stat
            found = _descendants_in(_process_table(), sessions)
        tree = _as_processes(found)
        for worker in self._live_workers():  # a function worker before it joined its session
            _signal_pid(worker.proc.pid, sig)
        for sid in sessions:
            _signal_group(sid, sig)
        for proc in tree:
            _signal_process(proc, sig)
        return tree

    def _snapshot_descendants(self, workers: Sequence[_Worker]) -> set[psutil.Process]:
        """Every living descendant of the workers, from one pass over ``/proc`` (``_process_table``)."""
        table = _process_table()
        return _as_processes(_descendants_in(table, {w.proc.pid for w in workers}))

    def _signal_tree(
        self, sessions: set[int], tree: set[psutil.Process], sig: int, *, groups: bool = True
    ) -> None:
        if groups:  # False: ``_signal_first`` signalled the workers and their groups already
            for worker in self._live_workers():  # a function worker before it joined its session
                _signal_pid(worker.proc.pid, sig)
            for sid in sessions:
                _signal_group(sid, sig)
        for proc in _session_members(sessions):
            _signal_process(proc, sig)
        for proc in tree:
            _signal_process(proc, sig)

    def _wait_tree_gone(
        self,
        sessions: set[int],
        tree: set[psutil.Process],
        deadline: float,
        escalate: Callable[[], bool] | None = None,
    ) -> bool:
        workers = list(self._workers)
        while True:
            with self._cond:
                workers_done = all(rank in self._exits for rank in workers)
            if workers_done and not any(_is_alive(p) for p in tree):
                if not _session_members(sessions):
                    return True
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (escalate is not None and escalate()):
                return False
            with self._cond:
                self._cond.wait(min(_POLL_S, remaining))


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_process(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except psutil.Error:
        pass


def _is_alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _proc_children(pid: int) -> list[int] | None:
    """``pid``'s children as ``/proc/PID/task/*/children`` names them (None: the kernel has no
    such file, CONFIG_PROC_CHILDREN; [] for a process gone)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(x) for x in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None
        except (OSError, ValueError):
            continue
    return found


def _proc_descendants(roots: set[int]) -> list[int] | None:
    """Every descendant of ``roots`` found from ``/proc/PID/task/*/children`` (no scan of every
    process; None where the kernel has no such file, CONFIG_PROC_CHILDREN)."""
    seen: set[int] = set()
    todo = list(roots)
    out: list[int] = []
    while todo:
        children = _proc_children(todo.pop())
        if children is None:
            return None
        for child in children:
            if child not in seen and child not in roots:
                seen.add(child)
                out.append(child)
                todo.append(child)
    return out


def _session_members(sessions: set[int]) -> list[psutil.Process]:
    """Live (non-zombie) processes whose session id is one of ``sessions`` (one pass over
    ``/proc``)."""
    if not sessions:
        return []
    me = os.getpid()
    table = _process_table()
    return list(
        _as_processes(
            [
                pid
                for pid, st in table.items()
                if st.sid in sessions and not st.is_zombie and pid != me
            ]
        )
    )


def _process_table() -> dict[int, ProcInfo]:
    """Every process by pid, from one read of each ``/proc/PID/stat`` (the guardian's scan): the
    scans of ``stop`` run while the workers exit, on the same cores, and psutil's (a ``Process``
    object, its ``status()`` and ``getsid()`` per process, and a parent map for ``children``) cost
    several times this."""
    return {info.pid: info for info in scan_processes()}


def _descendants_in(table: Mapping[int, ProcInfo], roots: set[int]) -> list[int]:
    """The living descendants of ``roots`` in ``table`` (the roots left out)."""
    children: dict[int, list[int]] = {}
    for pid, st in table.items():
        children.setdefault(st.ppid, []).append(pid)
    out: list[int] = []
    seen = set(roots)
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
                if not table[child].is_zombie:
                    out.append(child)
    return out


def _as_processes(pids: Sequence[int]) -> set[psutil.Process]:
    """``pids`` as psutil processes (each remembers its start time: a pid reused later is not
    signalled); the ones gone meanwhile left out."""
    found: set[psutil.Process] = set()
    for pid in pids:
        try:
            found.add(psutil.Process(pid))
        except psutil.Error:
            continue
    return found


def _reap_adopted(sessions: set[int], tree: set[psutil.Process], worker_pids: set[int]) -> None:
    """Reap descendants of the workers that became the agent's own children.

    That happens when the agent is a subreaper or PID 1 (a container's entry point): orphans are
    reparented to it, and nothing else would wait for them. Workers are left to their waiters.
    """
    tree_pids = {proc.pid for proc in tree}
    me = os.getpid()
    for pid, st in _process_table().items():
        if st.ppid != me or pid in worker_pids:
            continue
        if pid not in tree_pids and st.sid not in sessions:
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
