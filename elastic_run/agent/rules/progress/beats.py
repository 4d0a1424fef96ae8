"""The hang verdict: from a worker's progress beats and ``now``, is it stuck? Pure.

A worker's beats come from ``elastic_run.worker.progress()`` (its shared-memory slot) and from
every arm or release of a file timer (ours or torch's client). The agent reads them each monitor
tick and folds them into a :class:`BeatHistory` (:func:`observe`); :func:`judge` then says
whether the worker's silence has lasted past its timeout.

The timeout (:func:`timeout_s`):

- ``--hang-timeout S`` (``fixed``): S seconds of silence, always.
- ``--hang-timeout auto`` (the default), learned from the gaps between the worker's beats:

      timeout = max(floor, 5 x p99(recent gaps), 2 x the longest gap seen)

  ``floor`` is 30 s (``auto:FLOOR`` sets it). Until 5 gaps have been seen (the warm-up: a
  first step that compiles, loads data, warms caches), the timeout is at least 600 s. Gaps of
  a kind seen before (a checkpoint every N steps) are covered by the longest-gap term; a longer
  gap of a kind never seen is covered while the worker's process visibly reads or writes
  storage (``io_active``): it is then given up to ``io_allowance_s`` (30 min). Only ``auto``
  grants these allowances.
- ``off``: never.

No progress (``--max-no-progress-restarts``, :func:`count_attempt`): an attempt made progress
when one of its workers reached a step beyond the furthest step of every earlier attempt; a job
that hangs at step 10 on every attempt makes none, however many steps it beats before.

Never judged: a worker that has not beaten yet (it did not opt in, or it is still in its first
step), and a worker that holds an armed file timer (the user's own bound for that region wins).

Invariants: no clock, process or I/O here; times are integers of nanoseconds on the host's
monotonic clock (the workers' and the agent's are the same clock), passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from elastic_run.agent.progress.stack_report import Where

__all__ = [
    "DEFAULT_FLOOR_S",
    "HangMode",
    "HangRule",
    "HungWorker",
    "NoProgressCount",
    "Silence",
    "BeatHistory",
    "count_attempt",
    "hung_now",
    "judge",
    "observe",
    "parse_hang_timeout",
    "positive_seconds",
    "timeout_s",
]

HangMode = Literal["off", "fixed", "auto"]

DEFAULT_FLOOR_S = 30.0
_NS = 1_000_000_000
_MAX_GAPS = 256


@dataclass(frozen=True)
class HangRule:
    """How silence becomes a hang verdict (see the module docstring).

    Attributes:
        mode: ``off``, ``fixed`` or ``auto``.
        timeout_s: ``fixed``: the timeout; ``auto``: the floor.
        multiplier: ``auto``: times the percentile of recent gaps.
        percentile: ``auto``: which percentile of recent gaps (0..1).
        longest_multiplier: ``auto``: times the longest gap seen.
        warmup_gaps: ``auto``: gaps to see before the learned value alone applies.
        warmup_allowance_s: ``auto``: the least timeout during the warm-up.
        io_allowance_s: ``auto``: the longest silence granted while the process does storage I/O.
    """

    mode: HangMode = "auto"
    timeout_s: float = DEFAULT_FLOOR_S
    multiplier: float = 5.0
    percentile: float = 0.99
    longest_multiplier: float = 2.0
    warmup_gaps: int = 5
    warmup_allowance_s: float = 600.0
    io_allowance_s: float = 1800.0

    def collective_grace_s(self, timeout: float, capture_s: float = 0.0) -> float:
        """How long a node whose silent workers all wait in a collective leaves to the others.

        Those workers wait for a peer that is stuck elsewhere; the peer's own node finds it
        (its verdict ends the round, and every node re-rendezvouses at once). Only when no node
        acted within this grace does this node act on its own waiting workers. The peer's node
        takes stacks before it acts, as this node did in ``capture_s``: on a loaded host that is
        slow, so the grace is at least three such captures.
        """
        return max(min(60.0, max(5.0, 0.25 * timeout)), 3 * capture_s)

    def describe(self) -> str:
        """One line for people: ``auto (floor 30 s)``, ``5 s``, ``off``."""
        if self.mode == "off":
            return "off"
        if self.mode == "fixed":
            return f"{self.timeout_s:g} s"
        return f"auto (floor {self.timeout_s:g} s)"


def parse_hang_timeout(text: str) -> HangRule:
    """Parse ``--hang-timeout``: ``auto``, ``auto:FLOOR``, ``off`` (or ``0``), or seconds.

    Raises:
        ValueError: anything else, or a number that is not positive and finite.
    """
    value = text.strip().lower()
    if value in ("off", "0", "none"):
        return HangRule(mode="off")
    mode: HangMode = "fixed"
    if value == "auto":
        return HangRule(mode="auto")
    if value.startswith("auto:"):
        mode, value = "auto", value[len("auto:") :]
    seconds = positive_seconds(text, value, "auto, auto:FLOOR, off or a number of seconds")
    return HangRule(mode=mode, timeout_s=seconds)


def positive_seconds(text: str, value: str, expected: str, hint: str = "") -> float:
    """``value`` (the part of the flag's ``text`` that holds a number) as positive, finite seconds.

    Args:
        text: the flag's whole value, as the user wrote it (for the message).
        value: the number's text.
        expected: what the flag takes, for the message (``a number of seconds or off``).
        hint: appended to the message of a number that is out of range (``" (or off)"``).

    Raises:
        ValueError: not a number, or not positive and finite.
    """
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{text!r} is not {expected}") from None
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"{text!r}: the seconds must be positive and finite{hint}")
    return seconds


@dataclass(frozen=True)
class BeatHistory:
    """What the agent knows of one worker's beats.

    Attributes:
        beats: beats seen so far (0: none).
        step: the worker's last named step (-1: none).
        last_beat_ns: the monotonic time of the last beat (0: none).
        gaps_s: the most recent gaps between beats, oldest first (at most 256).
        gaps_seen: how many gaps were seen in all (the warm-up counts these).
        longest_s: the longest gap seen.
    """

    beats: int = 0
    step: int = -1
    last_beat_ns: int = 0
    gaps_s: tuple[float, ...] = ()
    gaps_seen: int = 0
    longest_s: float = 0.0


def observe(
    history: BeatHistory, beats: int, step: int, last_beat_ns: int, last_gap_ns: int = 0
) -> BeatHistory:
    """Fold one reading of a worker's beats into its history.

    Between two readings several beats may have happened; their gaps are then estimated: the
    last from ``last_gap_ns`` (when the worker measured it), the first as the rest of the
    elapsed time (it is the one that can be long: it started before the previous reading).

    Args:
        history: the history so far.
        beats: the worker's beat count now (a counter: it never goes down).
        step: the worker's last named step.
        last_beat_ns: the monotonic time of its last beat.
        last_gap_ns: the gap between its last two beats as it measured it (0: unknown).

    Returns:
        The new history (the same object when nothing changed).
    """
    new = beats - history.beats
    if new <= 0:
        return history
    gaps: list[float] = []
    if history.beats == 0:
        if new >= 2 and last_gap_ns > 0:
            gaps.append(last_gap_ns / _NS)
        seen = new - 1
    else:
        total = max(0, last_beat_ns - history.last_beat_ns) / _NS
        if new == 1:
            gaps.append(total)
        else:
            last = last_gap_ns / _NS if 0 < last_gap_ns / _NS <= total else total / new
            gaps.append(max(total - (new - 1) * last, last))
            gaps.append(last)
        seen = new
    kept = (history.gaps_s + tuple(gaps))[-_MAX_GAPS:]
    return replace(
        history,
        beats=beats,
        step=step,
        last_beat_ns=last_beat_ns,
        gaps_s=kept,
        gaps_seen=history.gaps_seen + seen,
        longest_s=max([history.longest_s, *gaps]),
    )


def _percentile(values: tuple[float, ...], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def timeout_s(history: BeatHistory, rule: HangRule) -> float | None:
    """The silence after which this worker is hung, in seconds.

    None: never judged, so there is no timeout to show: the rule is ``off``, or the worker has
    not beaten yet (a worker that never beats is never judged hung).
    """
    if rule.mode == "off" or history.beats == 0:
        return None
    if rule.mode == "fixed":
        return rule.timeout_s
    learned = rule.timeout_s
    if history.gaps_s:
        learned = max(
            learned,
            rule.multiplier * _percentile(history.gaps_s, rule.percentile),
            rule.longest_multiplier * history.longest_s,
        )
    if history.gaps_seen < rule.warmup_gaps:
        learned = max(learned, rule.warmup_allowance_s)
    return learned


@dataclass(frozen=True)
class Silence:
    """A worker silent past its timeout.

    Attributes:
        silent_s: seconds since its last beat.
        timeout_s: the timeout it passed.
        learned: whether the timeout was learned (``auto``) rather than given.
    """

    silent_s: float
    timeout_s: float
    learned: bool


def judge(
    history: BeatHistory,
    rule: HangRule,
    now_ns: int,
    *,
    timer_armed: bool = False,
    io_active: bool = False,
) -> Silence | None:
    """Whether this worker has been silent past its timeout.

    Args:
        history: its beats so far.
        rule: the hang rule.
        now_ns: the monotonic time now.
        timer_armed: it holds an armed file timer (the watchdog judges it instead).
        io_active: its process read or wrote storage lately (``auto`` only: a checkpoint).

    Returns:
        The silence, or None when it is not (or cannot be) judged hung.
    """
    limit = timeout_s(history, rule)
    if limit is None or history.beats == 0 or timer_armed:
        return None
    silent = max(0, now_ns - history.last_beat_ns) / _NS
    if silent <= limit:
        return None
    if rule.mode == "auto" and io_active and silent <= rule.io_allowance_s:
        return None
    return Silence(silent, limit, learned=rule.mode == "auto")


@dataclass(frozen=True)
class NoProgressCount:
    """What ``--max-no-progress-restarts`` counts, carried from attempt to attempt.

    Attributes:
        streak: failed attempts in a row, each after a restart, that made no progress.
        best_step: the furthest step any attempt reached so far (-1: no attempt beat).
    """

    streak: int = 0
    best_step: int = -1


def count_attempt(
    count: NoProgressCount, *, attempt: int, failed: bool, reached: int
) -> NoProgressCount:
    """Count one ended attempt: did it make progress?

    An attempt made progress when it reached a step beyond the furthest step of every attempt
    before it. A worker's step is the one it named (``progress(step)``), else the count of its
    beats since the attempt started (each optimizer step, each ``progress()`` call, each timer
    request); the attempt reached the furthest step of any of its local workers. So a job that
    hangs or crashes at the same step every time makes no progress, however many steps it
    beats before that point, and one that gets further each time does.

    Args:
        count: the count before this attempt ended.
        attempt: this attempt's number (0: the first, which follows no restart).
        failed: this attempt ended with a worker failure (a hang is one).
        reached: the furthest step a local worker reached in it (-1: none beat).

    Returns:
        The count once this attempt is counted: after progress, a streak of 0 and the new best
        step; after a failed attempt without progress that followed a restart, one more in the
        streak; otherwise unchanged (a rejoin, or the first attempt).
    """
    if reached > count.best_step:
        return NoProgressCount(streak=0, best_step=reached)
    if failed and attempt > 0:
        return replace(count, streak=count.streak + 1)
    return count


def hung_now(
    suspects: dict[int, bool | None], since_ns: int, now_ns: int, grace_s: float
) -> tuple[int, ...]:
    """Which silent workers to stop now.

    Args:
        suspects: each worker silent past its timeout -> whether its main thread waits in a
            collective (None: its stacks could not be read).
        since_ns: when the first of them was found silent.
        now_ns: now.
        grace_s: how long workers that all wait in a collective are left to the other nodes.

    Returns:
        The workers to stop, in order: at once every one seen outside a collective; the others
        (waiting in one, or whose stacks could not be read: no evidence either way, and on a
        loaded host py-spy can fail on a worker that only waits) once ``grace_s`` has passed.
    """
    culprits = tuple(sorted(k for k, waiting in suspects.items() if waiting is False))
    if culprits:
        return culprits
    if suspects and now_ns - since_ns >= grace_s * _NS:
        return tuple(sorted(suspects))
    return ()


@dataclass(frozen=True)
class HungWorker:
    """A worker the agent must stop: silent past its timeout.

    Attributes:
        local_rank: its local rank.
        rank: its global rank.
        pid: its process.
        silence: how long it was silent, against which timeout.
        where: where its main thread was (None: stacks not taken).
        stacks_file: its ``stacks.txt`` (None: not written).
        stacks_error: why its stacks could not be taken, or None.
    """

    local_rank: int
    rank: int
    pid: int
    silence: Silence
    where: Where | None
    stacks_file: Path | None
    stacks_error: str | None = None

    def sentence(self) -> str:
        """``rank 3 stuck 42 s in all_reduce at train.py:88 (no progress beat; timeout 30 s)``."""
        place = f" in {self.where.text()}" if self.where is not None else ""
        kind = "learned" if self.silence.learned else "given"
        text = (
            f"rank {self.rank} stuck {self.silence.silent_s:.0f} s{place} (no progress beat; "
            f"hang timeout {self.silence.timeout_s:.3g} s, {kind})"
        )
        if self.where is not None and self.where.in_collective:
            text += ": it waits in a collective for a peer that did not arrive"
        if self.stacks_error:
            text += f"; no stacks: {self.stacks_error}"
        return text
