"""The rows the timeline draws: one per lane, or, at scale, groups of lanes alike with the
outliers kept apart; and every row's segments and markers thinned to what can be seen. Pure.

Up to ``FLAT_LANES`` lanes, each is a row. Beyond, a lane is an *outlier*, drawn on its own,
when it has a verdict (failure, hang, straggler, lost, excluded...), its clock could not be
aligned, or its phases' bounds lie far from those of the lanes of its shape (the same causes
in the same order): more than ``max(OUTLIER_FLOOR_S, OUTLIER_SHARE x span)`` from the median.
The others are grouped by shape, each shape cut into runs of consecutive lanes; a group draws
the median bounds of its lanes and carries their markers, clustered. At most ``MAX_OUTLIERS``
outliers get a row each, those with the gravest verdicts first; the rest are grouped as well.

Thinning: segments shorter than ``span / RESOLUTION`` merge into the cause that fills most of
their stretch; markers of one style on one row within that stretch become one, with a count.
Markers that are no verdict (changes of membership, restarts, the ends) are thinned further, on
a coarser stretch, until the page holds at most ``MAX_NOTICES`` of them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import replace

from elastic_run.cli.report.markers import VERDICT_STYLES
from elastic_run.cli.report.model import Lane, Marker, Row, Segment

__all__ = [
    "FLAT_LANES",
    "MAX_GROUP_ROWS",
    "MAX_NOTICES",
    "MAX_OUTLIERS",
    "OUTLIER_FLOOR_S",
    "OUTLIER_SHARE",
    "RESOLUTION",
    "build_rows",
    "thin_markers",
    "thin_segments",
]

FLAT_LANES = 64
MAX_OUTLIERS = 200
MAX_GROUP_ROWS = 48
OUTLIER_FLOOR_S = 5.0
OUTLIER_SHARE = 0.02
RESOLUTION = 4000
MAX_NOTICES = 4000
_GRAVITY = (
    "lost",
    "excluded",
    "failure",
    "hang",
    "check_failed",
    "suspect",
    "link_slow",
    "straggler",
)


def thin_segments(segments: Sequence[Segment], quantum_s: float) -> tuple[Segment, ...]:
    """``segments`` with runs of ones shorter than ``quantum_s`` merged, each run into the
    cause that fills most of it."""
    out: list[Segment] = []
    bucket: list[Segment] = []

    def flush() -> None:
        if not bucket:
            return
        share: dict[str, float] = {}
        for s in bucket:
            share[s.cause] = share.get(s.cause, 0.0) + (s.end_s - s.start_s)
        cause = max(share, key=lambda c: share[c])
        out.append(Segment(cause, bucket[0].start_s, bucket[-1].end_s, bucket[-1].inferred))
        bucket.clear()

    for seg in segments:
        if seg.end_s - seg.start_s >= quantum_s:
            flush()
            out.append(seg)
            continue
        bucket.append(seg)
        if bucket[-1].end_s - bucket[0].start_s >= quantum_s:
            flush()
    flush()
    merged: list[Segment] = []
    for seg in out:
        if merged and merged[-1].cause == seg.cause and merged[-1].inferred == seg.inferred:
            merged[-1] = Segment(seg.cause, merged[-1].start_s, seg.end_s, seg.inferred)
        else:
            merged.append(seg)
    return tuple(merged)


def thin_markers(
    markers: Sequence[Marker], quantum_s: float, notice_quantum_s: float | None = None
) -> tuple[Marker, ...]:
    """``markers`` (of one row) with those of one style closer than ``quantum_s`` to the
    first of their cluster made one, its count the cluster's; markers that are no verdict
    are clustered over ``notice_quantum_s`` (default ``quantum_s``)."""
    out: list[Marker] = []
    open_: dict[str, int] = {}  # style -> index in out of its open cluster
    coarse = quantum_s if notice_quantum_s is None else max(quantum_s, notice_quantum_s)
    for m in sorted(markers, key=lambda m: m.at_s):
        at = open_.get(m.style)
        q = quantum_s if m.verdict else coarse
        if at is not None and m.at_s - out[at].at_s < q:
            out[at] = replace(out[at], count=out[at].count + m.count)
            continue
        open_[m.style] = len(out)
        out.append(m)
    return tuple(out)


def _shape(lane: Lane) -> tuple[str, ...]:
    return tuple(s.cause for s in lane.segments)


def _bounds(lane: Lane) -> list[float]:
    return [s.start_s for s in lane.segments] + ([lane.segments[-1].end_s] if lane.segments else [])


def _median_segments(lanes: Sequence[Lane]) -> tuple[Segment, ...]:
    first = lanes[0]
    bounds = [_bounds(lane) for lane in lanes]
    med = [statistics.median(b[i] for b in bounds) for i in range(len(bounds[0]))]
    return tuple(
        Segment(s.cause, med[i], max(med[i], med[i + 1]), s.inferred)
        for i, s in enumerate(first.segments)
    )


def _far_lanes(lanes: Sequence[Lane], limit_s: float) -> set[int]:
    """The lanes of one shape whose bounds lie more than ``limit_s`` from the shape's median."""
    if len(lanes) < 3:
        return set()
    bounds = [_bounds(lane) for lane in lanes]
    med = [statistics.median(b[i] for b in bounds) for i in range(len(bounds[0]))]
    return {
        lane.index
        for lane, b in zip(lanes, bounds, strict=True)
        if any(abs(x - m) > limit_s for x, m in zip(b, med, strict=True))
    }


def _gravity(styles: set[str]) -> int:
    for rank, style in enumerate(_GRAVITY):
        if style in styles:
            return rank
    return len(_GRAVITY)


def _span_text(labels: Sequence[str]) -> str:
    return labels[0] if len(labels) == 1 else f"{labels[0]} .. {labels[-1]}"


def build_rows(lanes: Sequence[Lane], markers: Sequence[Marker], span_s: float) -> tuple[Row, ...]:
    """The timeline's rows.

    Args:
        lanes: every lane, in the report's order.
        markers: every marker (each names its lane).
        span_s: the drawn span (sets the thinning's resolution and the outliers' limit).

    Returns:
        The rows, in the lanes' order (a group where its first lane is).
    """
    quantum = max(span_s, 1e-3) / RESOLUTION
    by_lane: dict[int, list[Marker]] = {}
    for m in markers:
        by_lane.setdefault(m.lane, []).append(m)

    def lane_row(lane: Lane) -> Row:
        return Row(
            lane.label,
            (lane.index,),
            thin_segments(lane.segments, quantum),
            thin_markers(by_lane.get(lane.index, ()), quantum),
        )

    if len(lanes) <= FLAT_LANES:
        return _within_budget(tuple(lane_row(lane) for lane in lanes), quantum)
    styles = {i: {m.style for m in ms} for i, ms in by_lane.items()}
    shapes: dict[tuple[str, ...], list[Lane]] = {}
    for lane in lanes:
        shapes.setdefault(_shape(lane), []).append(lane)
    limit = max(OUTLIER_FLOOR_S, OUTLIER_SHARE * span_s)
    far: set[int] = set()
    for members in shapes.values():
        if members[0].segments:
            far |= _far_lanes(members, limit)
    outliers = [
        lane
        for lane in lanes
        if styles.get(lane.index, set()) & VERDICT_STYLES
        or not lane.clock.aligned
        or lane.index in far
    ]
    outliers.sort(key=lambda lane: (_gravity(styles.get(lane.index, set())), lane.index))
    apart = {lane.index for lane in outliers[:MAX_OUTLIERS]}
    rows: list[tuple[int, Row]] = [(lane.index, lane_row(lane)) for lane in outliers[:MAX_OUTLIERS]]
    rest = [lane for lane in lanes if lane.index not in apart]
    groups: dict[tuple[tuple[str, ...], bool], list[Lane]] = {}
    for lane in rest:
        groups.setdefault((_shape(lane), lane.index in far), []).append(lane)
    per_group = max(1, math.ceil(len(rest) / MAX_GROUP_ROWS))
    for members in groups.values():
        for start in range(0, len(members), per_group):
            chunk = members[start : start + per_group]
            rows.append((chunk[0].index, _group_row(chunk, by_lane, quantum)))
    rows.sort(key=lambda item: item[0])
    return _within_budget(tuple(row for _, row in rows), quantum)


def _within_budget(rows: tuple[Row, ...], quantum_s: float) -> tuple[Row, ...]:
    """The rows with their notices (markers that are no verdict) clustered on a coarser
    stretch, four times coarser each time, until at most ``MAX_NOTICES`` are drawn."""
    coarse = quantum_s
    while sum(1 for r in rows for m in r.markers if not m.verdict) > MAX_NOTICES:
        coarse *= 4
        rows = tuple(replace(r, markers=thin_markers(r.markers, quantum_s, coarse)) for r in rows)
        if coarse > quantum_s * RESOLUTION:
            break
    return rows


def _group_row(lanes: Sequence[Lane], by_lane: dict[int, list[Marker]], quantum: float) -> Row:
    if len(lanes) == 1:
        lane = lanes[0]
        return Row(
            lane.label,
            (lane.index,),
            thin_segments(lane.segments, quantum),
            thin_markers(by_lane.get(lane.index, ()), quantum),
        )
    segments = _median_segments(lanes) if lanes[0].segments else ()
    markers = [m for lane in lanes for m in by_lane.get(lane.index, ())]
    labels = [lane.label for lane in lanes]
    bounds = [_bounds(lane) for lane in lanes]
    spread = (
        max(max(b[i] for b in bounds) - min(b[i] for b in bounds) for i in range(len(bounds[0])))
        if bounds and bounds[0]
        else 0.0
    )
    note = (
        f"{len(lanes)} nodes alike ({_span_text(labels)}): their phases' median bounds; "
        f"the bounds spread over {spread:.2f} s at most"
    )
    return Row(
        f"{len(lanes)} nodes: {_span_text(labels)}",
        tuple(lane.index for lane in lanes),
        thin_segments(segments, quantum),
        thin_markers(markers, quantum),
        note,
    )
