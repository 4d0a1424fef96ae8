"""What people see: the agent's live panel, its plain event lines, the status and failure views.

Views read state; they never own it. The agent hands out snapshots (``agent.snapshot()``, the
rendezvous handler's ``snapshot()``) and events; this module turns them into rich renderables or
plain text. Nothing under ``elastic_run.agent`` imports rich: this module is where it lives.

- :class:`PlainLines`: one timestamped line per event on stderr (SLURM logs, pipes).
- :class:`LiveView` (:mod:`elastic_run.cli.views.live_panel`): one compact rich panel on a terminal,
  redrawn in place, with worker lines (and the agent's own output) scrolling above it.
- :func:`render_status` and :func:`status_to_json`: the ``elastic-run status`` view, shared by
  its one-shot, ``--watch`` and ``--json`` forms.
- :func:`render_failure_summary`: the failure summary when a job's restarts are used up.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any, Protocol

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from elastic_run.agent.config import LaunchConfig
from elastic_run.agent.events import AgentEvent
from elastic_run.agent.loop.snapshot import AgentSnapshot
from elastic_run.agent.workers.failures import FailureRecord, failure_facts, ordered_failures
from elastic_run.agent.workers.output import StreamName, write_console
from elastic_run.cli.live_feed import FeedPicture
from elastic_run.cli.views.goodput_view import GoodputPicture, render_goodput
from elastic_run.cli.views.live_panel import LiveView
from elastic_run.cli.views.progress_view import (
    ProgressPicture,
    render_progress,
)
from elastic_run.rendezvous.api import MemberSnapshot, RendezvousSnapshot

__all__ = [
    "STATUS_SCHEMA_VERSION",
    "LiveView",
    "PlainLines",
    "make_view",
    "render_failure_summary",
    "render_status",
    "status_to_json",
    "wants_live",
]

STATUS_SCHEMA_VERSION = 1
_EVENTS_SHOWN = 8


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%H:%M:%S")


class PlainLines:
    """One timestamped line per event on stderr (the view where there is no terminal)."""

    def __init__(self, run_id: str) -> None:
        self._run_id = run_id

    def __call__(self, event: AgentEvent) -> None:
        stamp = datetime.fromtimestamp(event.timestamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        write_console(
            StreamName.STDERR,
            f"{stamp} elastic-run[{self._run_id}] {event.kind}: {event.message}\n",
        )


class _SnapshotSource(Protocol):
    def snapshot(self) -> AgentSnapshot: ...


# -- the status view (also the rendezvous part of the live panel) -------------------------------


def _member_row(member: MemberSnapshot, ages: Mapping[str, float | None]) -> list[str]:
    age = ages.get(member.node_id)
    return [
        str(member.rank) if member.rank >= 0 else "-",
        member.host or member.addr,
        str(member.local_world_size),
        member.state or "-",
        member.health,
        str(member.restarts),
        "-" if age is None else f"{age:.1f} s",
        str(member.pid),
    ]


def render_status(
    snap: RendezvousSnapshot,
    ages: Mapping[str, float | None] | None = None,
    closed_reason: str | None = None,
    progress: ProgressPicture | None = None,
    goodput: GoodputPicture | None = None,
) -> RenderableType:
    """The rendezvous as a rich renderable: header, members, waiting nodes, progress, events.

    Args:
        snap: what :func:`elastic_run.rendezvous.dynamic.handler.read_snapshot` read.
        ages: seconds since each node's heartbeat was last seen moving (None: not seen moving).
        closed_reason: why the job was closed, when it is.
        progress: the ranks' progress (:func:`~elastic_run.cli.status_pictures.progress_picture`).
        goodput: the job's goodput (:func:`~elastic_run.cli.status_pictures.goodput_picture`).
    """
    ages = ages or {}
    nnodes = f"{snap.min_nodes}:{snap.max_nodes}" if snap.min_nodes or snap.max_nodes else "unknown"
    state = snap.state + (f" ({closed_reason})" if closed_reason else "")
    header = Text.assemble(
        ("run ", "dim"),
        (snap.run_id, "bold"),
        ("  backend ", "dim"),
        f"{snap.backend} {snap.endpoint}",
        ("  round ", "dim"),
        str(snap.round),
        ("  state ", "dim"),
        (state, "bold green" if snap.state == "complete" else "bold yellow"),
        ("  nnodes ", "dim"),
        nnodes,
    )
    members = Table(title="members", title_justify="left", expand=False)
    for col in (
        "rank",
        "host",
        "local world",
        "agent state",
        "health",
        "restarts",
        "heartbeat age",
        "pid",
    ):
        members.add_column(col)
    for member in snap.members:
        members.add_row(*_member_row(member, ages))
    parts: list[RenderableType] = [header, members]
    if snap.waiting:
        waiting = Table(title="waiting", title_justify="left")
        for col in (
            "rank",
            "host",
            "local world",
            "agent state",
            "health",
            "restarts",
            "heartbeat age",
        ):
            waiting.add_column(col)
        for member in snap.waiting:
            waiting.add_row(*_member_row(member, ages)[:7])
        parts.append(waiting)
    if snap.lost:
        parts.append(Text(f"lost from round {snap.round}: {', '.join(snap.lost)}", style="red"))
    for excluded in snap.excluded:
        parts.append(Text(f"excluded: {excluded}", style="red"))
    shown = render_progress(progress)
    if shown is not None:
        parts.append(shown)
    line = render_goodput(goodput)
    if line is not None:
        parts.append(line)
    for problem in snap.problems:
        parts.append(Text(f"unreadable: {problem}", style="bold red"))
    if snap.events:
        events = Table(title="last events", title_justify="left", show_header=False, box=None)
        for event in snap.events[-_EVENTS_SHOWN:]:
            ts = event.get("ts")
            events.add_row(
                _clock(float(ts)) if isinstance(ts, (int, float)) else "",
                str(event.get("host", "")),
                str(event.get("kind", "")),
                str(event.get("message", "")),
            )
        parts.append(events)
    return Group(*parts)


def _member_json(member: MemberSnapshot, ages: Mapping[str, float | None]) -> dict[str, Any]:
    body = asdict(member)
    age = ages.get(member.node_id)
    body["heartbeat_age_s"] = None if age is None else round(age, 3)
    return body


def status_to_json(
    snap: RendezvousSnapshot,
    ages: Mapping[str, float | None] | None = None,
    closed_reason: str | None = None,
    progress: ProgressPicture | None = None,
    goodput: GoodputPicture | None = None,
) -> dict[str, Any]:
    """The ``status --json`` object (schema version :data:`STATUS_SCHEMA_VERSION`).

    Keys: ``v``, ``run_id``, ``backend``, ``endpoint``, ``round``, ``state`` (``waiting for
    nodes``, ``last call``, ``complete``, ``closed``), ``closed``, ``closed_reason``,
    ``min_nodes``, ``max_nodes`` (0: unknown), ``arrivals``, ``members`` and ``waiting`` (each
    ``rank`` (-1 for waiting nodes), ``node_id``, ``host``, ``addr``, ``pid``,
    ``local_world_size``, ``state``, ``health`` (``ok``, ``suspect (1 of 2: <evidence>)``,
    ``excluded: <reason>``, ``spare``), ``restarts``, ``heartbeat`` (the counter),
    ``heartbeat_age_s`` (seconds since it was seen moving; null when it did not move while
    sampled)), ``lost`` (node ids lost from the round), ``excluded`` (the nodes excluded so far,
    one line each), ``problems`` (each key whose value could not
    be decoded, with why; the rest is shown), ``events`` (the last events, oldest first, each
    ``seq``, ``ts``, ``node``, ``host``, ``kind``, ``message``, ``fields``) and ``progress`` (the
    ranks' steps, step times and verdicts: see :func:`~elastic_run.cli.status_pictures.
    progress_picture`; null when no agent published any) and ``goodput`` (the job's account of its
    wall time, merged from the nodes': see :func:`~elastic_run.cli.status_pictures.
    goodput_picture`; null when no agent published one).
    """
    ages = ages or {}
    return {
        "v": STATUS_SCHEMA_VERSION,
        "run_id": snap.run_id,
        "backend": snap.backend,
        "endpoint": snap.endpoint,
        "round": snap.round,
        "state": snap.state,
        "closed": snap.closed,
        "closed_reason": closed_reason,
        "min_nodes": snap.min_nodes,
        "max_nodes": snap.max_nodes,
        "arrivals": snap.arrivals,
        "members": [_member_json(m, ages) for m in snap.members],
        "waiting": [_member_json(m, ages) for m in snap.waiting],
        "lost": list(snap.lost),
        "excluded": list(snap.excluded),
        "problems": list(snap.problems),
        "events": [dict(e) for e in snap.events],
        "progress": progress,
        "goodput": goodput,
    }


# -- the live panel (live_panel.py) or plain lines ------------------------------------------


def make_view(
    *,
    config: LaunchConfig,
    run_id: str,
    agent: _SnapshotSource,
    feed: Callable[[], FeedPicture] | None = None,
) -> LiveView | PlainLines:
    """The live panel when ``--live`` (or, by default, when stderr is a terminal), else plain lines.

    Args:
        feed: the live feed's last picture, for the panel (None: no rendezvous nor usage shown).
    """
    if wants_live(config):
        return LiveView(agent, run_id, feed=feed)
    return PlainLines(run_id)


def wants_live(config: LaunchConfig) -> bool:
    """Whether the run shows the live panel: ``--live``, or by default when stderr is a terminal."""
    return config.live if config.live is not None else sys.stderr.isatty()


# -- the failure summary ------------------------------------------------------------------------


def render_failure_summary(
    run_id: str, failures: Sequence[FailureRecord], console: Console
) -> None:
    """Print the failure summary: the root cause first, then every other failed rank.

    Args:
        run_id: the job's run id.
        failures: the failed workers (any order).
        console: where to print (the CLI passes a stderr console).
    """
    ordered = ordered_failures(failures)
    console.print(Text(f"run {run_id!r} failed: {len(ordered)} worker(s) failed", style="bold red"))
    for index, failure in enumerate(ordered):
        is_root = index == 0
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column(overflow="fold")
        for key, value in failure_facts(failure):
            table.add_row(key, Text(value, style="bold red" if key == "error" else ""))
        parts: list[RenderableType] = [table]
        if failure.error is not None:
            detail = failure.error.traceback or failure.error.raw
            if detail:
                parts.append(Text(detail.rstrip("\n"), style="dim"))
        title = (
            f"root cause: rank {failure.global_rank}" if is_root else f"rank {failure.global_rank}"
        )
        console.print(
            Panel(
                Group(*parts),
                title=title,
                title_align="left",
                border_style="red" if is_root else "yellow",
            )
        )
