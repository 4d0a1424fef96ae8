"""The progress part of ``elastic-run status`` and of the live panel: steps, step times, verdicts.

Reads what the agents published (``pg/<node id>`` per node, ``pg/job`` from the node of group
rank 0; see ``rendezvous/dynamic/telemetry.py``) and shows, per rank: its last step, its step and work
times, its ratio to the job's median, how long ago it beat, its hang timeout (learned or
given) and its verdict (``silent``, ``hung``, ``straggler``) with where it was stuck; and for
the job: the median step time and the slowest ranks. The median is computed here from the
records of the shown round, so ``status`` does not depend on node 0 being alive.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from elastic_run.agent.loop.snapshot import WorkerSnapshot
from elastic_run.agent.progress.hang_picture import merge
from elastic_run.agent.progress.publisher import rank_times, slowest_rows
from elastic_run.agent.rules.progress.step_times import DEFAULT_FACTOR, summarize

__all__ = [
    "ProgressPicture",
    "progress_picture",
    "render_progress",
    "worker_cells",
    "worker_columns",
]

ProgressPicture = dict[str, Any]


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def progress_picture(
    records: Mapping[str, Mapping[str, Any]],
    job: Mapping[str, Any] | None,
    round_: int,
) -> ProgressPicture:
    """The progress of a job as ``status --json`` shows it (the ``progress`` object).

    Args:
        records: node id -> its published record.
        job: the published job summary (for the factor and who was reported a straggler).
        round_: the round shown; records of another round are marked ``stale``.

    Returns:
        ``median_step_s``, ``ranks_reporting``, ``factor``, ``slowest`` (each ``rank``,
        ``host``, ``node``, ``work_s``, ``ratio``, ``straggler``), ``ranks`` (each ``rank``,
        ``local_rank``, ``node``, ``host``, ``step``, ``beats``, ``step_s``, ``work_s``,
        ``ratio``, ``age_s``, ``timeout_s``, ``verdict``, ``where``, ``stale``) and ``nodes``
        (node id -> ``hang_rule``, ``last_hang``, ``attempt``, ``round``), and ``hang``: the
        job's silent ranks merged from every node's stacks (``summary``, ``stuck``, ``waiting``,
        ``unknown``; see :mod:`elastic_run.agent.progress.hang_picture`), or None.
    """
    factor = _num((job or {}).get("factor")) or DEFAULT_FACTOR
    reported = {
        s.get("rank")
        for s in (job or {}).get("slowest") or ()
        if isinstance(s, Mapping) and s.get("straggler") and (job or {}).get("round") == round_
    }
    steps = summarize(rank_times(records, round_))
    median = steps.median_s
    ranks: list[dict[str, Any]] = []
    nodes: dict[str, dict[str, Any]] = {}
    for node_id, record in records.items():
        stale = record.get("round") != round_
        nodes[node_id] = {
            "hang_rule": record.get("hang_rule"),
            "last_hang": record.get("last_hang"),
            "attempt": record.get("attempt"),
            "round": record.get("round"),
        }
        for entry in record.get("ranks") or ():
            if not isinstance(entry, Mapping):
                continue
            work = _num(entry.get("work_s"))
            ratio = work / median if work and median and not stale else None
            verdict = str(entry.get("verdict") or "")
            if not verdict and ratio is not None and entry.get("rank") in reported:
                verdict = "straggler"
            ranks.append(
                {
                    "rank": entry.get("rank"),
                    "local_rank": entry.get("local_rank"),
                    "node": node_id,
                    "host": record.get("host", ""),
                    "step": entry.get("step"),
                    "beats": entry.get("beats"),
                    "step_s": _num(entry.get("step_s")),
                    "work_s": work,
                    "ratio": None if ratio is None else round(ratio, 3),
                    "age_s": _num(entry.get("age_s")),
                    # A rank that never beat is never judged: no timeout to show.
                    "timeout_s": _num(entry.get("timeout_s")) if entry.get("beats") else None,
                    "verdict": verdict,
                    "where": str(entry.get("where") or ""),
                    "stale": stale,
                }
            )
    ranks.sort(key=lambda r: r["rank"] if isinstance(r["rank"], int) else 1 << 30)
    hang = merge(records, round_)
    return {
        "hang": hang.as_json() if hang is not None else None,
        "median_step_s": median,
        "ranks_reporting": steps.ranks,
        "factor": factor,
        "slowest": slowest_rows(steps, lambda rank, ratio: rank in reported or ratio >= factor),
        "ranks": ranks,
        "nodes": nodes,
    }


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
