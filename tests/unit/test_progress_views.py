"""The progress views (``cli/views/progress_view.py``, ``cli/views/live_panel.py``, ``status --json``): what
the published records become, and a live frame that always fits its terminal."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

from rich.console import Console

from elastic_run.agent.events import AgentEvent
from elastic_run.agent.loop.snapshot import (
    AgentSnapshot,
    JobProgress,
    WorkerProgress,
    WorkerSnapshot,
)
from elastic_run.cli.status_pictures import progress_picture
from elastic_run.cli.views.lines import status_to_json
from elastic_run.cli.views.live_panel import LiveView, narrow_text
from elastic_run.cli.views.progress_view import render_progress
from elastic_run.rendezvous.api import RendezvousSnapshot


def _record(host: str, round_: int, ranks: list[tuple[int, float]], **extra: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "round": round_,
        "attempt": 0,
        "host": host,
        "hang_rule": "auto (floor 30 s)",
        "last_hang": None,
        "ranks": [
            {
                "rank": rank,
                "local_rank": i,
                "step": 100,
                "beats": 101,
                "step_s": 0.2,
                "work_s": work,
                "age_s": 0.1,
                "timeout_s": 30.0,
                "verdict": "",
                "where": "",
            }
            for i, (rank, work) in enumerate(ranks)
        ],
        **extra,
    }


RECORDS = {
    "a": _record("ha", 3, [(0, 0.05), (1, 0.05)]),
    "b": _record("hb", 3, [(2, 0.05), (3, 0.10)]),
}


def test_the_picture_has_the_median_and_the_slowest_with_its_ratio() -> None:
    job = {"round": 3, "factor": 1.5, "slowest": [{"rank": 3, "straggler": True}]}
    picture = progress_picture(RECORDS, job, 3)
    assert picture["median_step_s"] == 0.05 and picture["ranks_reporting"] == 4
    top = picture["slowest"][0]
    assert (top["rank"], top["host"], top["ratio"], top["straggler"]) == (3, "hb", 2.0, True)
    by_rank = {r["rank"]: r for r in picture["ranks"]}
    assert by_rank[3]["verdict"] == "straggler" and by_rank[3]["ratio"] == 2.0
    assert by_rank[0]["verdict"] == "" and by_rank[0]["timeout_s"] == 30.0
    assert picture["nodes"]["a"]["hang_rule"] == "auto (floor 30 s)"


def test_records_of_an_older_round_are_shown_stale_and_not_counted() -> None:
    records = {**RECORDS, "c": _record("hc", 2, [(4, 9.0)])}
    picture = progress_picture(records, None, 3)
    assert picture["ranks_reporting"] == 4
    stale = [r for r in picture["ranks"] if r["stale"]]
    assert [r["rank"] for r in stale] == [4] and stale[0]["ratio"] is None


def test_status_json_carries_the_progress_and_the_table_shows_the_verdicts() -> None:
    hung = _record("hb", 3, [(2, 0.05)])
    hung["ranks"][0].update(verdict="hung", where="Event.wait at train.py:39")
    hung["last_hang"] = "rank 2 stuck 31 s in Event.wait at train.py:39"
    picture = progress_picture({"a": RECORDS["a"], "b": hung}, None, 3)
    snap = RendezvousSnapshot(
        run_id="j",
        backend="c10d",
        endpoint="h:1",
        round=3,
        state="complete",
        min_nodes=2,
        max_nodes=4,
        closed=False,
        members=(),
        waiting=(),
        arrivals=2,
    )
    body = status_to_json(snap, {}, None, picture)
    assert body["progress"] is picture and body["min_nodes"] == 2 and body["max_nodes"] == 4
    console = Console(file=io.StringIO(), width=160, force_terminal=False)
    shown = render_progress(picture)
    assert shown is not None
    console.print(shown)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "hung: Event.wait at train.py:39" in text
    assert "last hang: rank 2 stuck 31 s" in text
    assert "median work per step 0.050 s over 3 ranks" in text


def test_narrow_text_keeps_every_character_one_column_wide() -> None:
    assert narrow_text("GLHF! \U0001f3d6\ufe0f done") == "GLHF! ? done"
    assert narrow_text("a\tb\x1b[31mc") == "a b[31mc"
    assert narrow_text("\u4e2d\u6587") == "??"
    assert narrow_text("x" * 500, 10) == "x" * 10


class _Agent:
    def __init__(self, workers: int) -> None:
        self.workers = workers

    def snapshot(self) -> AgentSnapshot:
        progress = WorkerProgress(
            beats=5,
            step=4,
            step_time_s=0.1,
            work_time_s=0.1,
            last_beat_age_s=0.2,
            timeout_s=30.0,
            verdict="hung",
            where="Event.wait at train.py:39 \U0001f3d6",
        )
        return AgentSnapshot(
            run_id="job",
            backend="c10d",
            endpoint="h:1",
            state="HEALTHY",
            round=2,
            group_rank=0,
            group_world_size=2,
            world_size=2 * self.workers,
            restarts=1,
            max_restarts=3,
            workers=tuple(
                WorkerSnapshot(i, i, None, "HEALTHY", progress=progress)
                for i in range(self.workers)
            ),
            job_progress=JobProgress(0.1, 4, ((3, 0.2, 2.0),), (3,)),
        )


def _frame(view: LiveView, console: Console) -> list[str]:
    console.print(view.render())
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return text.splitlines()


def test_the_live_frame_fits_in_60_percent_of_any_terminal() -> None:
    for height, workers in [(20, 2), (20, 16), (50, 64), (12, 8)]:
        console = Console(file=io.StringIO(), width=100, height=height, color_system=None)
        view = LiveView(_Agent(workers), "job", console=console)
        for i in range(12):
            view(AgentEvent("restart", f"event {i} with a wide \u4e2d char"))
        lines = _frame(view, console)
        assert len(lines) <= max(6, int(height * 0.6)), (height, workers, len(lines))
        assert all(len(line) <= 100 for line in lines)
        assert lines[0].startswith("\u256d") and lines[-1].startswith("\u2570")


def test_the_live_frame_shows_each_ranks_progress_and_the_job_line() -> None:
    console = Console(file=io.StringIO(), width=160, height=40, force_terminal=False)
    view = LiveView(_Agent(2), "job", console=console)
    text = "\n".join(_frame(view, console))
    assert "median step 0.100 s over 4 ranks  slowest rank 3 0.200 s (2.00x)" in text
    assert "hung: Event.wait at train.py:39 ?" in text


def test_a_rank_that_never_beat_shows_no_hang_timeout() -> None:
    """Nothing to judge, nothing shown: ``-`` in the status table and the live panel, null in
    ``status --json`` (also for a record of an agent that still published its warm-up 600 s)."""
    idle = _record("ha", 3, [(0, 0.05)])
    idle["ranks"][0].update(beats=0, step=-1, step_s=None, work_s=None, age_s=None)
    idle["ranks"][0]["timeout_s"] = 600.0
    picture = progress_picture({"a": idle, "b": RECORDS["b"]}, None, 3)
    by_rank = {r["rank"]: r for r in picture["ranks"]}
    assert by_rank[0]["timeout_s"] is None and by_rank[2]["timeout_s"] == 30.0
    console = Console(file=io.StringIO(), width=160, force_terminal=False)
    shown = render_progress(picture)
    assert shown is not None
    console.print(shown)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    row = next(line for line in text.splitlines() if line.strip().startswith("│ 0 "))
    assert "600" not in row and row.rstrip(" │").endswith("-"), row

    class _Idle(_Agent):
        def snapshot(self) -> AgentSnapshot:
            snap = super().snapshot()
            never = WorkerProgress(beats=0, timeout_s=None)
            return dataclasses.replace(
                snap, workers=tuple(dataclasses.replace(w, progress=never) for w in snap.workers)
            )

    console = Console(file=io.StringIO(), width=160, height=40, force_terminal=False)
    frame = "\n".join(_frame(LiveView(_Idle(1), "job", console=console), console))
    assert "600" not in frame and " s ago" not in frame, frame
