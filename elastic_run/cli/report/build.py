"""The report of one job from its nodes' logs: lanes booked and aligned, markers, rounds, the
job's goodput, its outcome and root cause; and the report as JSON (``--json``). Pure.

Several runs in the logs given (run ids, from ``agent.started`` or the folder's name): the one
asked for, else the one whose events end last; the others are named in the report.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from elastic_run.agent.loop import goodput as gp
from elastic_run.cli.report.clocks import align_clocks
from elastic_run.cli.report.markers import LaneFacts, lost_lanes_seen, markers_of, round_map
from elastic_run.cli.report.model import (
    ClockFit,
    Lane,
    Marker,
    NodeLog,
    Problem,
    Report,
    Round,
    Segment,
)
from elastic_run.cli.report.phases import book
from elastic_run.cli.report.rows import build_rows

__all__ = ["build_report", "report_json", "run_id_of"]

_ENDINGS = ("succeeded", "failed", "closed")


def run_id_of(node: NodeLog) -> str:
    """A node's run id: its ``agent.started`` event's, else its folder's (``<run id>_<random>``)."""
    for event in node.events:
        if event.kind == "agent.started":
            run_id = event.fields.get("run_id")
            if isinstance(run_id, str) and run_id:
                return run_id
            break
    folder = node.name.rstrip("/").rsplit("/", 1)[-1]
    return folder.rsplit("_", 1)[0] if "_" in folder else folder


def _first_group_rank(node: NodeLog) -> int:
    for event in node.events:
        if event.kind == "rendezvous.complete":
            g = event.fields.get("group_rank")
            if isinstance(g, int) and not isinstance(g, bool):
                return g
    return -1


def _completions(node: NodeLog) -> dict[int, float]:
    out: dict[int, float] = {}
    for event in node.events:
        if event.kind == "rendezvous.complete":
            number = event.fields.get("round")
            if isinstance(number, int) and not isinstance(number, bool):
                out.setdefault(number, event.ts)
    return out


def _ended(node: NodeLog, lost: bool) -> str:
    accounted = False
    for event in reversed(node.events):
        if event.kind in _ENDINGS:
            return event.kind
        if event.kind == "signal" and not event.fields.get("forwarded"):
            return "signal"
        accounted = accounted or event.kind == "goodput"
    if accounted:
        return "ended"  # its agent closed its account, after no ending this report knows
    return "lost" if lost else "log ends"


def _labels(ranks: Sequence[int]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for g in ranks:
        base = f"node {g}" if g >= 0 else "node ?"
        seen[base] = seen.get(base, 0) + 1
        out.append(base if seen[base] == 1 else f"{base} ({seen[base]})")
    return out


def build_report(nodes: Sequence[NodeLog], run_id: str | None = None) -> Report | None:
    """The report of one job.

    Args:
        nodes: every node's log that was read (nodes without a good event are skipped).
        run_id: the run to report (default: the one whose events end last).

    Returns:
        The report, or None when no node of that run has a usable event.
    """
    problems: list[Problem] = [p for n in nodes for p in n.problems]
    usable = [n for n in nodes if n.events]
    runs: dict[str, list[NodeLog]] = {}
    for node in usable:
        runs.setdefault(run_id_of(node), []).append(node)
    if not runs or (run_id is not None and run_id not in runs):
        return None
    chosen = run_id or max(runs, key=lambda r: max(e.ts for n in runs[r] for e in n.events))
    others = tuple(sorted((r, len(ns)) for r, ns in runs.items() if r != chosen))
    picked = sorted(
        runs[chosen], key=lambda n: (_first_group_rank(n) < 0, _first_group_rank(n), n.name)
    )
    fits, reference = align_clocks([_completions(n) for n in picked])
    facts = [
        LaneFacts(
            n.events, fits[i].offset_s, n.path, {(w.attempt, w.local_rank): w for w in n.workers}
        )
        for i, n in enumerate(picked)
    ]
    rounds = round_map(facts)
    markers = list(markers_of(facts, rounds))
    lost_at = lost_lanes_seen(markers)
    labels = _labels([_first_group_rank(n) for n in picked])
    lanes: list[Lane] = []
    for i, node in enumerate(picked):
        fit = fits[i]
        seen = lost_at.get(i)
        booking = book(node.events, extend_to_s=None if seen is None else seen - fit.offset_s)
        if booking.problem:
            problems.append(Problem(node.name, booking.problem))
        if not fit.aligned:
            problems.append(
                Problem(
                    node.name,
                    "shares no round with the other nodes: drawn on its own clock (not aligned)",
                )
            )
        segments = tuple(
            Segment(s.cause, s.start_s + fit.offset_s, s.end_s + fit.offset_s, s.inferred)
            for s in booking.segments
        )
        lanes.append(
            Lane(
                index=i,
                label=labels[i],
                name=node.name,
                path=node.path,
                segments=segments,
                clock=fit,
                account=booking.recorded,
                ended=_ended(node, seen is not None),
                rounds=tuple(sorted(_completions(node))),
                first_group_rank=_first_group_rank(node),
                events=len(node.events),
            )
        )
    times = [s.start_s for lane in lanes for s in lane.segments]
    times += [s.end_s for lane in lanes for s in lane.segments]
    times += [m.at_s for m in markers]
    start_s, end_s = (min(times), max(times)) if times else (0.0, 1.0)
    accounts = {lane.name: lane.account for lane in lanes if lane.account is not None}
    merged = gp.merge(accounts)
    round_list = _rounds(picked, fits, rounds.members, markers)
    restart_count = _restart_count(picked)
    outcome, root = _outcome(lanes, markers)
    report = Report(
        run_id=chosen,
        lanes=tuple(lanes),
        rows=(),
        markers=tuple(sorted(markers, key=lambda m: m.at_s)),
        rounds=round_list,
        goodput=merged,
        restart_count=restart_count,
        start_s=start_s,
        end_s=end_s,
        reference=reference,
        outcome=outcome,
        root_cause=root,
        problems=tuple(problems),
        other_runs=others,
    )
    return replace(report, rows=build_rows(report.lanes, report.markers, report.span_s))


def _restart_count(nodes: Sequence[NodeLog]) -> int:
    count = 0
    for node in nodes:
        for event in node.events:
            value = None
            if event.kind == "rendezvous.complete":
                value = event.fields.get("restart_count")
            elif event.kind == "restart" and event.fields.get("counted"):
                value = event.fields.get("restarts")
            if isinstance(value, int) and not isinstance(value, bool):
                count = max(count, value)
    return count


def _rounds(
    nodes: Sequence[NodeLog],
    fits: Sequence[ClockFit],
    members: Mapping[int, frozenset[int]],
    markers: Sequence[Marker],
) -> tuple[Round, ...]:
    seen: dict[int, tuple[list[float], list[int], list[int]]] = {}
    for i, node in enumerate(nodes):
        done: set[int] = set()
        for event in node.events:
            if event.kind != "rendezvous.complete":
                continue
            number = event.fields.get("round")
            if not isinstance(number, int) or number in done:
                continue
            done.add(number)
            times, worlds, counts = seen.setdefault(number, ([], [], []))
            times.append(event.ts + fits[i].offset_s)
            world, count = event.fields.get("world_size"), event.fields.get("restart_count")
            worlds.append(world if isinstance(world, int) else -1)
            counts.append(count if isinstance(count, int) else 0)
    by_round: dict[int, list[Marker]] = {}
    for m in markers:
        if m.source in members.get(m.round, ()):
            by_round.setdefault(m.round, []).append(m)
    out = []
    for number in sorted(members):
        times, worlds, counts = seen.get(number, ([0.0], [-1], [0]))
        out.append(
            Round(
                number,
                statistics.median(times),
                tuple(sorted(members[number])),
                max(worlds),
                max(counts),
                _round_end(by_round.get(number, [])),
            )
        )
    return tuple(out)


def _round_end(markers: Sequence[Marker]) -> str:
    """How a round ended, from the markers logged in it: a counted failure first, then a lost
    member, a change of membership, the job's end."""
    ordered = sorted(markers, key=lambda m: m.at_s)
    failures = [m for m in ordered if m.style == "failure" and "not counted" not in m.text]
    if failures:
        m = failures[0]
        cause = f": {m.cause}" if m.cause else ""
        rank = f", rank {m.rank}" if m.rank is not None and m.rank >= 0 else ""
        return f"worker failure{rank}{cause}"
    for style, text in (("lost", "member lost"), ("membership", "")):
        found = [m for m in ordered if m.style == style]
        if found:
            return text or found[0].text
    ends = [m for m in ordered if m.style == "close"]
    if ends:
        failed = [m for m in ends if m.kind in ("failed", "closed")]
        return (failed or ends)[0].text
    return "(running when the logs end)"


def _outcome(lanes: Sequence[Lane], markers: Sequence[Marker]) -> tuple[str, Marker | None]:
    ended = {lane.ended for lane in lanes}
    failures = sorted((m for m in markers if m.style == "failure"), key=lambda m: m.at_s)
    counted = [m for m in failures if "not counted" not in m.text] or failures
    root = counted[0] if counted else None
    closes = [m for m in markers if m.style == "close" and m.kind in ("failed", "closed")]
    lost = sum(1 for lane in lanes if lane.ended == "lost")
    tail = f"; {lost} node{'s' if lost != 1 else ''} lost" if lost else ""
    if "failed" in ended:
        first = min((m for m in closes if m.kind == "failed"), key=lambda m: m.at_s)
        last_failures = [m for m in counted if m.round == first.round] or counted
        root = last_failures[0] if last_failures else root
        return f"failed: {first.cause or first.text}{tail}", root
    if "closed" in ended:
        first = min((m for m in closes if m.kind == "closed"), key=lambda m: m.at_s)
        return f"closed ({first.cause or first.text}){tail}", root
    if "succeeded" in ended:
        n = sum(1 for lane in lanes if lane.ended == "succeeded")
        return f"succeeded on {n} node{'s' if n != 1 else ''}{tail}", root
    return f"no node ended in its log (still running, or killed){tail}", root


def report_json(report: Report) -> dict[str, Any]:
    """The report as JSON (what ``--json`` prints; times as the reference clock's epoch s)."""

    def marker(m: Marker) -> dict[str, Any]:
        return {
            "at_s": round(m.at_s, 3),
            "style": m.style,
            "kind": m.kind,
            "node": report.lanes[m.lane].label,
            "by": report.lanes[m.source].label if m.source >= 0 else None,
            "round": m.round,
            "rank": m.rank,
            "text": m.text,
            "cause": m.cause,
            "links": {link.label: link.path for link in m.links},
        }

    return {
        "run_id": report.run_id,
        "outcome": report.outcome,
        "root_cause": marker(report.root_cause) if report.root_cause else None,
        "start_s": round(report.start_s, 3),
        "end_s": round(report.end_s, 3),
        "restart_count": report.restart_count,
        "goodput": report.goodput.to_json(with_restarts=False) if report.goodput else None,
        "nodes": [
            {
                "node": lane.label,
                "folder": lane.name,
                "path": lane.path,
                "ended": lane.ended,
                "events": lane.events,
                "rounds": list(lane.rounds),
                "clock": {
                    "offset_s": round(lane.clock.offset_s, 6),
                    "residual_s": round(lane.clock.residual_s, 6),
                    "rounds_shared": lane.clock.shared,
                    "aligned": lane.clock.aligned,
                    "reference": lane.clock.reference,
                },
                "goodput": lane.account.to_json(with_restarts=False) if lane.account else None,
                "phases": [
                    [s.cause, round(s.start_s, 3), round(s.end_s, 3)] for s in lane.segments
                ],
            }
            for lane in report.lanes
        ],
        "rounds": [
            {
                "round": r.number,
                "at_s": round(r.at_s, 3),
                "nodes": [report.lanes[i].label for i in r.lanes],
                "world_size": r.world_size,
                "restart_count": r.restart_count,
                "ended": r.ended,
            }
            for r in report.rounds
        ],
        "verdicts": [marker(m) for m in report.verdicts()],
        "problems": [p.line() for p in report.problems],
        "other_runs": [{"run_id": r, "nodes": n} for r, n in report.other_runs],
    }
