"""The agent's duties around progress beats, in one place for ``LocalElasticAgent`` to call.

What the local agent does with beats, apart from the loop's decisions (``state_machine.py``):
the beat file and worker variables of each attempt, the tick that reads the beats and judges
(:class:`~elastic_run.agent.progress.hang_watch.HangWatch`), stopping the hung workers with a
``worker.hung`` event, stacks before the survivors of a failed group are stopped and before
the watchdog kills a worker, the error text of a hung worker's failure, the observation fields
the state machine reads, the node's progress record and its ``/metrics``, the publisher
thread (``publisher.py``), and workers that outlive their script's end
(``script_end_watch.py``: killed with a ``worker.outlived`` event, their exit counted as the
script's own), and warm workers that die after their script's end (counted as the script's
status, with a ``worker.died_after_script`` event).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from elastic_run.agent.loop import state_machine as sm
from elastic_run.agent.loop.snapshot import JobProgress
from elastic_run.agent.progress.config import ProgressOptions
from elastic_run.agent.progress.hang_picture import JobHang, stuck_record
from elastic_run.agent.progress.hang_watch import HangWatch, HungWorker
from elastic_run.agent.progress.publisher import ProgressPublisher
from elastic_run.agent.progress.script_end_watch import Outlived, ScriptEndWatch, WarmEnds
from elastic_run.agent.progress.stack_report import StackReport, format_stacks
from elastic_run.agent.workers.failures import WorkerErrorInfo
from elastic_run.agent.workers.processes import WorkerExit
from elastic_run.rendezvous.dynamic.telemetry import TelemetryHost
from elastic_run.worker.auto_progress import AUTO_PROGRESS_ENV

__all__ = ["ProgressDuties"]

log = logging.getLogger(__name__)

_Emit = Callable[[str, str, dict[str, Any]], None]
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
    """

    def __init__(self, options: ProgressOptions, host: str, beat_dir: Path | None = None) -> None:
        self.options = options
        self.watch = HangWatch(options.hang, beat_dir)
        self.script_end = ScriptEndWatch(options.script_exit_timeout_s, recent=self._recent_stacks)
        self._host = host
        self._ranks: dict[int, int] = {}
        self._killed: dict[int, HungWorker] = {}
        self._outlived: dict[int, Outlived] = {}
        self._emit: Callable[..., None] | None = None
        self._publisher: ProgressPublisher | None = None
        self._job_hang: JobHang | None = None

    # -- attempts ------------------------------------------------------------------------

    def env_for_attempt(
        self, attempt: int, workers: Sequence[tuple[int, int]], log_dirs: Mapping[int, Path]
    ) -> dict[int, dict[str, str]]:
        """The beat variables of each worker of a new attempt ((local rank, rank) pairs).

        With automatic beats on (the default), a worker given a slot is also told to beat once
        per optimizer step (``ELASTIC_RUN_AUTO_PROGRESS=1``, see :mod:`elastic_run.worker.auto_progress`).
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

    def started(
        self,
        pids: Mapping[int, int],
        warm: WarmEnds | None = None,
        emit: Callable[..., None] | None = None,
    ) -> None:
        """The attempt's workers run.

        Args:
            pids: local rank -> pid.
            warm: the warm starts (they know when a warm worker's script ended).
            emit: sends an agent event ``(kind, message, **fields)`` (for ``worker.outlived``).
        """
        self.watch.started(pids)
        self.script_end.started(pids, warm)
        self._emit = emit

    def workers_stopping(self, signals: Iterable[int], at: float) -> None:
        """The agent stops the workers with ``signals`` from ``at`` (epoch seconds): an exit by
        one of them is the agent's stop, never a crash after the script (``ScriptEndWatch``)."""
        self.script_end.stopping(signals, at)

    def attempt_ended(self, failed: bool) -> None:
        """The attempt's workers were stopped (``failed``: by a worker failure)."""
        self.watch.end_attempt(failed)

    def close(self) -> None:
        """Stop the publisher and remove the beat file. Idempotent."""
        self.stop_publisher()
        self.watch.close()

    # -- the loop --------------------------------------------------------------------------

    def tick(
        self,
        armed_pids: Iterable[int],
        exited: Iterable[int] = (),
        kill: Callable[[int], None] = _kill_tree,
    ) -> None:
        """Read the beats and judge; kill the workers that outlived their script's end.

        Each monitor tick, while workers run. A worker whose script ended is not judged hung
        (its beats stopped because its script did).

        Args:
            armed_pids: workers holding an armed file timer.
            exited: local ranks that already exited (not judged).
            kill: kills a worker by pid (default: SIGKILL to its process group).
        """
        gone = set(exited)
        self.watch.tick(armed_pids=armed_pids, exited=gone | self.script_end.ended())
        for lr, (where, seen_ns) in self.watch.after_script().items():
            self.script_end.note(lr, where, seen_ns)
        for outlived in self.script_end.tick(gone):
            self._outlived[outlived.pid] = outlived
            self._say(
                "worker.outlived",
                outlived.sentence(),
                outlived.report(),
                rank=outlived.rank,
                local_rank=outlived.local_rank,
                pid=outlived.pid,
                lived_s=round(outlived.lived_s, 3),
                timeout_s=outlived.bound_s,
                exitcode=outlived.code,
                exitcode_known=outlived.known,
                where=outlived.where[:_WHERE_CHARS],
                stacks=str(outlived.stacks_file) if outlived.stacks_file else None,
            )
            kill(outlived.pid)

    def _say(self, kind: str, sentence: str, message: str, **fields: Any) -> None:
        """Emit event ``kind`` (``message``, ``fields``), or log ``sentence`` without a sink."""
        if self._emit is None:
            log.warning("%s", sentence)
        else:
            self._emit(kind, message, **fields)

    def _recent_stacks(self, local_rank: int) -> StackReport | None:
        """This worker's stacks if the hang watch took them within the last 10 s."""
        if not self.watch.stacks_taken(local_rank, _RECENT_STACKS_S):
            return None
        return self.watch.report(local_rank)

    def amend_exits(self, exits: Mapping[int, WorkerExit]) -> dict[int, WorkerExit]:
        """The workers' exits, each one after its script's end counted as the script's status.

        A worker killed for outliving its script, or a warm one killed by a signal after its
        script ended; the latter is said once (event ``worker.died_after_script``).
        """
        amended = self.script_end.amend(exits)
        for died in self.script_end.died_after_script():
            self._say(
                "worker.died_after_script",
                died.sentence(),
                died.sentence(),
                rank=died.rank,
                local_rank=died.local_rank,
                pid=died.pid,
                exitcode=died.exitcode,
                counted=died.code,
            )
        return amended

    def observe(self, obs: sm.Observation) -> sm.Observation:
        """Add what the state machine reads of progress to the loop's observation."""
        failed = obs.workers is sm.WorkersStatus.FAILED
        if failed:
            self.watch.read_beats()  # beats of workers that exited since the last tick count
        return replace(
            obs,
            hung=bool(self.watch.hung) and obs.workers is sm.WorkersStatus.RUNNING,
            no_progress_restarts=self.watch.no_progress_streak(failed),
            max_no_progress_restarts=self.options.max_no_progress_restarts,
        )

    def stop_hung(self, emit: _Emit, kill: Callable[[int], None] = _kill_tree) -> None:
        """Kill the hung workers (their stacks are on disk by now), with a ``worker.hung`` event.

        Args:
            emit: sends an agent event (kind, message, fields).
            kill: kills a worker by pid (default: SIGKILL to its process group).
        """
        hung = list(self.watch.hung)
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
            self.watch.mark(worker.local_rank, "hung")
        self.watch.forget_hung()
        if self._publisher is not None:
            self._publisher.nudge()

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
        emit: _Emit,
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
            emit: sends an agent event.
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
            factor=self.options.straggler_factor,
            emit=emit,
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

    def metrics(self) -> dict[str, float]:
        """Per-rank gauges for ``/metrics`` (names carry a ``rank`` label)."""
        out: dict[str, float] = {}
        for lr, p in self.watch.progress().items():
            label = f'{{rank="{self._ranks.get(lr, -1)}",local_rank="{lr}"}}'
            out["progress_beats" + label] = float(p.beats)
            out["progress_step" + label] = float(p.step)
            if p.step_time_s is not None:
                out["step_time_seconds" + label] = p.step_time_s
            if p.work_time_s is not None:
                out["work_time_seconds" + label] = p.work_time_s
            if p.last_beat_age_s is not None:
                out["last_beat_age_seconds" + label] = p.last_beat_age_s
            if p.timeout_s is not None:
                out["hang_timeout_seconds" + label] = p.timeout_s
            out["hung" + label] = 1.0 if p.verdict == "hung" else 0.0
        return out


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _stack_text(report: StackReport) -> str:
    return format_stacks(report, f"Python stacks of pid {report.pid} (innermost frame first):")
