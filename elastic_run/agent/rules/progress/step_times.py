"""Step times and stragglers: each rank's recent step time, the job's median, the slow ranks. Pure.

A rank's *step time* is the mean gap between its progress beats over the last
``WINDOW_S`` seconds. In synchronous training every rank's step lasts as long as the slowest's,
so that alone cannot tell which rank is slow; a rank that also calls ``sync_point()`` before its
step's collective reports its *work time* (from a beat to the next sync point: its own compute),
and the work time is what ranks are compared by when they report one (:attr:`StepWindow.work_s`).

A *straggler* is a rank whose time stays at or above ``factor`` x the job's median for
``hold_s`` seconds (:func:`watch_stragglers`); it is reported once, and again only after it
came back under the factor.

No clock or I/O here: readings carry monotonic nanoseconds, passed in.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

__all__ = [
    "DEFAULT_FACTOR",
    "HOLD_S",
    "WINDOW_S",
    "JobSteps",
    "RankTime",
    "StepSample",
    "StepWindow",
    "StragglerWatch",
    "summarize",
    "watch_stragglers",
]

DEFAULT_FACTOR = 1.5
WINDOW_S = 20.0
HOLD_S = 5.0
_NS = 1_000_000_000


@dataclass(frozen=True)
class StepSample:
    """One reading of a worker's counters.

    Attributes:
        at_ns: when it was read (monotonic).
        beats: beats so far.
        last_beat_ns: the monotonic time of the last beat.
        busy_ns: total work time so far (beat to sync point).
        busy_count: sync points counted in ``busy_ns``.
    """

    at_ns: int
    beats: int
    last_beat_ns: int
    busy_ns: int = 0
    busy_count: int = 0


@dataclass(frozen=True)
class StepWindow:
    """A worker's readings over the last ``WINDOW_S`` seconds (oldest first)."""

    samples: tuple[StepSample, ...] = ()

    def add(self, sample: StepSample, window_s: float = WINDOW_S) -> StepWindow:
        """Add a reading; drop those older than the window, keeping one to measure from."""
        kept = [s for s in self.samples if sample.at_ns - s.at_ns <= window_s * _NS]
        older = [s for s in self.samples if sample.at_ns - s.at_ns > window_s * _NS]
        if older:
            kept.insert(0, older[-1])
        if kept and kept[-1].beats == sample.beats and kept[-1].busy_count == sample.busy_count:
            kept[-1] = sample  # nothing new: keep the window short
        else:
            kept.append(sample)
        return StepWindow(tuple(kept))

    @property
    def step_s(self) -> float | None:
        """The mean gap between beats over the window (None: fewer than two beats in it)."""
        if not self.samples:
            return None
        first, last = self.samples[0], self.samples[-1]
        beats = last.beats - first.beats
        if beats <= 0 or first.beats == 0:
            return None
        return (last.last_beat_ns - first.last_beat_ns) / beats / _NS

    @property
    def busy_s(self) -> float | None:
        """The mean work time (beat to sync point) over the window (None: no sync points)."""
        if not self.samples:
            return None
        first, last = self.samples[0], self.samples[-1]
        count = last.busy_count - first.busy_count
        if count <= 0:
            return None
        return (last.busy_ns - first.busy_ns) / count / _NS

    @property
    def work_s(self) -> float | None:
        """What ranks are compared by: the work time when reported, else the step time."""
        busy = self.busy_s
        return busy if busy is not None else self.step_s


@dataclass(frozen=True)
class RankTime:
    """One rank's time, as a node published it.

    Attributes:
        rank: the global rank.
        time_s: its work (or step) time.
        host: its node's host.
        node_id: its node's id.
    """

    rank: int
    time_s: float
    host: str = ""
    node_id: str = ""


@dataclass(frozen=True)
class JobSteps:
    """The job's step times at a glance.

    Attributes:
        median_s: the median over the ranks that reported one (None: none did).
        ranks: how many ranks reported one.
        slowest: the slowest ranks, slowest first, each with its ratio to the median.
    """

    median_s: float | None
    ranks: int
    slowest: tuple[tuple[RankTime, float], ...] = ()


def summarize(times: Sequence[RankTime], top: int = 5) -> JobSteps:
    """The median and the ``top`` slowest ranks (ratio = time / median).

    Args:
        times: one entry per rank (ranks without a time left out).
        top: how many of the slowest to keep.
    """
    valid = [t for t in times if t.time_s > 0]
    if not valid:
        return JobSteps(None, 0)
    median = statistics.median(t.time_s for t in valid)
    slowest = sorted(valid, key=lambda t: (-t.time_s, t.rank))[:top]
    return JobSteps(median, len(valid), tuple((t, t.time_s / median) for t in slowest))


@dataclass(frozen=True)
class StragglerWatch:
    """Which ranks are above the factor, since when, and which were reported.

    Attributes:
        above_since: rank -> monotonic ns since it has been at or above the factor.
        reported: ranks reported as stragglers and not yet back under the factor.
    """

    above_since: Mapping[int, int] = field(default_factory=dict)
    reported: frozenset[int] = frozenset()


def watch_stragglers(
    watch: StragglerWatch,
    steps: JobSteps,
    times: Sequence[RankTime],
    *,
    factor: float,
    now_ns: int,
    hold_s: float = HOLD_S,
) -> tuple[StragglerWatch, tuple[tuple[RankTime, float], ...]]:
    """Update which ranks straggle; return the ranks that just became stragglers.

    Args:
        watch: the state so far.
        steps: the job's summary (its median).
        times: every rank's time.
        factor: a rank at or above ``factor`` x the median straggles.
        now_ns: now.
        hold_s: how long it must stay there before it is reported.

    Returns:
        The new state and the new stragglers (each with its ratio), slowest first.
    """
    if steps.median_s is None or steps.ranks < 2:
        return StragglerWatch(), ()
    median = steps.median_s
    above = {t.rank: t for t in times if t.time_s >= factor * median}
    since = {rank: watch.above_since.get(rank, now_ns) for rank in above}
    due = [
        above[rank]
        for rank, start in since.items()
        if now_ns - start >= hold_s * _NS and rank not in watch.reported
    ]
    reported = frozenset(r for r in watch.reported if r in above) | {t.rank for t in due}
    new = tuple((t, t.time_s / median) for t in sorted(due, key=lambda t: (-t.time_s, t.rank)))
    return replace(watch, above_since=since, reported=reported), new
