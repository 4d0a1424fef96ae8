"""Publishing progress for ``elastic-run status``, and reading the job's step times.

A thread (the store may block; the agent loop must not), once a second:

- every node writes its own record (``pg/<node id>``: its ranks' steps, step and work times,
  beats, hang timeouts and verdicts): one O(1) write per node per second, whatever the job's
  size;
- the node of group rank 0 also, every ``judge_every_s``, reads the round's records (one batch
  read of N small keys) into a :class:`~elastic_run.agent.rules.observation.StepsReading` (every
  rank's time, the median and the slowest: ``step_times.py``), which the agent's straggler rule
  judges on the loop (``agent/rules/progress/straggler.py``); the summary it hands back, with the
  stragglers marked, is written here (``pg/job``, O(1));
- every other node reads that summary at the same pace (one O(1) read) for its live panel;
- every node writes its goodput account (``gp/<node id>``, O(1)) every ``goodput_every_s``.

A node none of whose workers has beaten yet (a script that does not call ``progress()``, or
one still in its first step) has nothing that changes every second: it writes its record when
the record changes and otherwise every ``idle_refresh_s`` (10 s), and reads or judges nothing,
so a job that does not opt in costs its store about 0.1 request per node per second here.

Nothing here raises into the agent: a store that fails is logged and tried again next second.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from elastic_run.agent.loop.snapshot import JobProgress
from elastic_run.agent.progress.hang_picture import JobHang, merge, parse_stuck
from elastic_run.agent.rules.observation import StepsReading
from elastic_run.agent.rules.progress.step_times import JobSteps, RankTime, summarize
from elastic_run.rendezvous.dynamic.telemetry import Telemetry
from elastic_run.rendezvous.errors import RendezvousError

__all__ = ["ProgressPublisher", "job_progress", "job_summary", "rank_times", "slowest_rows"]

log = logging.getLogger(__name__)


def rank_times(records: Mapping[str, Mapping[str, Any]], round_: int) -> list[RankTime]:
    """Every rank's work time from the nodes' records of round ``round_`` (others are stale).

    Args:
        records: node id -> its progress record.
        round_: the round whose records count (-1: any).
    """
    times = []
    for node_id, record in records.items():
        if round_ >= 0 and record.get("round") != round_:
            continue
        for entry in record.get("ranks") or ():
            if not isinstance(entry, Mapping):
                continue
            value = entry.get("work_s")
            rank = entry.get("rank")
            if isinstance(value, (int, float)) and isinstance(rank, int) and value > 0:
                times.append(RankTime(rank, float(value), str(record.get("host", "")), node_id))
    return times


def job_summary(steps: JobSteps, factor: float, stragglers: Sequence[int]) -> dict[str, Any]:
    """The ``pg/job`` record: median, ranks reporting, slowest ranks with their ratios."""
    return {
        "median_s": steps.median_s,
        "ranks": steps.ranks,
        "factor": factor,
        "slowest": slowest_rows(steps, lambda rank, ratio: rank in stragglers),
    }


def slowest_rows(
    steps: JobSteps, is_straggler: Callable[[int, float], bool]
) -> list[dict[str, Any]]:
    """The slowest ranks as ``pg/job`` and ``status --json`` show them.

    Args:
        steps: the job's step times, summarised.
        is_straggler: (rank, ratio to the median) -> whether to mark the rank a straggler.
    """
    return [
        {
            "rank": t.rank,
            "host": t.host,
            "node": t.node_id,
            "work_s": round(t.time_s, 6),
            "ratio": round(ratio, 3),
            "straggler": is_straggler(t.rank, ratio),
        }
        for t, ratio in steps.slowest
    ]


def _has_beats(record: Mapping[str, Any]) -> bool:
    """Whether any worker of a node record has beaten (its picture then changes every step)."""
    return any(
        isinstance(r, Mapping) and isinstance(r.get("beats"), int) and r["beats"] > 0
        for r in record.get("ranks") or ()
    )


def job_progress(record: Mapping[str, Any]) -> JobProgress:
    """A ``pg/job`` record as the agent's snapshot carries it."""
    slowest = []
    for entry in record.get("slowest") or ():
        if isinstance(entry, Mapping):
            rank, work, ratio = entry.get("rank"), entry.get("work_s"), entry.get("ratio")
            if isinstance(rank, int) and isinstance(work, (int, float)):
                slowest.append((rank, float(work), float(ratio or 0.0)))
    median = record.get("median_s")
    return JobProgress(
        median_s=float(median) if isinstance(median, (int, float)) else None,
        ranks=int(record.get("ranks") or 0),
        slowest=tuple(slowest),
        stragglers=tuple(
            e["rank"]
            for e in record.get("slowest") or ()
            if isinstance(e, Mapping) and e.get("straggler") and isinstance(e.get("rank"), int)
        ),
    )


class ProgressPublisher:
    """The thread that publishes this node's progress and, on node 0, reads the job's steps.

    Args:
        telemetry: this node's writer.
        node_record: this node's record now, given whether the publication was forced by
            :meth:`nudge` (None: nothing to publish now).
        position: (round, group rank) of this node now ((-1, -1) before the first round).
        members: the node ids of a round's members (node 0 asks once per round).
        interval_s: between two publications.
        judge_every_s: between two readings of the job's step times on node 0.
        idle_refresh_s: between two publications of an unchanged record of a node whose
            workers have not beaten.
        goodput: this node's goodput account now (its JSON), published every
            ``goodput_every_s`` (None: not published).
        goodput_every_s: between two publications of the goodput account.
    """

    def __init__(
        self,
        telemetry: Telemetry,
        *,
        node_record: Callable[[bool], dict[str, Any] | None],
        position: Callable[[], tuple[int, int]],
        members: Callable[[int], Sequence[str]],
        interval_s: float = 1.0,
        judge_every_s: float = 2.0,
        idle_refresh_s: float = 10.0,
        goodput: Callable[[], Mapping[str, Any]] | None = None,
        goodput_every_s: float = 5.0,
    ) -> None:
        self._telemetry = telemetry
        self._node_record = node_record
        self._position = position
        self._members = members
        self._interval_s = interval_s
        self._judge_every_s = judge_every_s
        self._stop = threading.Event()
        self._nudged = threading.Event()
        self._thread: threading.Thread | None = None
        self._reading: StepsReading | None = None
        self._summary: tuple[dict[str, Any], Callable[[], None] | None] | None = None
        self._member_ids: tuple[int, Sequence[str]] = (-1, ())
        self._next_judge = 0.0
        self._idle_refresh_s = idle_refresh_s
        self._last_idle: tuple[dict[str, Any] | None, float] = (None, 0.0)
        self._goodput = goodput
        self._goodput_every_s = goodput_every_s
        self._next_goodput = 0.0
        self.job: JobProgress | None = None

    def start(self) -> None:
        """Start the thread."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="progress-publisher", daemon=True)
        self._thread.start()

    def nudge(self) -> None:
        """Publish now (a hang verdict: ``status`` should show it at once). Any thread."""
        self._nudged.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (bounded join). Idempotent."""
        self._stop.set()
        self._nudged.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("the progress publisher did not stop in %.0f s", timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            forced = self._nudged.wait(self._interval_s)
            self._nudged.clear()
            if self._stop.is_set():
                break
            try:
                self.publish_once(time.monotonic(), forced=forced)
            except Exception:  # never let a bug end the publications silently
                log.exception("publishing progress failed")

    def publish_once(self, now: float, forced: bool = False) -> None:
        """Publish this node's record; on node 0, read the job's step times when due."""
        pending, self._summary = self._summary, None
        if pending is not None:
            summary, then = pending
            try:
                self._telemetry.publish_job_progress(summary)
            except RendezvousError as exc:
                log.info("publishing the job's progress: %s", exc)
            if then is not None:
                then()
        record = self._node_record(forced)
        if record is None:
            return
        if self._goodput is not None and (forced or now >= self._next_goodput):
            self._next_goodput = now + self._goodput_every_s
            self._telemetry.publish_goodput(self._goodput())
        if not _has_beats(record):
            last, at = self._last_idle
            if forced or record != last or now - at >= self._idle_refresh_s:
                self._telemetry.publish_progress(record)
                self._last_idle = (record, now)
            return  # nothing to judge: no step times anywhere on this node
        self._last_idle = (None, 0.0)
        self._telemetry.publish_progress(record)
        round_, group_rank = self._position()
        if round_ < 0 or now < self._next_judge:
            return
        self._next_judge = now + self._judge_every_s
        try:
            if group_rank == 0:
                self._read_steps(round_, time.monotonic_ns())
            else:  # one O(1) read: the summary node 0 wrote, for the live panel
                _, job, _ = self._telemetry.read_progress(())
                self.job = job_progress(job) if job is not None else None
        except RendezvousError as exc:
            log.info("reading or judging the job's progress: %s", exc)

    def job_hang(self, patience_s: float = 5.0) -> JobHang | None:
        """The job's hang picture of this round, merged from every member's record (the node
        that judged a hang reads its peers'; one batch read, again each second for up to
        ``patience_s`` until every member's record of the round has its silent ranks: a peer
        takes its stacks about when this node does). None: no picture, or the store failed."""
        round_, _ = self._position()
        if round_ < 0:
            return None
        members = tuple(self._members(round_))
        deadline = time.monotonic() + patience_s
        picture = None
        while True:
            try:
                records, _, _ = self._telemetry.read_progress(members)
            except RendezvousError as exc:
                log.info("reading the peers' hang pictures: %s", exc)
                return picture
            picture = merge(records, round_)
            pictured = sum(1 for r in records.values() if parse_stuck(r) is not None)
            if pictured >= len(members) or self._stop.wait(
                min(1.0, max(0.0, deadline - time.monotonic()))
            ):
                return picture
            if time.monotonic() >= deadline:
                return picture

    def _read_steps(self, round_: int, now_ns: int) -> None:
        if self._member_ids[0] != round_:
            self._member_ids = (round_, tuple(self._members(round_)))
        records, _, _ = self._telemetry.read_progress(self._member_ids[1])
        times = rank_times(records, round_)
        self._reading = StepsReading(round_, tuple(times), summarize(times), now_ns)

    @property
    def reading(self) -> StepsReading | None:
        """The job's step times as last read (node 0; any thread: replaced whole)."""
        return self._reading

    def publish_job(self, summary: dict[str, Any], then: Callable[[], None] | None = None) -> None:
        """Write the job's summary (``pg/job``) at the next publication, and show it at once.

        Args:
            summary: the round, the median, the slowest ranks, the stragglers marked.
            then: called on this thread once it is written (the straggler events, so that a
                reader who sees one finds the summary that marks it).
        """
        self.job = job_progress(summary)
        self._summary = (summary, then)
        if then is not None:
            self._nudged.set()
