"""One node's phases over time, booked as its goodput account books them. Pure.

The account (``agent/loop/goodput.py``) is a fold over the agent's events and its workers'
progress beats; ``events.jsonl`` holds the events, not the beats. So the fold is replayed here
over the events, with the beats that matter put back from the node's final ``goodput`` event:
the first beat of each attempt (the start-up's end, each restart's ``first_beat_s``) and the
last beat before the job's end (``end_s`` before the account closed). Every step of the fold
adds seconds to its causes; each step's seconds are laid out from the instant the fold had
reached, the phase it was in first: the segments of a lane are the account's causes in order.

The account keeps the last 64 restarts: an earlier restart's first beat is taken as the median
of theirs. A node that left no account (killed, its log cut) is replayed from its events alone: its
workers' time cannot be told into first beat and training, and is booked as ``running``. Its
open phase may be carried past its last event to when its peers saw it lost (``inferred``).

Stalls inside training (a beat late) are in the account's totals, not in the lanes: the beats
that date them are not in the log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastic_run.agent.loop import goodput as gp
from elastic_run.cli.report.model import Event, Segment

__all__ = ["CAUSES", "Booking", "book"]

# Every cause a segment may have, in the order a legend lists them.
CAUSES = (
    "training",
    "running",
    "stall",
    "startup",
    *(f"restart.{p}" for p in gp.RESTART_PHASES),
    "end",
)
_ENDS = frozenset({"succeeded", "failed", "closed"})
_TOTAL_KEYS = ("training", "stall", "startup", *(f"restart.{p}" for p in gp.RESTART_PHASES), "end")
_EPS_S = 1e-6


@dataclass(frozen=True)
class Booking:
    """A node's phases on its own clock, and its accounts.

    Attributes:
        segments: the phases, in time order (node clock).
        recorded: the account the node recorded last (its ``goodput`` event), or None.
        replayed: the account of the replay (what the segments add up to).
        begin_s: when its account begins (the launcher's start when recorded).
        last_s: its last event.
        problem: why its ``goodput`` event could not be read, or "".
    """

    segments: tuple[Segment, ...]
    recorded: gp.GoodputAccount | None
    replayed: gp.GoodputAccount
    begin_s: float
    last_s: float
    problem: str = ""


def _totals(fold: gp.GoodputFold) -> dict[str, float]:
    """Seconds per cause so far: what ``gp.account`` at ``fold.since_s`` says, read directly."""
    out = dict.fromkeys(_TOTAL_KEYS, 0.0)
    out.update(fold.closed)
    current = fold.current
    if current is not None:
        out["restart.detection"] += current.detection_s
        out["restart.stop"] += current.stop_s
        out["restart.rendezvous"] += current.rendezvous_s
        out["restart.worker_start"] += current.worker_start_s
        out["restart.first_beat"] += current.first_beat_s
    out["restart.detection"] += fold.pending_detection_s
    return out


def _cause(fold: gp.GoodputFold) -> str:
    phase = fold.phase
    if phase in ("training", "startup", "end"):
        return phase
    if phase == "detection" and fold.current is None:
        return "restart.detection"
    return f"restart.{phase}" if fold.current is not None else "startup"


class _Booker:
    """Folds and lays out what each step of the fold added."""

    def __init__(self, begin_s: float, running: bool) -> None:
        self.fold = gp.begin(begin_s)
        self.segments: list[Segment] = []
        self._running = running
        self._beats = 0
        self._totals = _totals(self.fold)

    def step(self, after: gp.GoodputFold) -> None:
        before = self.fold
        if after is before:
            return
        old, new = self._totals, _totals(after)
        first = _cause(before)
        at = before.since_s
        added = new[first] - old.get(first, 0.0)
        if added > _EPS_S:
            self._lay(first, at, at + added)
            at += added
        for cause, total in new.items():
            added = total - old.get(cause, 0.0)
            if cause != first and added > _EPS_S:
                self._lay(cause, at, at + added)
                at += added
        self.fold, self._totals = after, new

    def _lay(self, cause: str, start_s: float, end_s: float, inferred: bool = False) -> None:
        if cause == "training" and self._running:
            cause = "running"
        last = self.segments[-1] if self.segments else None
        if last is not None and last.cause == cause and abs(last.end_s - start_s) < 1e-3:
            if last.inferred == inferred:
                self.segments[-1] = Segment(cause, last.start_s, end_s, inferred)
                return
        self.segments.append(Segment(cause, start_s, end_s, inferred))

    def beat(self, at_s: float) -> None:
        self._beats += 1
        self.step(gp.beat(self.fold, self._beats, at_s))

    def new_attempt(self) -> None:
        self._beats = 0

    def open_tail(self, until_s: float, inferred: bool) -> None:
        """Lay the open phase up to ``until_s`` without ending it."""
        if self.fold.ended or until_s <= self.fold.since_s:
            return
        cause = _cause(self.fold)
        self._lay(cause, self.fold.since_s, until_s, inferred)


def _recorded(events: Sequence[Event]) -> tuple[Event | None, gp.GoodputAccount | None, str]:
    for event in reversed(events):
        if event.kind == "goodput":
            try:
                return event, gp.from_json(event.fields), ""
            except (ValueError, TypeError) as exc:
                return None, None, f"line {event.line}: goodput account unreadable ({exc})"
    return None, None, ""


def _first_beats(fields: Mapping[str, Any]) -> list[float]:
    out: list[float] = []
    for item in fields.get("restarts") or ():
        value = item.get("first_beat_s") if isinstance(item, Mapping) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            out.append(float(value))
        else:
            out.append(-1.0)
    return out


def book(events: Sequence[Event], extend_to_s: float | None = None) -> Booking:
    """Book one node's phases from its events.

    Args:
        events: its events, in file order (at least one).
        extend_to_s: for a node that left no account, carry its open phase to this instant
            (node clock), when later than its last event (its peers saw it lost then).

    Returns:
        The booking.
    """
    gp_event, recorded, problem = _recorded(events)
    timeline = [e for e in events if e.kind != "goodput"]
    first_s = timeline[0].ts if timeline else events[0].ts
    last_s = max(e.ts for e in events)
    begin_s = first_s
    if gp_event is not None and recorded is not None and 0 <= recorded.wall_s:
        begin_s = min(first_s, gp_event.ts - recorded.wall_s)
    first_beats = _first_beats(gp_event.fields) if gp_event is not None else []
    kept = len(first_beats)
    booker = _Booker(begin_s, running=recorded is None)
    pending: float | None = None  # the first beat of the attempt running now
    for event in timeline:
        if pending is not None and pending <= event.ts - 1e-3:
            if booker.fold.phase in ("startup", "first_beat"):
                booker.beat(pending)
            pending = None
        fold = booker.fold
        is_end = event.kind in _ENDS or (
            event.kind == "signal" and not event.fields.get("forwarded")
        )
        if is_end and recorded is not None and gp_event is not None and fold.phase == "training":
            last_beat = gp_event.ts - recorded.end_s
            if fold.since_s < last_beat <= event.ts:
                booker.beat(last_beat)
        failed_at = event.fields.get("failed_at") if event.kind == "worker.failed" else None
        if isinstance(failed_at, bool) or not isinstance(failed_at, (int, float)):
            failed_at = None
        booker.step(
            gp.on_event(
                booker.fold,
                event.kind,
                event.ts,
                event.fields,
                failed_at_s=float(failed_at) if failed_at is not None else None,
            )
        )
        if event.kind == "workers.started" and not booker.fold.ended:
            booker.new_attempt()
            pending = _beat_after(booker.fold, event.ts, begin_s, recorded, first_beats, kept)
    if pending is not None and booker.fold.phase in ("startup", "first_beat"):
        until = gp_event.ts if gp_event is not None else last_s
        if pending < until or (gp_event is None and pending <= until):
            booker.beat(pending)
    if gp_event is not None and recorded is not None:
        booker.step(gp.close(booker.fold, gp_event.ts))
    else:
        booker.open_tail(last_s, inferred=False)
        if extend_to_s is not None and extend_to_s > last_s:
            booker.open_tail(extend_to_s, inferred=True)
    replayed = gp.account(booker.fold, max(last_s, booker.fold.since_s))
    segments = _carve_stalls(booker.segments, _hang_silences(timeline))
    return Booking(segments, recorded, replayed, begin_s, last_s, problem)


def _hang_silences(events: Sequence[Event]) -> list[tuple[float, float]]:
    """The silences a hang verdict dates: ``silent_s`` before each ``worker.hung``."""
    out = []
    for event in events:
        silent = event.fields.get("silent_s") if event.kind == "worker.hung" else None
        if isinstance(silent, (int, float)) and not isinstance(silent, bool) and silent > 0:
            out.append((event.ts - float(silent), event.ts))
    return out


def _carve_stalls(
    segments: Sequence[Segment], silences: Sequence[tuple[float, float]]
) -> tuple[Segment, ...]:
    """The segments with each hang's silence booked as ``stall`` where it lies in training
    (the account books a silence far past the usual gap as a stall)."""
    if not silences:
        return tuple(segments)
    out: list[Segment] = []
    for seg in segments:
        pieces = [seg]
        if seg.cause in ("training", "running"):
            for start, end in silences:
                cut: list[Segment] = []
                for piece in pieces:
                    lo, hi = max(piece.start_s, start), min(piece.end_s, end)
                    if piece.cause != seg.cause or hi <= lo:
                        cut.append(piece)
                        continue
                    if lo > piece.start_s:
                        cut.append(Segment(piece.cause, piece.start_s, lo, piece.inferred))
                    cut.append(Segment("stall", lo, hi, piece.inferred))
                    if hi < piece.end_s:
                        cut.append(Segment(piece.cause, hi, piece.end_s, piece.inferred))
                pieces = cut
        out.extend(pieces)
    return tuple(out)


def _beat_after(
    fold: gp.GoodputFold,
    started_s: float,
    begin_s: float,
    recorded: gp.GoodputAccount | None,
    first_beats: list[float],
    kept: int,
) -> float | None:
    """When the attempt that started at ``started_s`` beat first, as the account says."""
    if recorded is None:
        return started_s  # no account: the workers' time is all "running"
    if fold.current is None:  # the first attempt: start-up runs from the account's begin
        at = begin_s + recorded.startup_s
        return at if at > started_s else None
    index = fold.restart_count - 1 - (recorded.restart_count - kept)
    if 0 <= index < kept and first_beats[index] >= 0:
        return started_s + first_beats[index]
    known = sorted(b for b in first_beats if b >= 0)
    if not known:
        return None
    return started_s + known[len(known) // 2]  # an early restart the account no longer keeps
