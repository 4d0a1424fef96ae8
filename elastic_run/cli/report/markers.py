"""What happened where: each node's events as markers on the lanes, with their ranks, causes
and the workers' files. Pure.

A marker goes on the lane of the node it is about, which is not always the node that logged it:
a straggler is judged on the round's node 0 and names a rank (the lane that ran that rank in
that round gets it); a member lost is logged by its peers and names node ids the logs do not
carry, so it goes to the lanes of that round that never completed a later one, when they are as
many as the ids and did not end their logs themselves (else it stays on the peer's lane,
naming the ids: a verdict once per round). Kinds this report does not
know are drawn as generic markers (``other``), never dropped; the node-health kinds of a later
version (``node.suspect``, ``node.excluded``, ``node.check_failed``, ``link.slow``) have their
own styles already.

Times: every marker is on the reference clock (the event's node offset added).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from elastic_run.cli.report.model import Event, Link, Marker, WorkerFiles

__all__ = [
    "QUIET_KINDS",
    "STYLES",
    "VERDICT_STYLES",
    "LaneFacts",
    "RoundMap",
    "lost_lanes_seen",
    "markers_of",
    "round_map",
]

# Kinds that are the lanes' phases (drawn as segments), not markers.
QUIET_KINDS = frozenset(
    {
        "agent.started",
        "rendezvous.joining",
        "rendezvous.complete",
        "workers.started",
        "workers.stopped",
        "goodput",
        "agent.exited",
        "health.started",
    }
)
# Notices: drawn, not verdicts.
_NOTICE_KINDS = frozenset({"warm_start.cold", "zygote.lost"})
_STYLE_OF_KIND = {
    "worker.failed": "failure",
    "worker.died_after_script": "failure",
    "watchdog.expired": "failure",
    "worker.hung": "hang",
    "worker.outlived": "hang",
    "straggler": "straggler",
    "node.excluded": "excluded",
    "node.suspect": "suspect",
    "node.check_failed": "check_failed",
    "link.slow": "link_slow",
    "succeeded": "close",
    "failed": "close",
    "closed": "close",
    "signal": "signal",
    "restart": "restart",
}
# Every style a marker may have, in the order a legend lists them.
STYLES = (
    "failure",
    "hang",
    "straggler",
    "lost",
    "excluded",
    "suspect",
    "check_failed",
    "link_slow",
    "close",
    "signal",
    "membership",
    "restart",
    "log_end",
    "other",
)
# Styles that single a node out: its lane is drawn on its own at scale.
VERDICT_STYLES = frozenset(
    {"failure", "hang", "straggler", "lost", "excluded", "suspect", "check_failed", "link_slow"}
)
# Kinds whose ``rank`` field names the rank the marker is about (judged on another node).
_BY_RANK = frozenset(
    {"straggler", "node.excluded", "node.suspect", "node.check_failed", "link.slow"}
)
_ENDINGS = frozenset({"succeeded", "failed", "closed", "goodput"})
_FILES = (
    ("stderr.log", "stderr"),
    ("stdout.log", "stdout"),
    ("error.json", "error.json"),
    ("stacks.txt", "stacks"),
)


@dataclass(frozen=True)
class LaneFacts:
    """What the markers need of one lane.

    Attributes:
        events: its events, in file order (its own clock).
        offset_s: its clock's offset to the reference.
        path: its folder (absolute).
        workers: its workers' files, by (attempt, local rank).
    """

    events: Sequence[Event]
    offset_s: float
    path: str
    workers: Mapping[tuple[int, int], WorkerFiles] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundMap:
    """Who was in which round: the lanes of each round, the lane of each (round, rank), each
    lane's last round, and the lanes whose log has an ending (succeeded, failed, closed, or
    the final account)."""

    members: Mapping[int, frozenset[int]]
    rank_lane: Mapping[tuple[int, int], int]
    last_round: Mapping[int, int]
    ended: frozenset[int] = frozenset()


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def round_map(lanes: Sequence[LaneFacts]) -> RoundMap:
    """The rounds' members and ranks, from every lane's events."""
    members: dict[int, set[int]] = {}
    rank_lane: dict[tuple[int, int], int] = {}
    last_round: dict[int, int] = {}
    ended: set[int] = set()
    for index, lane in enumerate(lanes):
        current = -1
        for event in lane.events:
            if event.kind in _ENDINGS:
                ended.add(index)
            elif event.kind == "rendezvous.complete":
                number = _int(event.fields.get("round"))
                if number is not None:
                    current = number
                    members.setdefault(number, set()).add(index)
                    last_round[index] = max(last_round.get(index, -1), number)
            elif event.kind == "workers.started" and current >= 0:
                for rank in event.fields.get("ranks") or ():
                    if _int(rank) is not None:
                        rank_lane.setdefault((current, rank), index)
    return RoundMap(
        {r: frozenset(m) for r, m in members.items()}, rank_lane, last_round, frozenset(ended)
    )


def _links(files: WorkerFiles | None, lane_path: str) -> tuple[Link, ...]:
    if files is None:
        return ()
    base = f"{lane_path}/attempt_{files.attempt}/{files.local_rank}"
    return tuple(Link(label, f"{base}/{name}") for name, label in _FILES if name in files.names)


def _how(message: str) -> str:
    return message.split(" failed: ", 1)[1] if " failed: " in message else message


@dataclass
class _Walk:
    """One lane's walk through its events: the round and attempt it is in."""

    index: int
    lane: LaneFacts
    round: int = -1
    attempt: int = 0


def _marker(walk: _Walk, event: Event, style: str, text: str, **more: Any) -> Marker:
    return Marker(
        style=style,
        kind=event.kind,
        at_s=event.ts + walk.lane.offset_s,
        lane=walk.index,
        text=text,
        round=walk.round,
        source=walk.index,
        **more,
    )


def _of_event(walk: _Walk, event: Event) -> Marker | None:
    """The marker of one event on its own lane (before any is moved to another lane)."""
    kind, fields = event.kind, event.fields
    rank, local_rank = _int(fields.get("rank")), _int(fields.get("local_rank"))
    files = walk.lane.workers.get((walk.attempt, local_rank)) if local_rank is not None else None
    links = _links(files, walk.lane.path)
    if kind == "worker.failed":
        cause = files.error if files is not None and files.error else _how(event.message)
        counted = fields.get("counted")
        who = f"rank {rank}" if rank is not None and rank >= 0 else "a worker"
        text = f"{who} failed: {_how(event.message)}"
        if counted is False:
            text += " (not counted: a peer failed first)"
        return _marker(walk, event, "failure", text, rank=rank, cause=cause, links=links)
    if kind == "worker.hung":
        where = fields.get("where") if isinstance(fields.get("where"), str) else None
        text = event.message.split("; stacks in ", 1)[0]
        stacks = fields.get("stacks")
        if isinstance(stacks, str) and stacks and not any(k.label == "stacks" for k in links):
            links = (*links, Link("stacks", stacks))
        return _marker(walk, event, "hang", text, rank=rank, cause=where, links=links)
    if kind == "membership.changed":
        reason = fields.get("reason")
        if reason == "liveness_lost":
            return _marker(walk, event, "lost", event.message.split(": stopping", 1)[0])
        text = event.message.split(": stopping", 1)[0]
        return _marker(walk, event, "membership", text, verdict=False)
    if kind == "signal" and fields.get("forwarded"):
        return None
    if kind in QUIET_KINDS:
        return None
    style = _STYLE_OF_KIND.get(kind, "other")
    text = event.message or kind
    if style == "close":
        reason = fields.get("reason") if isinstance(fields.get("reason"), str) else None
        return _marker(
            walk,
            event,
            "close",
            f"{kind}: {text}" if kind != "succeeded" else text,
            cause=reason,
            verdict=kind != "succeeded",
        )
    if style == "restart":
        return _marker(walk, event, "restart", text, verdict=False)
    return _marker(
        walk,
        event,
        style,
        text if style != "other" else f"{kind}: {text}",
        rank=rank,
        cause=fields.get("where") if isinstance(fields.get("where"), str) else None,
        links=links,
        verdict=kind not in _NOTICE_KINDS,
    )


def markers_of(lanes: Sequence[LaneFacts], rounds: RoundMap) -> tuple[Marker, ...]:
    """Every marker of every lane, each on the lane it is about.

    Args:
        lanes: the lanes' facts, in the report's order.
        rounds: who was in which round (:func:`round_map`).

    Returns:
        The markers, in time order.
    """
    out: list[Marker] = []
    lost_seen: dict[tuple[int, int], Marker] = {}
    for index, lane in enumerate(lanes):
        walk = _Walk(index, lane)
        ended = False
        for event in lane.events:
            if event.kind == "rendezvous.complete":
                number = _int(event.fields.get("round"))
                walk.round = number if number is not None else walk.round
            elif event.kind == "workers.started":
                attempt = _int(event.fields.get("attempt"))
                walk.attempt = attempt if attempt is not None else walk.attempt + 1
            if event.kind in _ENDINGS:
                ended = True
            marker = _of_event(walk, event)
            if marker is None:
                continue
            if event.kind in _BY_RANK and marker.rank is not None:
                target = rounds.rank_lane.get((walk.round, marker.rank))
                if target is not None:
                    marker = replace(marker, lane=target)
            if event.kind == "membership.changed" and event.fields.get("reason") == "member_lost":
                out.extend(_lost(walk, event, rounds, lost_seen))
            out.append(marker)
        if not ended and lane.events:
            last = lane.events[-1]
            out.append(
                _marker(
                    walk,
                    last,
                    "log_end",
                    "its log ends here, with no ending (the agent was killed, or its log cut)",
                    verdict=False,
                )
            )
    return tuple(sorted(out, key=lambda m: m.at_s))


def _lost(
    walk: _Walk, event: Event, rounds: RoundMap, seen: dict[tuple[int, int], Marker]
) -> list[Marker]:
    """The markers of a member lost: on the lost lanes when they can be told, else on the
    peer's lane (naming the node ids)."""
    ids = [i for i in event.fields.get("lost") or () if isinstance(i, str)]
    members = rounds.members.get(walk.round, frozenset())
    candidates = sorted(
        m
        for m in members
        if m != walk.index and rounds.last_round.get(m, -1) == walk.round and m not in rounds.ended
    )
    named = ", ".join(ids) if ids else "a member"
    if candidates and (not ids or len(ids) == len(candidates)):
        out = []
        for k, lane in enumerate(candidates):
            if (walk.round, lane) in seen:
                continue
            who = f" ({ids[k]})" if len(ids) == len(candidates) == 1 else ""
            marker = replace(
                _marker(
                    walk, event, "lost", f"lost{who}: its peers saw it gone in round {walk.round}"
                ),
                lane=lane,
            )
            seen[(walk.round, lane)] = marker
            out.append(marker)
        return out
    marker = _marker(walk, event, "lost", f"member lost: {named} (its lane is not known)")
    if (walk.round, -1) in seen:  # said by another peer already: drawn, not a verdict again
        return [replace(marker, verdict=False)]
    seen[(walk.round, -1)] = marker
    return [marker]


def lost_lanes_seen(markers: Sequence[Marker]) -> dict[int, float]:
    """When each lane was first seen lost by its peers (reference clock), by lane."""
    out: dict[int, float] = {}
    for m in markers:
        if m.style == "lost" and m.lane != m.source:
            out[m.lane] = min(out.get(m.lane, m.at_s), m.at_s)
    return out
