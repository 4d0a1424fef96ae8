"""Watching one node's workers for a process that outlives its script's end (``script_end.py``).

Per attempt the agent tells the watch its workers (:meth:`ScriptEndWatch.start_attempt`,
:meth:`ScriptEndWatch.started`, with the warm starts, which know when a warm worker's script
ended); each monitor tick :meth:`ScriptEndWatch.observe` learns which scripts ended (the zygote's
word for warm workers; for cold ones, py-spy stacks taken when the process is idle) and returns
the workers whose script is over while their process lives. The script-end rule
(``agent/rules/progress/outlived.py``) weighs how long; for each one past the bound
:meth:`ScriptEndWatch.settle` takes its stacks and fixes its counted status (:class:`Outlived`
says how to report it), the agent kills it, and :meth:`ScriptEndWatch.amend` then reports its
exit as its script's own status instead of the SIGKILL. ``amend`` also counts a warm worker
killed by a signal after its script ended as the script's status
(``script_end.counted_exit``); :meth:`ScriptEndWatch.died_after_script` names each such worker
once, for the agent to say so. A worker killed by its own agent's stop (the worker group's
``AgentStop``: the stop's signals, from the moment it began) is neither: its exit stays the
agent's signal.

Threads: everything runs on the agent's loop.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import psutil

from elastic_run.agent.progress.stack_report import StackReport, format_stacks
from elastic_run.agent.progress.stacks import capture_stacks, write_stacks
from elastic_run.agent.rules.observation import ScriptEnded
from elastic_run.agent.rules.progress import script_end
from elastic_run.agent.workers.failures import read_error_file
from elastic_run.agent.workers.group import AgentStop
from elastic_run.agent.workers.processes import WorkerExit

__all__ = ["DiedAfterScript", "Outlived", "ScriptEndWatch", "WarmEnds"]

_NS = 1_000_000_000
_CPU_EVERY_S = 1.0
_STACK_CHARS = 4000


class WarmEnds(Protocol):
    """What the warm starts know of their workers' scripts (``warm_start.WarmStarts``)."""

    def script_end(self, pid: int) -> tuple[int, int] | None:
        """(exit status, monotonic ns) once warm worker ``pid``'s script ended, else None."""

    def is_warm(self, pid: int) -> bool:
        """Whether ``pid`` was forked by the zygote (it will say when its script ends)."""


class _NoWarm:
    def script_end(self, pid: int) -> tuple[int, int] | None:
        return None

    def is_warm(self, pid: int) -> bool:
        return False


@dataclass(frozen=True)
class Outlived:
    """A worker whose process outlived its script's end past the bound.

    Attributes:
        local_rank: its local rank.
        rank: its global rank.
        pid: its process.
        lived_s: how long it had lived past its script's end (as the agent knows it).
        bound_s: ``--script-exit-timeout``.
        code: the exit status counted for it (its script's own; see ``script_end.py``).
        known: whether ``code`` is the script's status as the script set it (a warm worker), or
            inferred (a cold one: 0, or 1 when it wrote an error file).
        where: where its main thread is after the script (empty: not seen).
        stacks: its stacks (None: not taken).
        stacks_file: its ``stacks.txt`` (None: not written).
    """

    local_rank: int
    rank: int
    pid: int
    lived_s: float
    bound_s: float
    code: int
    known: bool
    where: str
    stacks: StackReport | None
    stacks_file: Path | None

    def sentence(self) -> str:
        """``rank 3 (pid 1234) outlived its script's end by 61 s (--script-exit-timeout 60 s)...``"""
        how = "its script's exit status" if self.known else "no error file: counted as success"
        if not self.known and self.code:
            how = "it wrote an error file: counted as a failure"
        text = (
            f"rank {self.rank} (pid {self.pid}) outlived its script's end by {self.lived_s:.0f} s "
            f"(--script-exit-timeout {self.bound_s:g} s)"
        )
        if self.where:
            text += f", {self.where}"
        text += f"; killed it, its exit counted as {self.code} ({how})"
        if self.stacks_file is not None:
            text += f"; stacks in {self.stacks_file}"
        return text

    def report(self) -> str:
        """The sentence, then the stacks (cut to a few thousand characters)."""
        if self.stacks is None:
            return self.sentence()
        text = format_stacks(self.stacks, f"Python stacks of pid {self.pid}:")
        if len(text) > _STACK_CHARS:
            text = text[:_STACK_CHARS] + "\n    ...\n"
        return self.sentence() + "\n" + text.rstrip("\n")


@dataclass(frozen=True)
class DiedAfterScript:
    """A warm worker killed by a signal after its script ended (a crash in its shutdown).

    Attributes:
        local_rank: its local rank.
        rank: its global rank.
        pid: its process.
        exitcode: how the process ended (``-signum``).
        code: its script's status, counted as its exit.
    """

    local_rank: int
    rank: int
    pid: int
    exitcode: int
    code: int

    def sentence(self) -> str:
        """``rank 1 (pid 1234) was killed by SIGABRT after its script ended with status 0...``"""
        try:
            how = f"killed by {signal.Signals(-self.exitcode).name}"
        except ValueError:
            how = f"killed by signal {-self.exitcode}"
        return (
            f"rank {self.rank} (pid {self.pid}) was {how} after its script ended with status "
            f"{self.code} (a crash in the interpreter's shutdown, not in the script); its exit "
            f"counted as {self.code}"
        )


@dataclass
class _Worker:
    local_rank: int
    rank: int
    log_dir: Path | None
    pid: int = 0
    ended_ns: int = 0
    code: int | None = None
    where: str = ""
    track: script_end.IdleTrack = script_end.IdleTrack()
    cpu_read_ns: int = 0
    settled: int | None = None


class ScriptEndWatch:
    """Which of this node's workers outlive their script's end.

    Args:
        bound_s: ``--script-exit-timeout`` (None: off).
        idle_s: how long a cold worker is idle before its stacks are looked at.
        recent: local rank -> stacks of it taken lately by someone else (the hang watch), used
            instead of a new py-spy run (one stack capture at a time delays the loop less).
    """

    def __init__(
        self,
        bound_s: float | None,
        idle_s: float = 10.0,
        recent: Callable[[int], StackReport | None] | None = None,
    ) -> None:
        self.bound_s = bound_s
        self._idle_s = idle_s
        self._recent = recent if recent is not None else (lambda local_rank: None)
        self._workers: dict[int, _Worker] = {}
        self._warm: WarmEnds = _NoWarm()
        self._died: dict[int, DiedAfterScript] = {}
        self._said: set[int] = set()

    def start_attempt(
        self, workers: Sequence[tuple[int, int]], log_dirs: Mapping[int, Path]
    ) -> None:
        """A new attempt: its workers ((local rank, rank) pairs) and their log directories."""
        self._workers = {lr: _Worker(lr, rank, log_dirs.get(lr)) for lr, rank in workers}

    def started(self, pids: Mapping[int, int], warm: WarmEnds | None = None) -> None:
        """The attempt's workers run (local rank -> pid); ``warm`` knows the warm ones' ends."""
        self._warm = warm if warm is not None else _NoWarm()
        track = script_end.IdleTrack(backoff_s=self._idle_s, idle_s=self._idle_s)
        for lr, pid in pids.items():
            if lr in self._workers:
                self._workers[lr].pid = pid
                self._workers[lr].track = track

    def ended(self) -> set[int]:
        """The local ranks whose script is known to have ended (not to be judged hung)."""
        return {lr for lr, w in self._workers.items() if w.ended_ns}

    def note(self, local_rank: int, where: str, now_ns: int) -> None:
        """Stacks taken elsewhere (the hang watch) showed this worker after its script."""
        worker = self._workers.get(local_rank)
        if worker is not None and not worker.ended_ns:
            worker.ended_ns, worker.where = now_ns, where

    def observe(
        self, exited: Iterable[int] = (), now_ns: int | None = None
    ) -> tuple[ScriptEnded, ...]:
        """Learn which scripts ended; return the workers whose script is over while their
        process lives (the script-end rule weighs how long: ``agent/rules/progress/outlived.py``).

        Args:
            exited: local ranks that exited already.
            now_ns: the monotonic time now (default: the clock).
        """
        if self.bound_s is None:
            return ()
        now = time.monotonic_ns() if now_ns is None else now_ns
        gone = set(exited)
        over = []
        for worker in self._workers.values():
            if not worker.pid or worker.local_rank in gone or worker.settled is not None:
                continue
            if not worker.ended_ns:
                self._learn(worker, now)
            if worker.ended_ns:
                over.append(
                    ScriptEnded(worker.local_rank, worker.rank, worker.pid, worker.ended_ns)
                )
        return tuple(over)

    def settle(self, ended: ScriptEnded, lived_s: float) -> Outlived | None:
        """The rule judged this worker past the bound: take its stacks, fix the status its exit
        counts as, and say how to report it (None: it is not this attempt's worker any more).

        Args:
            ended: the worker.
            lived_s: how long it outlived its script's end.
        """
        worker = self._workers.get(ended.local_rank)
        if worker is None or worker.pid != ended.pid or worker.settled is not None:
            return None
        return self._verdict(worker, lived_s)

    def _learn(self, worker: _Worker, now: int) -> None:
        end = self._warm.script_end(worker.pid)
        if end is not None:
            worker.code, worker.ended_ns = end
            return
        if self._warm.is_warm(worker.pid) or now - worker.cpu_read_ns < _CPU_EVERY_S * _NS:
            return
        worker.cpu_read_ns = now
        try:
            times = psutil.Process(worker.pid).cpu_times()
        except (psutil.Error, OSError):
            return
        worker.track = worker.track.read(times.user + times.system, now)
        if not worker.track.due(now):
            return
        report = self._recent(worker.local_rank)
        if report is None:
            report = capture_stacks({worker.local_rank: worker.pid})[worker.local_rank]
        where = script_end.after_script(report)
        if where is None:
            worker.track = worker.track.looked(now)
        else:
            worker.ended_ns, worker.where = now, where

    def _verdict(self, worker: _Worker, lived_s: float) -> Outlived:
        report = capture_stacks({worker.local_rank: worker.pid})[worker.local_rank]
        where = script_end.after_script(report) or worker.where
        known = worker.code is not None
        code = worker.code if worker.code is not None else self._cold_code(worker.pid)
        worker.settled = code
        path = None
        if worker.log_dir is not None:
            path = worker.log_dir / "stacks.txt"
            title = (
                f"stacks of rank {worker.rank} (local rank {worker.local_rank}, pid {worker.pid}): "
                f"it outlived its script's end by {lived_s:.0f} s"
            )
            path = path if write_stacks(path, report, title) else None
        assert self.bound_s is not None
        return Outlived(
            worker.local_rank,
            worker.rank,
            worker.pid,
            lived_s,
            self.bound_s,
            code,
            known,
            where,
            report,
            path,
        )

    @staticmethod
    def _cold_code(pid: int) -> int:
        """A cold worker's status: 1 when it wrote an error file (``@record``), else 0."""
        try:
            path = psutil.Process(pid).environ().get("TORCHELASTIC_ERROR_FILE", "")
        except (psutil.Error, OSError):
            return 0
        return 1 if path and read_error_file(path) is not None else 0

    def amend(
        self, exits: Mapping[int, WorkerExit], stop: AgentStop | None = None
    ) -> dict[int, WorkerExit]:
        """The exits, each one after the script's end counted as the script's own status.

        A worker killed for outliving its script, or a warm one killed by a signal after its
        script ended (``script_end.counted_exit``), counts as its script's status. A worker its
        own agent stopped (``stop``: its signals, from the moment it began) keeps its exit: the
        agent's signal killed it.
        """
        out = dict(exits)
        for lr, exit_ in exits.items():
            worker = self._workers.get(lr)
            if worker is None or worker.pid != exit_.pid:
                continue
            if worker.settled is not None:
                out[lr] = replace(exit_, exitcode=worker.settled)
                continue
            if stop is not None and stop.explains(exit_):
                continue  # the agent's stop, not a crash in the interpreter's shutdown
            end = self._warm.script_end(exit_.pid) if exit_.exitcode < 0 else None
            counted = script_end.counted_exit(end[0] if end else None, exit_.exitcode)
            if counted != exit_.exitcode:
                out[lr] = replace(exit_, exitcode=counted)
                self._died.setdefault(
                    exit_.pid,
                    DiedAfterScript(lr, worker.rank, exit_.pid, exit_.exitcode, counted),
                )
        return out

    def died_after_script(self) -> list[DiedAfterScript]:
        """Warm workers found killed after their script's end, each named once."""
        new = [died for pid, died in self._died.items() if pid not in self._said]
        self._said.update(died.pid for died in new)
        return new

    def outlived(self, pid: int) -> bool:
        """Whether the agent killed ``pid`` for outliving its script."""
        return any(w.pid == pid and w.settled is not None for w in self._workers.values())
