"""Watching one node's workers for progress: beats in, hang verdicts, stacks and step times out.

The agent owns one :class:`HangWatch` for the run. Per attempt it creates the beat file
(:mod:`elastic_run.worker.beat_file`; in ``/dev/shm`` when there is one) and gives each worker its
slot through the environment; the watchdog's server reports every timer arm and release as a
beat of that pid (:meth:`HangWatch.timer_beat`, from its thread). Each monitor tick the loop
calls :meth:`HangWatch.tick`: every slot is read and folded into the worker's
:class:`~elastic_run.agent.rules.progress.beats.BeatHistory`, and each one's silence is measured
against its timeout (``beats.judge``).

When a worker is silent past its timeout, the stacks of every local worker are taken at once
(py-spy, :mod:`elastic_run.agent.progress.stacks`) and written to ``stacks.txt``; a worker whose
stacks show its script over (in the interpreter's shutdown:
:func:`~elastic_run.agent.rules.progress.script_end.after_script`) is no suspect: its beats
stopped because its script did (:meth:`HangWatch.after_script` hands it on). The others are
:attr:`HangWatch.suspects`, with where they were and the grace the collective waits get: the
evidence the hang rule (``agent/rules/progress/hung.py``) judges. Once it judged workers hung
and the agent stops them (a hung worker is a failed worker), :meth:`HangWatch.judged_hung`
records it: they are not judged again, and the stuck picture shows them hung.

What a restart keeps: the gaps learned by local rank (the next attempt starts past its warm-up)
and the no-progress count (``--max-no-progress-restarts``: failed attempts in a row that reached
no step beyond the furthest an earlier attempt reached, :func:`~elastic_run.agent.rules.progress.beats.count_attempt`).

Threads: ``tick`` and the attempt methods run on the agent's loop; ``timer_beat`` on the
watchdog's; ``progress`` (a snapshot) on any. Shared state is behind one lock; what other
threads read is an immutable tuple replaced whole.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

import elastic_run
from elastic_run.agent.loop.snapshot import WorkerProgress
from elastic_run.agent.progress.hang_picture import StuckRank
from elastic_run.agent.progress.stack_report import StackReport, Where
from elastic_run.agent.progress.stacks import capture_stacks, write_stacks
from elastic_run.agent.rules.progress import beats, script_end
from elastic_run.agent.rules.progress.beats import HungWorker
from elastic_run.agent.rules.progress.step_times import StepSample, StepWindow
from elastic_run.worker.beat_file import (
    PROGRESS_FILE_ENV,
    PROGRESS_SLOT_ENV,
    BeatFile,
    create_beat_file,
    sweep_stale_beat_files,
)

__all__ = ["HangWatch", "HungWorker"]

log = logging.getLogger(__name__)

_NS = 1_000_000_000
_IO_QUIET_S = 3.0
_IO_EVERY_S = 0.5
_STALE_STACKS_S = 5.0
_LIBRARY_DIRS = (str(Path(elastic_run.__file__).resolve().parent),)  # elastic_run itself


@dataclass
class _Worker:
    local_rank: int
    rank: int
    log_dir: Path | None
    pid: int = 0
    history: beats.BeatHistory = beats.BeatHistory()
    window: StepWindow = StepWindow()
    timer_beats: int = 0
    timer_last_ns: int = 0
    io_bytes: int = -1
    io_moved_ns: int = 0
    io_read_ns: int = 0
    report: StackReport | None = None
    report_ns: int = 0
    stacks_file: Path | None = None
    verdict: str = ""


class HangWatch:
    """Progress beats, hang verdicts and step times of this node's workers.

    Args:
        rule: the hang rule (``--hang-timeout``).
        beat_dir: where beat files go (default: ``/dev/shm``, else ``/tmp``).
    """

    def __init__(self, rule: beats.HangRule, beat_dir: Path | None = None) -> None:
        self.rule = rule
        self._beat_dir = beat_dir
        self._lock = threading.Lock()
        self._workers: dict[int, _Worker] = {}
        self._by_pid: dict[int, int] = {}
        self._learned: dict[int, beats.BeatHistory] = {}
        self._file: BeatFile | None = None
        self._path: Path | None = None
        self._attempt = -1
        self._attempt_beat = False
        self._attempt_reach = -1
        self._count = beats.NoProgressCount()
        self._suspect_since = 0
        self._capture_s = 0.0
        self._suspects: tuple[HungWorker, ...] = ()
        self._grace_s = 0.0
        self._stopped: set[int] = set()
        self._after_script: dict[int, tuple[str, int]] = {}
        self._swept = False
        self._snapshot: tuple[tuple[int, WorkerProgress], ...] = ()
        self._stuck: dict[int, StuckRank] = {}
        self._stuck_view: tuple[StuckRank, ...] = ()
        self.last_hang: HungWorker | None = None

    # -- attempts -----------------------------------------------------------------------

    def start_attempt(
        self, attempt: int, workers: Sequence[tuple[int, int]], log_dirs: Mapping[int, Path]
    ) -> dict[int, dict[str, str]]:
        """Create this attempt's beat file; return each worker's extra environment.

        Args:
            attempt: the attempt's number on this node.
            workers: (local rank, global rank) of each worker.
            log_dirs: local rank -> its log directory (where ``stacks.txt`` goes).

        Returns:
            local rank -> the variables that tell the worker its slot (empty when beats are
            off: the file could not be created, which is logged once).
        """
        self._close_file()
        with self._lock:
            for lr, worker in self._workers.items():
                if worker.history.gaps_seen:
                    self._learned[lr] = worker.history
            self._workers = {
                lr: _Worker(lr, rank, log_dirs.get(lr), history=self._carried(lr))
                for lr, rank in workers
            }
            self._by_pid = {}
            self._attempt = attempt
            self._attempt_beat = False
            self._attempt_reach = -1
            self._suspect_since = 0
            self._suspects = ()
            self._stopped = set()
            self._after_script = {}
            self._stuck = {}
            self._stuck_view = ()
        slots = max((lr for lr, _ in workers), default=-1) + 1
        path = self._new_path(attempt)
        try:
            create_beat_file(path, slots)
            self._file = BeatFile(path)
            self._path = path
        except (OSError, ValueError) as exc:
            log.warning("progress beats are off for this attempt: %s", exc)
            return {lr: {} for lr, _ in workers}
        return {lr: {PROGRESS_FILE_ENV: str(path), PROGRESS_SLOT_ENV: str(lr)} for lr, _ in workers}

    def _carried(self, local_rank: int) -> beats.BeatHistory:
        learned = self._learned.get(local_rank)
        if learned is None:
            return beats.BeatHistory()
        return beats.BeatHistory(
            gaps_s=learned.gaps_s, gaps_seen=learned.gaps_seen, longest_s=learned.longest_s
        )

    def _new_path(self, attempt: int) -> Path:
        base = self._beat_dir
        if base is None:
            shm = Path("/dev/shm")
            base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path("/tmp")
        if not self._swept:
            self._swept = True
            sweep_stale_beat_files(base)
        return base / f"elastic-run-{os.getpid()}-{attempt}-{secrets.token_hex(4)}.beats"

    def started(self, pids: Mapping[int, int]) -> None:
        """The workers of this attempt run with these pids (local rank -> pid)."""
        with self._lock:
            for lr, pid in pids.items():
                if lr in self._workers:
                    self._workers[lr].pid = pid
            self._by_pid = {pid: lr for lr, pid in pids.items()}

    def end_attempt(self, failed: bool) -> None:
        """The attempt's workers are stopped; count it for ``--max-no-progress-restarts``."""
        self._count = self._counted(failed)
        self._close_file()

    def _counted(self, failed: bool) -> beats.NoProgressCount:
        return beats.count_attempt(
            self._count, attempt=self._attempt, failed=failed, reached=self._attempt_reach
        )

    def no_progress_streak(self, failed: bool) -> int:
        """Failed attempts in a row without progress, were this attempt to end now."""
        return self._counted(failed).streak

    @property
    def attempt_reach(self) -> int:
        """The furthest step a local worker reached in this attempt (-1: none beat)."""
        return self._attempt_reach

    @property
    def best_step(self) -> int:
        """The furthest step of the attempts that ended (-1: none beat)."""
        return self._count.best_step

    @property
    def attempt_beat(self) -> bool:
        """Whether any local worker beat during this attempt."""
        return self._attempt_beat

    def close(self) -> None:
        """Remove the beat file. Idempotent."""
        self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._path is not None:
            try:
                self._path.unlink()
            except FileNotFoundError:
                pass
            self._path = None

    # -- beats from the watchdog ------------------------------------------------------------

    def timer_beat(self, pid: int, now_ns: int | None = None) -> None:
        """A file-timer request of ``pid`` (arm or release): a beat. Any thread."""
        at = time.monotonic_ns() if now_ns is None else now_ns
        with self._lock:
            lr = self._by_pid.get(pid)
            if lr is not None:
                worker = self._workers[lr]
                worker.timer_beats += 1
                worker.timer_last_ns = at

    # -- each tick ------------------------------------------------------------------------

    def tick(
        self, now_ns: int | None = None, armed_pids: Iterable[int] = (), exited: Iterable[int] = ()
    ) -> None:
        """Read every slot, judge every worker; take stacks when one is silent past its timeout.

        Args:
            now_ns: the monotonic time now (default: read the clock).
            armed_pids: processes holding an armed file timer (judged by the watchdog).
            exited: local ranks that exited (their silence means nothing).
        """
        now = time.monotonic_ns() if now_ns is None else now_ns
        armed = set(armed_pids)
        gone = set(exited) | self._stopped
        suspects: dict[int, beats.Silence] = {}
        with self._lock:
            for worker in self._workers.values():
                self._fold(worker, now)
                if worker.local_rank in gone:
                    worker.verdict = worker.verdict if worker.verdict == "hung" else ""
                    continue
                silence = self._judge(worker, now, worker.pid in armed)
                worker.verdict = "silent" if silence is not None else ""
                if silence is not None:
                    suspects[worker.local_rank] = silence
        if not suspects:
            self._suspect_since = 0
            self._suspects = ()
            self._keep_stuck({}, gone)
            self._publish(now)
            return
        if not self._suspect_since:
            self._suspect_since = now
        self._ensure_stacks(now, "silent past its hang timeout")
        for lr in list(suspects):
            report = self._workers[lr].report
            over = script_end.after_script(report) if report is not None else None
            if over is not None:  # its script ended: not hung (the script-end watch bounds it)
                del suspects[lr]
                self._workers[lr].verdict = ""
                self._after_script.setdefault(lr, (over, now))
        if not suspects:
            self._suspect_since = 0
            self._suspects = ()
            self._keep_stuck({}, gone)
            self._publish(now)
            return
        worst = max(s.timeout_s for s in suspects.values())
        self._grace_s = self.rule.collective_grace_s(worst, self._capture_s)
        found = []
        seen = {}
        for lr, silence in suspects.items():
            worker = self._workers[lr]
            where = self._where(lr)
            report = worker.report
            found.append(
                HungWorker(
                    lr,
                    worker.rank,
                    worker.pid,
                    silence,
                    where,
                    worker.stacks_file,
                    report.error if report is not None else None,
                )
            )
            seen[lr] = StuckRank(
                rank=worker.rank,
                where=where.text() if where is not None else "",
                function=where.function if where is not None else "",
                in_collective=where.in_collective if where is not None else None,
                stuck_s=silence.silent_s,
                hung=False,
            )
        self._suspects = tuple(found)
        self._keep_stuck(seen, gone)
        self._publish(now)

    def _keep_stuck(self, seen: Mapping[int, StuckRank], gone: set[int]) -> None:
        """The attempt's stuck picture: the silent workers now, and those of the last picture
        that were judged hung or exited since (what happened stays shown); a worker that beat
        again leaves it."""
        kept = {
            lr: rank
            for lr, rank in self._stuck.items()
            if lr not in seen and (rank.hung or lr in gone or self._workers[lr].verdict == "hung")
        }
        self._stuck = {**kept, **seen}
        self._stuck_view = tuple(self._stuck[lr] for lr in sorted(self._stuck))

    @property
    def stuck(self) -> tuple[StuckRank, ...]:
        """This attempt's silent workers as last seen with their stacks (any thread)."""
        return self._stuck_view

    def read_beats(self, now_ns: int | None = None) -> None:
        """Read every slot without judging (a worker that beat and exited between two ticks)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        with self._lock:
            for worker in self._workers.values():
                self._fold(worker, now)

    def _fold(self, worker: _Worker, now: int) -> None:
        reading = self._file.read(worker.local_rank) if self._file is not None else None
        slot_beats = reading.beats if reading is not None else 0
        slot_last = reading.last_beat_ns if reading is not None else 0
        count = slot_beats + worker.timer_beats
        if count <= worker.history.beats:
            return
        last = max(slot_last, worker.timer_last_ns)
        gap = reading.last_gap_ns if reading is not None and slot_last >= last else 0
        step = reading.step if reading is not None and slot_beats else count
        worker.history = beats.observe(worker.history, count, step, last, gap)
        self._attempt_reach = max(self._attempt_reach, step)
        busy = (reading.busy_ns, reading.busy_count) if reading is not None else (0, 0)
        worker.window = worker.window.add(StepSample(now, count, last, *busy))
        self._attempt_beat = True

    def _judge(self, worker: _Worker, now: int, armed: bool) -> beats.Silence | None:
        history = worker.history
        limit = beats.timeout_s(history, self.rule)
        if limit is None or history.beats == 0 or armed:
            return None
        silent_s = (now - history.last_beat_ns) / _NS
        io_active = False
        if self.rule.mode == "auto" and silent_s > limit / 2:
            io_active = self._io_active(worker, now)
        return beats.judge(history, self.rule, now, timer_armed=armed, io_active=io_active)

    def _io_active(self, worker: _Worker, now: int) -> bool:
        """Whether the worker's process read or wrote storage within the last few seconds."""
        if worker.pid and now - worker.io_read_ns >= _IO_EVERY_S * _NS:
            worker.io_read_ns = now
            try:
                io = psutil.Process(worker.pid).io_counters()
                total = int(io.read_bytes + io.write_bytes)
            except (psutil.Error, OSError, AttributeError):
                total = -1
            if worker.io_bytes >= 0 and total > worker.io_bytes:
                worker.io_moved_ns = now
            worker.io_bytes = total
        return bool(worker.io_moved_ns) and now - worker.io_moved_ns <= _IO_QUIET_S * _NS

    def _where(self, local_rank: int) -> Where | None:
        report = self._workers[local_rank].report
        return report.where(_LIBRARY_DIRS) if report is not None else None

    # -- stacks ---------------------------------------------------------------------------

    def _ensure_stacks(self, now: int, why: str) -> None:
        fresh = all(
            w.report is not None and now - w.report_ns < _STALE_STACKS_S * _NS
            for w in self._workers.values()
            if w.pid
        )
        if not fresh:
            self.take_stacks(why, now_ns=now)

    def take_stacks(
        self, why: str, local_ranks: Iterable[int] | None = None, now_ns: int | None = None
    ) -> dict[int, StackReport]:
        """Take the stacks of the running workers and write each one's ``stacks.txt``.

        Args:
            why: the reason written in the file's first line.
            local_ranks: whose (default: every worker with a pid).
            now_ns: now (default: the clock).

        Returns:
            local rank -> its report.
        """
        now = time.monotonic_ns() if now_ns is None else now_ns
        wanted = set(self._workers) if local_ranks is None else set(local_ranks)
        pids = {
            lr: w.pid
            for lr, w in self._workers.items()
            if lr in wanted and w.pid and psutil.pid_exists(w.pid)
        }
        started = time.monotonic()
        reports = capture_stacks(pids)
        self._capture_s = time.monotonic() - started
        for lr, report in reports.items():
            worker = self._workers[lr]
            worker.report, worker.report_ns = report, now
            if worker.log_dir is not None:
                title = f"stacks of rank {worker.rank} (local rank {lr}, pid {worker.pid}): {why}"
                path = worker.log_dir / "stacks.txt"
                worker.stacks_file = path if write_stacks(path, report, title) else None
        return reports

    def stacks_taken(self, local_rank: int, within_s: float = _STALE_STACKS_S) -> bool:
        """Whether this worker's stacks were taken within the last ``within_s`` seconds."""
        worker = self._workers.get(local_rank)
        if worker is None or worker.report is None:
            return False
        return time.monotonic_ns() - worker.report_ns < within_s * _NS

    def report(self, local_rank: int) -> StackReport | None:
        """This worker's last stacks (None: not taken this attempt)."""
        worker = self._workers.get(local_rank)
        return worker.report if worker is not None else None

    def pids(self) -> dict[int, int]:
        """local rank -> pid of this attempt's workers (0: not started)."""
        return {lr: w.pid for lr, w in self._workers.items()}

    def where(self, local_rank: int) -> tuple[Where | None, Path | None]:
        """Where this worker was last seen, and its ``stacks.txt`` (None when not taken)."""
        worker = self._workers.get(local_rank)
        if worker is None:
            return None, None
        return self._where(local_rank), worker.stacks_file

    # -- verdicts and pictures ------------------------------------------------------------

    def after_script(self) -> dict[int, tuple[str, int]]:
        """Silent workers whose stacks showed their script over: local rank -> (where, when)."""
        return dict(self._after_script)

    @property
    def suspects(self) -> tuple[HungWorker, ...]:
        """The workers silent past their timeout at the last tick, with their stacks (the
        evidence the hang rule judges: ``agent/rules/progress/hung.py``)."""
        return self._suspects

    @property
    def suspect_since_ns(self) -> int:
        """When the first of the suspects was found silent (0: none is)."""
        return self._suspect_since

    @property
    def collective_grace_s(self) -> float:
        """How long workers that all wait in a collective are left to the other nodes."""
        return self._grace_s

    def judged_hung(self, workers: Iterable[HungWorker]) -> None:
        """The hang rule judged these workers hung and the agent stops them: they are not judged
        again this attempt, and the stuck picture shows them hung."""
        for worker in workers:
            self.last_hang = worker
            self.mark(worker.local_rank, "hung")
            self._workers[worker.local_rank].verdict = "hung"
            rank = self._stuck.get(worker.local_rank)
            if rank is not None:
                self._stuck[worker.local_rank] = replace(rank, hung=True)
        self._stuck_view = tuple(self._stuck[lr] for lr in sorted(self._stuck))
        self._suspects = ()

    def _publish(self, now: int) -> None:
        pictures = []
        for lr, w in sorted(self._workers.items()):
            history = w.history
            where = self._where(lr)
            pictures.append(
                (
                    lr,
                    WorkerProgress(
                        beats=history.beats,
                        step=history.step,
                        step_time_s=w.window.step_s,
                        work_time_s=w.window.work_s,
                        last_beat_age_s=(now - history.last_beat_ns) / _NS
                        if history.beats
                        else None,
                        timeout_s=beats.timeout_s(history, self.rule),
                        verdict=w.verdict,
                        where=where.text() if where is not None and w.verdict else "",
                    ),
                )
            )
        self._snapshot = tuple(pictures)

    def beat_reading(self) -> tuple[int, int] | None:
        """The node's beats as of the last reading: (beats of the worker that beat last, its
        last beat's monotonic ns); None before any worker beat this attempt (any thread)."""
        with self._lock:
            histories = [w.history for w in self._workers.values() if w.history.beats]
        if not histories:
            return None
        last = max(histories, key=lambda h: h.last_beat_ns)
        return last.beats, last.last_beat_ns

    def progress(self) -> dict[int, WorkerProgress]:
        """Each local worker's progress as of the last tick (any thread)."""
        return dict(self._snapshot)

    def mark(self, local_rank: int, verdict: str) -> None:
        """Set a worker's verdict in the picture (``hung`` once the agent stopped it: it is not
        judged again, even before its exit is seen)."""
        if verdict == "hung":
            self._stopped.add(local_rank)
        pictures = tuple(
            (lr, replace(p, verdict=verdict) if lr == local_rank else p) for lr, p in self._snapshot
        )
        self._snapshot = pictures
