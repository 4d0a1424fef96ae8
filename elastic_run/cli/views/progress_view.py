"""The progress part of ``elastic-run status`` and of the live panel: steps, step times, verdicts.

Shows a picture built elsewhere (``status``'s: :func:`elastic_run.cli.status_pictures.progress_picture`,
from what the agents published; the panel's: the agent's snapshot), per rank: its last step, its
step and work times, its ratio to the job's median, how long ago it beat, its hang timeout
(learned or given) and its verdict (``silent``, ``hung``, ``straggler``) with where it was stuck;
and for the job: the median step time and the slowest ranks. It computes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from elastic_run.agent.loop.snapshot import WorkerSnapshot

__all__ = [
    "ProgressPicture",
    "render_progress",
    "worker_cells",
    "worker_columns",
]

ProgressPicture = dict[str, Any]
"""``status --json``'s ``progress`` object."""


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _s(value: Any, digits: int = 3) -> str:
    number = _num(value)
    return "-" if number is None else f"{number:.{digits}f} s"


def render_progress(picture: ProgressPicture | None, max_rows: int = 16) -> RenderableType | None:
    """The progress tables of ``status``: the job line, then one row per rank (at most
    ``max_rows``: the hung, silent and slowest first)."""
    if not picture or not picture.get("ranks"):
        return None
    median = picture.get("median_step_s")
    slowest = [
        f"rank {s['rank']} {s['work_s']:.3f} s ({s['ratio']:.2f}x"
        + (", straggler)" if s.get("straggler") else ")")
        for s in picture.get("slowest") or ()
        if s.get("ratio", 0) > 1.0
    ][:3]
    # With sync_point() the ranks are compared by their own work per step, not the step.
    works = any(
        r["work_s"] is not None
        and r["step_s"] is not None
        and abs(r["work_s"] - r["step_s"]) > 1e-9
        for r in picture["ranks"]
    )
    head = Text.assemble(
        ("median work per step " if works else "median step ", "dim"),
        _s(median),
        (f" over {picture.get('ranks_reporting', 0)} ranks", "dim"),
        *((("  slowest ", "dim"), ", ".join(slowest)) if slowest else ()),
    )
    rules = {n.get("hang_rule") for n in picture.get("nodes", {}).values() if n.get("hang_rule")}
    parts: list[RenderableType] = [head]
    if rules:
        parts.append(Text(f"hang timeout: {', '.join(sorted(rules))}", style="dim"))
    hang = picture.get("hang")
    if isinstance(hang, Mapping) and hang.get("summary"):
        parts.append(Text(f"hang (whole job): {hang['summary']}", style="bold red"))
    for node in picture.get("nodes", {}).values():
        if node.get("last_hang"):
            parts.append(Text(f"last hang: {node['last_hang']}", style="red"))
    rows = list(picture["ranks"])
    order = {"hung": 0, "silent": 1, "straggler": 2}
    rows.sort(key=lambda r: (order.get(r["verdict"], 3), -(r["ratio"] or 0), r["rank"] or 0))
    table = Table(title="ranks", title_justify="left")
    for col in ("rank", "host", "step", "step time", "work", "ratio", "last beat", "timeout"):
        table.add_column(col)
    table.add_column("verdict")
    for row in sorted(
        rows[:max_rows], key=lambda r: r["rank"] if isinstance(r["rank"], int) else 0
    ):
        verdict = row["verdict"] + (f": {row['where']}" if row["where"] else "")
        table.add_row(
            str(row["rank"]),
            str(row["host"]),
            "-" if row["step"] in (None, -1) else str(row["step"]),
            _s(row["step_s"]),
            _s(row["work_s"]),
            "-" if row["ratio"] is None else f"{row['ratio']:.2f}x",
            "-" if row["age_s"] is None else f"{row['age_s']:.1f} s ago",
            _s(row["timeout_s"], 1),
            Text(verdict + (" (old round)" if row["stale"] else ""), style=_style(row["verdict"])),
        )
    parts.append(table)
    if len(rows) > max_rows:
        parts.append(
            Text(f"... and {len(rows) - max_rows} more ranks (--json shows all)", style="dim")
        )
    return Group(*parts)


def _style(verdict: str) -> str:
    return {"hung": "bold red", "silent": "yellow", "straggler": "magenta"}.get(verdict, "")


def worker_columns() -> Sequence[str]:
    """The progress columns of the live panel's workers table."""
    return ("step", "step time", "last beat", "timeout", "verdict")


def worker_cells(worker: WorkerSnapshot, stragglers: Sequence[int] = ()) -> list[Text | str]:
    """The progress cells of one worker in the live panel."""
    p = worker.progress
    if p is None:
        return ["-"] * len(worker_columns())
    verdict = p.verdict or ("straggler" if worker.rank in stragglers else "")
    if p.where:
        verdict += f": {p.where}"
    return [
        "-" if p.step < 0 else str(p.step),
        _s(p.work_time_s),
        "-" if p.last_beat_age_s is None else f"{p.last_beat_age_s:.1f} s ago",
        _s(p.timeout_s, 1) if p.beats else "-",
        Text(verdict, style=_style(p.verdict or ("straggler" if verdict else ""))),
    ]
