"""``elastic-run report``'s pure core: bad input (garbage, truncated lines, unknown versions,
non-finite numbers, no events), the phases replayed from the goodput fold, clock alignment, the
markers' lanes, the rows at scale and the page's self-containment; and the command's exit codes
on bad input, in this process (no job runs here: tests/e2e/test_report.py runs one)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from elastic_run.agent.loop import goodput as gp
from elastic_run.cli.main import main
from elastic_run.cli.report.build import build_report, report_json
from elastic_run.cli.report.clocks import align_clocks
from elastic_run.cli.report.events_file import parse_events
from elastic_run.cli.report.html_page import render_page
from elastic_run.cli.report.model import Event, NodeLog, WorkerFiles
from elastic_run.cli.report.phases import book
from elastic_run.cli.report.rows import FLAT_LANES, MAX_GROUP_ROWS

T0 = 1_790_000_000.0


def _line(ts: float, kind: str, v: Any = 1, **fields: Any) -> str:
    return json.dumps({"v": v, "ts": ts, "kind": kind, "message": kind, "fields": fields})


def _ev(ts: float, kind: str, line: int = 0, **fields: Any) -> Event:
    return Event(ts, kind, kind, fields, line)


# -- bad input ---------------------------------------------------------------------------------


def test_garbage_truncated_unknown_versions_and_bad_numbers_are_one_line_each() -> None:
    lines = [
        _line(T0, "agent.started", run_id="job"),
        "this is not json",
        _line(T0 + 1, "rendezvous.joining", v=2),
        _line(T0 + 2, "rendezvous.joining", v=2),
        '{"v":1,"ts":NaN,"kind":"x","fields":{}}',
        '{"v":1,"ts":1e400,"kind":"x","fields":{}}',
        '{"v":1,"ts":1790000003,"kind":"x","fields":{"rank":123456789012345678901}}',
        "[1, 2]",
        '{"v":1,"ts":1790000004,"fields":{}}',
        '{"v":1,"ts":1790000005,"kind":"x","fields":[]}',
        '{"v":1,"ts":-5,"kind":"x","fields":{}}',
        "",
        _line(T0 + 6, "rendezvous.complete", round=0, group_rank=0),
        '{"v":1,"ts":17900',  # the agent was killed while writing its last line
    ]
    events, problems = parse_events("\n".join(lines), "n/events.jsonl")
    assert [e.kind for e in events] == ["agent.started", "rendezvous.complete"]
    assert [e.line for e in events] == [1, 13]
    text = [p.line() for p in problems]
    assert "n/events.jsonl: line 2: not JSON: skipped" in text
    assert (
        "n/events.jsonl: lines 3, 4: event version 2 (this report reads version 1): skipped" in text
    )
    assert (
        "n/events.jsonl: lines 5, 6, 7: a number that is not finite or too large: skipped" in text
    )
    assert "n/events.jsonl: line 8: not an event (not a JSON object): skipped" in text
    assert "n/events.jsonl: line 9: not an event (no kind): skipped" in text
    assert "n/events.jsonl: line 10: not an event (fields is not an object): skipped" in text
    assert "n/events.jsonl: line 11: not an event (no plausible ts): skipped" in text
    assert "n/events.jsonl: line 14: truncated (the write was cut): skipped" in text
    assert len(text) == 8 and all("\n" not in t for t in text)


def test_a_file_without_events_says_so_and_many_bad_lines_stay_one_line() -> None:
    assert [p.text for p in parse_events("", "e")[1]] == ["no events"]
    events, problems = parse_events("\n".join(["garbage"] * 500) + "\n", "e")
    assert not events
    assert [p.text for p in problems] == [
        "lines 1, 2, 3, 4, 5 (and 495 more): not JSON: skipped",
        "no events",
    ]


def test_a_report_is_drawn_from_what_is_usable_and_none_when_nothing_is() -> None:
    good = NodeLog("a", "/logs/a", tuple(_job_events(0.0, 0, final=True)))
    empty_events, problems = parse_events("garbage\n", "b/events.jsonl")
    bad = NodeLog("b", "/logs/b", empty_events, problems=problems)
    report = build_report([good, bad])
    assert report is not None and len(report.lanes) == 1
    assert [p.line() for p in report.problems] == [
        "b/events.jsonl: line 1: not JSON: skipped",
        "b/events.jsonl: no events",
    ]
    assert "b/events.jsonl: no events" in render_page(report, "/out")
    assert build_report([bad]) is None
    assert build_report([good], run_id="another") is None


def test_an_unreadable_goodput_account_is_a_problem_and_the_lane_is_still_booked() -> None:
    events = _job_events(0.0, 0, final=False) + [_ev(T0 + 30, "goodput", v=7)]
    report = build_report([NodeLog("a", "/logs/a", tuple(events))])
    assert report is not None
    assert any("goodput account unreadable" in p.text for p in report.problems)
    assert report.lanes[0].segments and report.goodput is None


# -- the phases: the goodput fold replayed ----------------------------------------------------


def _agent_run(t0: float) -> tuple[list[Event], gp.GoodputAccount]:
    """What an agent logs and accounts: a start, a failure and restart, a membership change,
    success; the account folded from the same events plus beats (as the loop folds them)."""
    fold = gp.begin(t0 - 2.0)  # the launcher's start, before agent.started
    events: list[Event] = []

    def emit(at: float, kind: str, **fields: Any) -> None:
        nonlocal fold
        failed_at = fields.get("failed_at")
        fold = gp.on_event(fold, kind, at, fields, failed_at_s=failed_at)
        events.append(_ev(at, kind, len(events) + 1, **fields))

    def beats(first: float, count: int, gap: float) -> None:
        nonlocal fold
        for k in range(count):
            fold = gp.beat(fold, k + 1, first + k * gap)

    emit(t0, "agent.started", run_id="job")
    emit(t0 + 0.1, "rendezvous.joining", attempt=0)
    emit(t0 + 1.0, "rendezvous.complete", round=0, group_rank=0, world_size=2, restart_count=0)
    emit(t0 + 1.5, "workers.started", ranks=[0], attempt=0)
    beats(t0 + 4.0, 11, 1.0)  # training 4..14
    emit(t0 + 15.0, "worker.failed", rank=0, local_rank=0, exitcode=1, failed_at=t0 + 14.5)
    emit(t0 + 15.0, "restart", restarts=1, counted=True)
    emit(t0 + 15.5, "rendezvous.joining", attempt=1)
    emit(t0 + 17.0, "rendezvous.complete", round=1, group_rank=0, world_size=2, restart_count=1)
    emit(t0 + 17.2, "workers.started", ranks=[0], attempt=1)
    beats(t0 + 19.0, 6, 1.0)  # training 19..24
    emit(t0 + 24.5, "membership.changed", reason="member_lost", lost=["h-1-x"])
    emit(t0 + 25.0, "rendezvous.joining", attempt=2)
    emit(t0 + 26.0, "rendezvous.complete", round=2, group_rank=0, world_size=1, restart_count=1)
    emit(t0 + 26.1, "workers.started", ranks=[0], attempt=2)
    beats(t0 + 27.0, 5, 1.0)  # training 27..31
    emit(t0 + 32.0, "succeeded")
    fold = gp.close(fold, t0 + 33.0)
    acc = gp.account(fold, t0 + 33.0)
    events.append(_ev(t0 + 33.0, "goodput", len(events) + 1, **acc.to_json()))
    return events, acc


def _by_cause(segments: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in segments:
        out[s.cause] = out.get(s.cause, 0.0) + s.end_s - s.start_s
    return out


def test_the_replayed_phases_add_up_to_the_recorded_account_cause_by_cause() -> None:
    events, acc = _agent_run(T0)
    booking = book(events)
    assert booking.recorded is not None and booking.recorded.wall_s == pytest.approx(acc.wall_s)
    got = _by_cause(booking.segments)
    want = {"training": acc.training_s, "startup": acc.startup_s, "end": acc.end_s}
    want.update({f"restart.{p}": s for p, s in acc.restart_s.items()})
    for cause, seconds in want.items():
        assert got.get(cause, 0.0) == pytest.approx(seconds, abs=2e-3), (cause, got, want)
    # Every second from the launcher's start to the account's close lies in one segment.
    starts = [s.start_s for s in booking.segments]
    assert starts == sorted(starts) and booking.segments[0].start_s == pytest.approx(T0 - 2.0)
    for a, b in zip(booking.segments, booking.segments[1:], strict=False):
        assert b.start_s == pytest.approx(a.end_s, abs=1e-3)
    assert booking.segments[-1].end_s == pytest.approx(T0 + 33.0)
    order = [s.cause for s in booking.segments]
    assert order[:3] == ["startup", "training", "restart.detection"]
    assert order[-2:] == ["training", "end"]


def test_a_node_without_an_account_is_running_and_carried_to_when_it_was_lost() -> None:
    events, _ = _agent_run(T0)
    cut = [e for e in events if e.ts <= T0 + 20.0]  # killed at 20: no account
    booking = book(cut, extend_to_s=T0 + 24.5)
    causes = [s.cause for s in booking.segments]
    assert "training" not in causes and "running" in causes
    assert booking.recorded is None
    tail = booking.segments[-1]
    assert tail.inferred and tail.cause == "running" and tail.end_s == pytest.approx(T0 + 24.5)


def test_a_hangs_silence_is_booked_as_a_stall() -> None:
    events, _ = _agent_run(T0)
    hung = _ev(T0 + 14.9, "worker.hung", rank=0, local_rank=0, silent_s=3.0)
    booking = book([*events[:5], hung, *events[5:]])
    stalls = [s for s in booking.segments if s.cause == "stall"]
    assert len(stalls) == 1
    assert (stalls[0].start_s, stalls[0].end_s) == pytest.approx((T0 + 11.9, T0 + 14.5))


# -- clocks ---------------------------------------------------------------------------------


def test_clocks_align_by_shared_rounds_with_residuals_and_never_silently_otherwise() -> None:
    ref = {0: 100.0, 1: 200.0, 2: 300.0}
    skewed = {0: 95.01, 1: 194.99, 2: 295.0}  # 5 s behind, within 10 ms
    late = {2: 290.0, 3: 390.0}  # joined in round 2, 10 s behind
    alone = {7: 1000.0}
    fits, reference = align_clocks([skewed, ref, late, alone])
    assert reference == 0  # the most rounds, the first on a tie
    assert fits[0].reference and fits[0].offset_s == 0.0
    assert fits[1].offset_s == pytest.approx(-5.0, abs=0.011)
    assert fits[1].residual_s <= 0.02 and fits[1].shared == 3
    assert fits[2].offset_s == pytest.approx(5.0, abs=0.011) and fits[2].shared == 1
    assert not fits[3].aligned and fits[3].offset_s == 0.0


def test_a_node_that_shares_no_round_is_drawn_on_its_own_clock_and_said_so() -> None:
    a = NodeLog("a", "/l/a", tuple(_job_events(0.0, 0, final=True)))
    b = NodeLog("b", "/l/b", tuple(_job_events(0.0, 0, final=True, first_round=50)))
    report = build_report([a, b])
    assert report is not None
    assert [lane.clock.aligned for lane in report.lanes] == [True, False]
    assert any("not aligned" in p.text for p in report.problems)
    assert "not aligned" in render_page(report, "/out")


# -- markers ----------------------------------------------------------------------------------


def _job_events(
    skew_s: float, group_rank: int, *, final: bool, first_round: int = 0, lost_round: int = -1
) -> list[Event]:
    """A node of a 3-round job (one worker, rank = group rank), its clock ``skew_s`` off."""
    t = T0 + skew_s
    out = [_ev(t, "agent.started", run_id="job"), _ev(t, "rendezvous.joining", attempt=0)]
    for k in range(3):
        r = first_round + k
        out.append(
            _ev(
                t + 1 + 10 * k,
                "rendezvous.complete",
                round=r,
                group_rank=group_rank,
                world_size=3,
                restart_count=0,
            )
        )
        out.append(_ev(t + 2 + 10 * k, "workers.started", ranks=[group_rank], attempt=k))
        if k == lost_round:
            return out
        if k < 2:
            out.append(_ev(t + 9 + 10 * k, "membership.changed", reason="round_ended"))
            out.append(_ev(t + 9.5 + 10 * k, "rendezvous.joining", attempt=k + 1))
    if final:
        out.append(_ev(t + 29, "succeeded"))
    return out


def _three_nodes() -> list[NodeLog]:
    a = _job_events(0.0, 0, final=True)
    b = _job_events(3.0, 1, final=True)
    c = _job_events(-2.0, 2, final=False, lost_round=2)
    a.insert(4, _ev(T0 + 3.5, "straggler", rank=2, node="h-3-x", ratio=2.0))  # judged by node 0
    a.insert(-1, _ev(T0 + 25, "membership.changed", reason="member_lost", lost=["h-3-x"]))
    b.insert(-1, _ev(T0 + 3 + 25.2, "membership.changed", reason="member_lost", lost=["h-3-x"]))
    b.insert(4, _ev(T0 + 3 + 4, "node.excluded", rank=1, reason="gpu check failed"))
    b.insert(5, _ev(T0 + 3 + 5, "some.future.kind", detail="x"))
    b.insert(6, _ev(T0 + 3 + 6, "worker.failed", rank=1, local_rank=0, exitcode=1, counted=True))
    workers = (WorkerFiles(0, 0, ("stderr.log", "error.json", "stacks.txt"), "ValueError: bad lr"),)
    return [
        NodeLog("a/job_1", "/logs/a/job_1", tuple(a)),
        NodeLog("b/job_2", "/logs/b/job_2", tuple(b), workers),
        NodeLog("c/job_3", "/logs/c/job_3", tuple(c)),
    ]


def test_markers_land_on_the_lane_they_are_about_with_cause_and_links() -> None:
    report = build_report(_three_nodes())
    assert report is not None
    labels = [lane.label for lane in report.lanes]
    assert labels == ["node 0", "node 1", "node 2"]
    assert [round(lane.clock.offset_s, 3) for lane in report.lanes] == [0.0, -3.0, 2.0]
    by_style = {m.style: m for m in report.markers if m.verdict}
    straggler = by_style["straggler"]
    assert (straggler.lane, straggler.source, straggler.rank) == (2, 0, 2)  # judged on node 0
    lost = [m for m in report.markers if m.style == "lost"]
    assert len(lost) == 1 and lost[0].lane == 2 and "h-3-x" in lost[0].text  # said once
    assert lost[0].at_s == pytest.approx(T0 + 25)  # the first peer to see it, reference clock
    failure = by_style["failure"]
    assert failure.lane == 1 and failure.cause == "ValueError: bad lr"
    assert failure.at_s == pytest.approx(T0 + 6)  # b's clock, 3 s ahead, put back
    assert [k.label for k in failure.links] == ["stderr", "error.json", "stacks"]
    assert failure.links[0].path == "/logs/b/job_2/attempt_0/0/stderr.log"
    assert by_style["excluded"].lane == 1 and by_style["other"].kind == "some.future.kind"
    assert report.lanes[2].ended == "lost" and report.lanes[2].segments[-1].inferred
    assert report.root_cause is not None and report.root_cause.lane == 1
    assert report.outcome == "succeeded on 2 nodes; 1 node lost"
    body = report_json(report)
    assert [v["style"] for v in body["verdicts"]] == [
        "straggler",
        "excluded",
        "other",
        "failure",
        "lost",
    ]
    assert body["nodes"][1]["clock"]["offset_s"] == pytest.approx(-3.0)
    json.dumps(body)  # it is JSON


def test_the_page_is_self_contained_and_links_are_relative_to_it() -> None:
    report = build_report(_three_nodes())
    assert report is not None
    page = render_page(report, "/logs/out")
    assert "<script" not in page.lower()
    assert not re.search(r"(src|href)=\"(https?:)?//", page), "an asset from elsewhere"
    assert 'href="../b/job_2/attempt_0/0/stderr.log"' in page
    assert page.count('class="row') == 3
    for style in ("straggler", "lost", "failure", "excluded", "other", "close"):
        assert f'class="mk {style}' in page, style
    assert "rank 1 failed" in page and "ValueError: bad lr" in page
    assert 'id="z64"' in page and "#z64:checked~.tl .canvas{width:6400%}" in page


# -- at scale ---------------------------------------------------------------------------------


def test_a_thousand_nodes_draw_as_groups_with_the_outliers_apart() -> None:
    nodes = []
    for i in range(1000):
        events = _job_events(0.001 * (i % 7), i, final=True)
        if i == 500:  # a slow start: its phases' bounds lie far from the others'
            events = [
                e
                if e.kind != "workers.started" or e.fields["attempt"]
                else _ev(e.ts + 6.0, e.kind, **e.fields)
                for e in events
            ]
        if i == 700:
            events.insert(5, _ev(T0 + 5, "worker.failed", rank=700, local_rank=0, counted=True))
        nodes.append(NodeLog(f"n{i}", f"/l/n{i}", tuple(events)))
    report = build_report(nodes)
    assert report is not None and len(report.lanes) == 1000 > FLAT_LANES
    apart = {row.label for row in report.rows if not row.is_group}
    assert {"node 500", "node 700"} <= apart
    groups = [row for row in report.rows if row.is_group]
    assert len(groups) <= MAX_GROUP_ROWS + 2
    assert sum(len(row.lanes) for row in report.rows) == 1000
    page = render_page(report, "/out")
    assert len(page) < 5_000_000 and page.count('class="row') == len(report.rows)


# -- the command, in this process --------------------------------------------------------------


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(argv)
    out, err = capsys.readouterr()
    return int(done.value.code or 0), out, err


def _write_node(root: Path, name: str, lines: list[str]) -> Path:
    run_dir = root / name / "job_abcd1234"
    run_dir.mkdir(parents=True)
    (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir


def test_the_command_fails_in_one_line_only_when_nothing_is_usable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    page = tmp_path / "page.html"
    code, out, err = _run(["report", str(empty), "-o", str(page)], capsys)
    assert code == 2 and out == "" and not page.exists()
    assert err.count("\n") == 1 and err.startswith("Error: nothing to report in ")
    assert "no events.jsonl found" in err
    _write_node(tmp_path / "garbage", "a", ["not json", '{"v": 9}'])
    code, _, err = _run(["report", str(tmp_path / "garbage"), "-o", str(page)], capsys)
    assert code == 2 and err.count("\n") == 1 and "not JSON" in err and not page.exists()
    code, _, err = _run(["report", str(tmp_path / "nowhere")], capsys)
    assert code == 2 and "no such directory" in err
    assert list(tmp_path.glob("*.tmp")) == [] and list(tmp_path.glob(".page*")) == []


def test_the_command_draws_what_is_usable_and_says_each_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = [
        _line(T0, "agent.started", run_id="job"),
        _line(T0 + 1, "rendezvous.complete", round=0, group_rank=0, world_size=1),
        _line(T0 + 2, "workers.started", ranks=[0], attempt=0),
        _line(T0 + 9, "succeeded"),
    ]
    _write_node(tmp_path / "logs", "a", [*good, "garbage", _line(T0 + 10, "x", v=3)])
    (tmp_path / "logs" / "b").mkdir()  # a node folder without events: not a node
    page = tmp_path / "out" / "report.html"
    page.parent.mkdir()
    code, out, err = _run(["report", str(tmp_path / "logs"), "-o", str(page)], capsys)
    assert code == 0, err
    assert page.is_file() and "<svg" in page.read_text()
    assert err.splitlines() == [
        f"report: {tmp_path}/logs/a/job_abcd1234/events.jsonl: line 5: not JSON: skipped",
        f"report: {tmp_path}/logs/a/job_abcd1234/events.jsonl: line 6: event version 3 "
        "(this report reads version 1): skipped",
    ]
    assert "succeeded on 1 node" in out and f"page: {page}" in out
    code, out, _ = _run(["report", str(tmp_path / "logs"), "--json"], capsys)
    body = json.loads(out)
    assert code == 0 and body["run_id"] == "job" and body["page"] is None
    assert len(body["problems"]) == 2 and body["nodes"][0]["ended"] == "succeeded"
    code, _, err = _run(["report", str(tmp_path / "logs"), "--run-id", "other"], capsys)
    assert code == 2 and err == f"Error: no run 'other' in {tmp_path}/logs (found: job)\n"
    code, _, err = _run(
        ["report", str(tmp_path / "logs"), "-o", str(tmp_path / "missing" / "r.html")], capsys
    )
    assert code == 2 and err.splitlines()[-1].startswith("Error: cannot write the page ")
