"""The progress part of the agent: beats in, one frozen view a turn out, the verdicts applied.

What the local agent does with beats, for the run loop (``agent/loop/simple.py``) to ask and to
apply: the beat file and worker variables of each attempt; each turn, one
:class:`~elastic_run.agent.rules.observation.ProgressView` (:meth:`ProgressDuties.observe`: the
beats read, the silent workers with their stacks, the scripts that ended while their process
lives, the job's step times to judge, the no-progress streak, the pictures the snapshot shows);
the effects of the progress rules (``agent/rules/progress/``): stopping the hung workers with a
``worker.hung`` event, killing those that outlived their script (``worker.outlived``), recording
the stragglers (``straggler``); stacks before the survivors of a failed group are stopped and
before the watchdog kills a worker; what the worker group asks of workers' ends
(:class:`~elastic_run.agent.workers.group.ExitNotes`: exits after a script's end counted as its
status, the error text of a worker the agent killed); the node's progress record, its
``/metrics`` and the publisher thread (``publisher.py``).

The verdicts are not taken here: the rules take them from the view; this part gathers the
evidence (a capture of stacks is evidence) and carries the verdicts out.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from elastic_run.agent.loop.snapshot import JobProgress
from elastic_run.agent.progress.config import ProgressOptions
from elastic_run.agent.progress.hang_picture import JobHang, stuck_record
from elastic_run.agent.progress.hang_watch import HangWatch
from elastic_run.agent.progress.publisher import ProgressPublisher, job_summary
from elastic_run.agent.progress.script_end_watch import Outlived, ScriptEndWatch, WarmEnds
from elastic_run.agent.progress.stack_report import StackReport, format_stacks
from elastic_run.agent.rules.actions import KillOutlived, NoteStragglers, ProgressEffect, StopHung
from elastic_run.agent.rules.observation import (
    GroupView,
    Notice,
    ProgressView,
    ScriptEnded,
    StepsReading,
    WorkersStatus,
)
from elastic_run.agent.rules.progress.beats import HungWorker
from elastic_run.agent.rules.progress.step_times import StragglerWatch
from elastic_run.agent.workers.failures import WorkerErrorInfo
from elastic_run.agent.workers.group import AgentStop
from elastic_run.agent.workers.processes import WorkerExit
from elastic_run.rendezvous.dynamic.telemetry import TelemetryHost
from elastic_run.worker.auto_progress import AUTO_PROGRESS_ENV

__all__ = ["Emit", "ProgressDuties"]

log = logging.getLogger(__name__)

Emit = Callable[[str, str, dict[str, Any]], None]
_WHERE_CHARS = 160
_RECENT_STACKS_S = 10.0


def _kill_tree(pid: int) -> None:
    """SIGKILL the worker and its process group (it leads its own session)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class ProgressDuties:
    """Beats, hang verdicts, stacks and progress publication for one local agent.

    Args:
        options: ``--hang-timeout``, ``--straggler-factor``, ``--max-no-progress-restarts``.
        host: this node's host name (in the published record).
        beat_dir: where beat files go (default: ``/dev/shm`` or ``/tmp``).
        armed: the workers holding an armed file timer now (the watchdog bounds them: they
            are not judged hung).
    """

    def __init__(
        self,
        options: ProgressOptions,
        host: str,
        beat_dir: Path | None = None,
        armed: Callable[[], Iterable[int]] = frozenset,
    ) -> None:
        self.options = options
        self._armed = armed
        self.watch = HangWatch(options.hang, beat_dir)
        self.script_end = ScriptEndWatch(options.script_exit_timeout_s, recent=self._recent_stacks)
        self._host = host
        self._ranks: dict[int, int] = {}
        self._killed: dict[int, HungWorker] = {}
        self._outlived: dict[int, Outlived] = {}
        self._publisher: ProgressPublisher | None = None
        self._job_hang: JobHang | None = None
        self._judged: StepsReading | None = None
        self._stragglers = (-1, StragglerWatch())
        self._notices: list[Notice] = []

    # -- attempts ------------------------------------------------------------------------

    def env_for_attempt(
        self, attempt: int, workers: Sequence[tuple[int, int]], log_dirs: Mapping[int, Path]
    ) -> dict[int, dict[str, str]]:
        """The beat variables of each worker of a new attempt ((local rank, rank) pairs).

        With automatic beats on (the default), a worker given a slot is also told to beat once
        per optimizer step (``ELASTIC_RUN_AUTO_PROGRESS=1``, see
        :mod:`elastic_run.worker.auto_progress`).
        """
        self._ranks = dict(workers)
        self._killed = {}
        self._outlived = {}
        self._job_hang = None
        self.script_end.start_attempt(workers, log_dirs)
        envs = self.watch.start_attempt(attempt, workers, log_dirs)
        if self.options.auto_progress:
            for env in envs.values():
                if env:
                    env[AUTO_PROGRESS_ENV] = "1"
        return envs

    def started(self, pids: Mapping[int, int], warm: WarmEnds | None = None) -> None:
        """The attempt's workers run.

        Args:
            pids: local rank -> pid.
            warm: the warm starts (they know when a warm worker's script ended).
        """
        self.watch.started(pids)
        self.script_end.started(pids, warm)

    def attempt_ended(self, failed: bool) -> None:
        """The attempt's workers were stopped (``failed``: by a worker failure)."""
        self.watch.end_attempt(failed)

    def close(self) -> None:
        """Stop the publisher and remove the beat file. Idempotent."""
        self.stop_publisher()
        self.watch.close()

    # -- each turn -----------------------------------------------------------------------

    def observe(self, group: GroupView, now_ns: int) -> ProgressView:
        """Read the beats, gather the verdicts' evidence, and return this turn's view.

        While workers run (and the agent is not stopping them): the beats are read and each
        worker's silence measured (stacks taken for the silent ones), and the scripts that ended
        are learnt. A failed group's beats are read once more (a worker that beat and exited
        between two turns counts).

        Args:
            group: the worker group's view this turn.
            now_ns: the monotonic time now.
        """
        exited = {w.local_rank for w in group.workers if w.exitcode is not None}
        ends: tuple[ScriptEnded, ...] = ()
        running = group.status is WorkersStatus.RUNNING
        if group.running and not group.stopped_by_agent and running:
            self.watch.tick(
                now_ns, armed_pids=self._armed(), exited=exited | self.script_end.ended()
            )
            for lr, (where, seen_ns) in self.watch.after_script().items():
                self.script_end.note(lr, where, seen_ns)
            ends = self.script_end.observe(exited, now_ns)
        failed = group.status is WorkersStatus.FAILED
        if failed:
            self.watch.read_beats(now_ns)
        notices, self._notices = tuple(self._notices), []
        return ProgressView(
            suspects=self.watch.suspects if running else (),
            suspect_since_ns=self.watch.suspect_since_ns,
            collective_grace_s=self.watch.collective_grace_s,
            no_progress_restarts=self.watch.no_progress_streak(failed),
            max_no_progress_restarts=self.options.max_no_progress_restarts,
            script_ends=ends,
            script_exit_timeout_s=self.script_end.bound_s,
            steps=self._unjudged_reading(),
            stragglers=self._stragglers[1],
            straggler_factor=self.options.straggler_factor,
            workers=self.watch.progress(),
            job=self.job_progress(),
            beat_reading=self.watch.beat_reading(),
            notices=notices,
        )

    def _unjudged_reading(self) -> StepsReading | None:
        publisher = self._publisher
        reading = publisher.reading if publisher is not None else None
        if reading is None or reading is self._judged:
            return None
        if reading.round != self._stragglers[0]:
            self._stragglers = (reading.round, StragglerWatch())
        return reading

    def apply(
        self, effect: ProgressEffect, emit: Emit, kill: Callable[[int], None] = _kill_tree
    ) -> None:
        """Carry out a progress rule's verdict.

        Args:
            effect: ``StopHung``, ``KillOutlived`` or ``NoteStragglers``.
            emit: sends an agent event ``(kind, message, fields)``.
            kill: kills a worker by pid (default: SIGKILL to its process group).
        """
        if isinstance(effect, StopHung):
            self._stop_hung(effect.workers, emit, kill)
        elif isinstance(effect, KillOutlived):
            self._kill_outlived(effect, emit, kill)
        else:
            self._note_stragglers(effect, emit)

    def _stop_hung(
        self, hung: Sequence[HungWorker], emit: Emit, kill: Callable[[int], None]
    ) -> None:
        """Kill the hung workers (their stacks are on disk by now), with a ``worker.hung`` event."""
        self.watch.judged_hung(hung)
        if hung and self._publisher is not None:
            # The job's picture before the kill: this node's record goes out now, and the peers'
            # (their ranks wait in a collective on the hung one, and take their stacks about
            # when this node does) are read for up to a few seconds. After the kill, the peers'
            # workers break on the dead rank and their pictures are gone.
            self._publisher.nudge()
            self._job_hang = self._publisher.job_hang()
        for worker in hung:
            self._killed[worker.pid] = worker
            where = worker.where
            emit(
                "worker.hung",
                worker.sentence()
                + (f"; stacks in {worker.stacks_file}" if worker.stacks_file else ""),
                {
                    "rank": worker.rank,
                    "local_rank": worker.local_rank,
                    "pid": worker.pid,
                    "silent_s": round(worker.silence.silent_s, 3),
                    "timeout_s": round(worker.silence.timeout_s, 3),
                    "learned": worker.silence.learned,
                    "where": where.text()[:_WHERE_CHARS] if where is not None else "",
                    "function": where.function if where is not None else "",
                    "in_collective": where.in_collective if where is not None else None,
                    "stacks": str(worker.stacks_file) if worker.stacks_file else None,
                    "stacks_error": worker.stacks_error,
                },
            )
            kill(worker.pid)
        if self._publisher is not None:
            self._publisher.nudge()

    def _kill_outlived(self, effect: KillOutlived, emit: Emit, kill: Callable[[int], None]) -> None:
        for ended, lived_s in effect.workers:
            outlived = self.script_end.settle(ended, lived_s)
            if outlived is None:
                continue
            self._outlived[outlived.pid] = outlived
            emit(
                "worker.outlived",
                outlived.report(),
                {
                    "rank": outlived.rank,
                    "local_rank": outlived.local_rank,
                    "pid": outlived.pid,
                    "lived_s": round(outlived.lived_s, 3),
                    "timeout_s": outlived.bound_s,
                    "exitcode": outlived.code,
                    "exitcode_known": outlived.known,
                    "where": outlived.where[:_WHERE_CHARS],
                    "stacks": str(outlived.stacks_file) if outlived.stacks_file else None,
                },
            )
            kill(outlived.pid)

    def _note_stragglers(self, effect: NoteStragglers, emit: Emit) -> None:
        publisher = self._publisher
        reading = publisher.reading if publisher is not None else None
        if reading is None or reading.round != effect.round:
            return
        self._judged = reading
        self._stragglers = (effect.round, effect.watch)
        median = reading.steps.median_s or 0.0
        events = [
            (
                "straggler",
                f"rank {slow.rank} ({slow.host}) is a straggler: {slow.time_s:.3f} s per step, "
                f"{ratio:.2f}x the job's median {median:.3f} s",
                {
                    "rank": slow.rank,
                    "host": slow.host,
                    "node": slow.node_id,
                    "time_s": round(slow.time_s, 6),
                    "median_s": round(median, 6),
                    "ratio": round(ratio, 3),
                },
            )
            for slow, ratio in effect.new
        ]
        summary = {
            "round": effect.round,
            **job_summary(
                reading.steps, self.options.straggler_factor, sorted(effect.watch.reported)
            ),
        }

        def announce() -> None:  # on the publisher's thread, once the summary is written
            for kind, message, fields in events:
                emit(kind, message, fields)

        assert publisher is not None
        publisher.publish_job(summary, announce if events else None)

    def _recent_stacks(self, local_rank: int) -> StackReport | None:
        """This worker's stacks if the hang watch took them within the last 10 s."""
        if not self.watch.stacks_taken(local_rank, _RECENT_STACKS_S):
            return None
        return self.watch.report(local_rank)

    # -- what the worker group asks (ExitNotes) ------------------------------------------

    def amend(
        self, exits: Mapping[int, WorkerExit], stop: AgentStop | None = None
    ) -> dict[int, WorkerExit]:
        """The workers' exits, each one after its script's end counted as the script's status.

        A worker killed for outliving its script, or a warm one killed by a signal after its
        script ended; the latter is said once (event ``worker.died_after_script``, in the next
        view's notices). An exit by the agent's own stop (``stop``) stays as it is.
        """
        amended = self.script_end.amend(exits, stop)
        for died in self.script_end.died_after_script():
            self._notices.append(
                Notice(
                    "worker.died_after_script",
                    died.sentence(),
                    {
                        "rank": died.rank,
                        "local_rank": died.local_rank,
                        "pid": died.pid,
                        "exitcode": died.exitcode,
                        "counted": died.code,
                    },
                )
            )
        return amended

    def before_failed_stop(self, alive: Iterable[int]) -> None:
        """Take the stacks of the surviving workers of a failed group before they are stopped.

        Args:
            alive: the local ranks still running.
        """
        todo = [lr for lr in alive if not self.watch.stacks_taken(lr)]
        if todo:
            self.watch.take_stacks(
                "the group failed: the surviving workers are being stopped", todo
            )

    def before_timer_kill(self, pid: int) -> str:
        """Take a worker's stacks before the watchdog kills it (on the watchdog's thread).

        Returns:
            Where it was, for the failure's text (``""`` when unknown).
        """
        local_rank = next((lr for lr, p in self._pids().items() if p == pid), None)
        if local_rank is None:
            return ""
        self.watch.take_stacks("its watchdog timer expired", [local_rank])
        return self._where_text(local_rank)

    def _pids(self) -> dict[int, int]:
        return {lr: pid for lr, pid in self.watch.pids().items() if pid}

    def _where_text(self, local_rank: int) -> str:
        where, path = self.watch.where(local_rank)
        parts = []
        if where is not None:
            parts.append(f"stuck in {where.text()}")
        if path is not None:
            parts.append(f"stacks in {path}")
        return "; ".join(parts)

    # -- failures ------------------------------------------------------------------------

    def failure_error(self, pid: int) -> WorkerErrorInfo | None:
        """The error of a worker the agent killed as hung or as outliving its script (None: it
        was neither)."""
        outlived = self._outlived.get(pid)
        if outlived is not None:
            return WorkerErrorInfo(message=outlived.sentence())
        worker = self._killed.get(pid)
        if worker is None:
            return None
        report = self.watch.report(worker.local_rank)
        # The picture read before the kill (``stop_hung``); waiting for the peers here would
        # delay this failure's report, and the peer whose workers broke on the killed rank
        # would report first.
        job = self._job_hang
        if job is None and self._publisher is not None:
            job = self._publisher.job_hang(patience_s=0.0)
        return WorkerErrorInfo(
            message=f"hung: {worker.sentence()}" + (f"\njob: {job.sentence()}" if job else ""),
            traceback=_stack_text(report) if report is not None else None,
        )

    def stacks_file(self, local_rank: int) -> Path | None:
        """The worker's ``stacks.txt`` of this attempt, when one was written."""
        return self.watch.where(local_rank)[1]

    # -- publication --------------------------------------------------------------------

    def node_record(self, round_: int, attempt: int) -> dict[str, Any]:
        """This node's progress record (``pg/<node id>``), bounded by its local world size."""
        pictures = self.watch.progress()
        ranks = [
            {
                "rank": self._ranks.get(lr, -1),
                "local_rank": lr,
                "step": p.step,
                "beats": p.beats,
                "step_s": _round(p.step_time_s),
                "work_s": _round(p.work_time_s),
                "age_s": _round(p.last_beat_age_s, 3),
                "timeout_s": _round(p.timeout_s, 3),
                "verdict": p.verdict,
                "where": p.where[:_WHERE_CHARS],
            }
            for lr, p in sorted(pictures.items())
        ]
        last = self.watch.last_hang
        record: dict[str, Any] = {
            "round": round_,
            "attempt": attempt,
            "host": self._host,
            "hang_rule": self.options.hang.describe(),
            "ranks": ranks,
            "last_hang": last.sentence()[:400] if last is not None else None,
        }
        stuck = self.watch.stuck
        if stuck:
            record["stuck"] = stuck_record(round_, stuck)
        return record

    def start_publisher(
        self,
        handler: object,
        run_id: str,
        *,
        position: Callable[[], tuple[int, int]],
        attempt: Callable[[], int],
        running: Callable[[], bool],
        members: Callable[[int], Sequence[str]],
        goodput: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        """Start publishing, when the rendezvous handler can lend its backend (ours can).

        Args:
            handler: the rendezvous handler.
            run_id: the job's id.
            position: (round, group rank) now.
            attempt: this node's attempt now.
            running: whether the workers run (records are published only then, and once more
                right after a hang verdict: never while the job ends and its store goes away).
            members: the node ids of a round's members.
            goodput: this node's goodput account now, as its published JSON.
        """
        if not isinstance(handler, TelemetryHost):
            return
        telemetry = handler.telemetry()

        def record(forced: bool) -> dict[str, Any] | None:
            round_, _ = position()
            if round_ < 0 or not (forced or running()):
                return None
            return self.node_record(round_, attempt())

        self._publisher = ProgressPublisher(
            telemetry,
            node_record=record,
            position=position,
            members=members,
            goodput=goodput,
        )
        self._publisher.start()

    def job_progress(self) -> JobProgress | None:
        """The job's step times as last published (None: not known)."""
        return self._publisher.job if self._publisher is not None else None

    def stop_publisher(self) -> None:
        """Stop the publisher thread. Idempotent."""
        if self._publisher is not None:
            self._publisher.stop()
            self._publisher = None


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _stack_text(report: StackReport) -> str:
    return format_stacks(report, f"Python stacks of pid {report.pid} (innermost frame first):")
