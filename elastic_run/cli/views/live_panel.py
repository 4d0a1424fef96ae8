"""The agent's live panel on a terminal: one compact frame, redrawn in place, lines scrolling above.

Invariants (each fixes a defect seen in a terminal):
- Only one writer touches the terminal: rich, through one console on a private duplicate of the
  terminal's descriptor. While the panel is shown, the agent's own descriptors 1 and 2 are a
  pipe (:class:`_Capture`); whatever writes there (Python logging, a library, torch's C++ logs)
  is printed above the panel as whole lines, like the workers' lines (the console sink of
  ``agent/workers/output.py``). A write that bypassed rich used to scroll the frame out from under its
  cursor arithmetic and leave remnants of it (a second header, cut box lines).
- The frame never fills the terminal: it is at most 60 % of its height (sections are cut to
  fit, events first), so a redraw always reaches the frame's first row and worker lines keep
  scrolling above it. Every row is one terminal row: cells never wrap (long text ends in an
  ellipsis), and text from the outside (events, paths, where a rank is stuck) is reduced to
  characters of width one, since a character whose width the terminal counts differently from
  rich would shift every row after it.
- The frame is built from immutable snapshots on rich's refresh thread (the agent's, and the
  live feed's: ``cli/live_feed.py`` reads the store and ``/proc``): the panel owns nothing and
  does no I/O but drawing.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import unicodedata
from collections import deque
from collections.abc import Callable
from typing import IO, Protocol

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from elastic_run.agent.events import AgentEvent
from elastic_run.agent.loop.snapshot import AgentSnapshot
from elastic_run.agent.workers.output import set_console_sink
from elastic_run.cli.live_feed import FeedPicture
from elastic_run.cli.views.progress_view import worker_cells, worker_columns
from elastic_run.rendezvous.api import RendezvousSnapshot

__all__ = ["LiveView", "narrow_text"]

_EVENTS_KEPT = 8
_HEIGHT_SHARE = 0.6
_MIN_HEIGHT = 6
_READ_CHUNK = 65536


def narrow_text(text: str, limit: int = 240) -> str:
    """``text`` with only characters a terminal shows one column wide (others become ``?``).

    Control characters, combining marks, zero-width and variation selectors are dropped; wide
    characters (CJK, emoji) become ``?``. Cut to ``limit`` characters.
    """
    out = []
    for char in text[: limit * 2]:
        if char in "\t\n\r":
            out.append(" ")
            continue
        category = unicodedata.category(char)
        if category in ("Cc", "Cf", "Mn", "Me", "Cs", "Co", "Cn"):
            continue
        if unicodedata.east_asian_width(char) in ("W", "F") or ord(char) > 0xFFFF:
            out.append("?")
        else:
            out.append(char)
    return "".join(out)[:limit]


class _SnapshotSource(Protocol):
    def snapshot(self) -> AgentSnapshot: ...


class _Capture:
    """Descriptors 1 and 2 of this process into a pipe; a thread hands whole lines to ``sink``."""

    def __init__(self, sink: Callable[[str], None]) -> None:
        self._sink = sink
        self._saved: tuple[int, int] | None = None
        self._read_fd = -1
        self._thread: threading.Thread | None = None

    def start(self) -> IO[str]:
        """Redirect; return a text file on the real terminal (a duplicate of descriptor 2)."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        terminal = os.fdopen(os.dup(2), "w", encoding="utf-8", errors="replace", buffering=1)
        self._saved = (os.dup(1), os.dup(2))
        self._read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._thread = threading.Thread(target=self._run, name="live-panel-capture", daemon=True)
        self._thread.start()
        return terminal

    def _run(self) -> None:
        partial = b""
        while True:
            try:
                chunk = os.read(self._read_fd, _READ_CHUNK)
            except OSError:
                break
            if not chunk:
                break
            partial += chunk
            if b"\n" in partial:
                whole, _, partial = partial.rpartition(b"\n")
                self._sink(whole.decode("utf-8", "replace") + "\n")
        if partial:
            self._sink(partial.decode("utf-8", "replace") + "\n")

    def stop(self) -> None:
        """Give descriptors 1 and 2 back; print what was left in the pipe. Idempotent."""
        if self._saved is None:
            return
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        out, err = self._saved
        self._saved = None
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        if self._thread is not None:
            # The pipe's last writers were 1 and 2 (a child that inherited them may still
            # hold it: then the reader is abandoned, it is a daemon).
            self._thread.join(2.0)
            self._thread = None
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1


class LiveView:
    """The rich live panel of a running agent; an event sink with ``start`` and ``stop``.

    Args:
        agent: gives the agent's snapshot.
        run_id: the job's id (the panel's title).
        console: where to draw (default: the terminal behind stderr, taken over by ``start``).
        feed: gives the rendezvous picture and the workers' usage as their reader last
            published them (``cli/live_feed.py``; None: neither is shown).
    """

    def __init__(
        self,
        agent: _SnapshotSource,
        run_id: str,
        console: Console | None = None,
        feed: Callable[[], FeedPicture] | None = None,
    ) -> None:
        self._agent = agent
        self._feed = feed if feed is not None else FeedPicture
        self._run_id = run_id
        self._given_console = console
        self._console = console or Console(stderr=True)
        self._events: deque[AgentEvent] = deque(maxlen=_EVENTS_KEPT)
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._capture: _Capture | None = None
        self._terminal: IO[str] | None = None

    def __call__(self, event: AgentEvent) -> None:
        # Kept for the next frame only: rich's refresh thread draws it (twice a second). Drawing
        # here would read the rendezvous on the emitting thread, the loop's, which must never
        # wait on the store for a view.
        with self._lock:
            self._events.append(event)

    def start(self) -> None:
        """Show the panel; route the workers' lines and this process's own output above it."""
        if self._given_console is None and sys.stderr.isatty():
            self._capture = _Capture(self._print_above)
            self._terminal = self._capture.start()
            self._console = Console(file=self._terminal, stderr=False)
        self._live = Live(
            get_renderable=self.render,
            console=self._console,
            refresh_per_second=2,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=False,
            vertical_overflow="crop",
        )
        self._live.start()
        set_console_sink(lambda stream, text: self._print_above(text))

    def _print_above(self, text: str) -> None:
        live = self._live
        console = live.console if live is not None else self._console
        console.print(text, end="", markup=False, highlight=False, soft_wrap=True, emoji=False)

    def stop(self) -> None:
        """Draw the panel a last time and give the terminal back."""
        set_console_sink(None)
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None
        if self._capture is not None:
            self._capture.stop()
            self._capture = None
        if self._terminal is not None:
            self._terminal.close()
            self._terminal = None

    # -- the frame ------------------------------------------------------------------------

    def _height_budget(self) -> int:
        if self._terminal is not None:
            try:
                size = os.get_terminal_size(self._terminal.fileno())
                self._console.size = (size.columns, size.lines)
            except OSError:
                pass
        height = self._console.size.height
        return max(_MIN_HEIGHT, int(height * _HEIGHT_SHARE))

    def render(self) -> RenderableType:
        """The frame now, from the latest snapshots (called on rich's refresh thread)."""
        budget = self._height_budget() - 2  # the panel's two border rows
        snap = self._agent.snapshot()
        rows: list[RenderableType] = [_line(self._header(snap))]
        job = snap.job_progress
        if job is not None and job.median_s is not None:
            slow = ", ".join(
                f"rank {rank} {t:.3f} s ({ratio:.2f}x)" for rank, t, ratio in job.slowest[:3]
            )
            rows.append(
                _line(
                    f"median step {job.median_s:.3f} s over {job.ranks} ranks"
                    + (f"  slowest {slow}" if slow else "")
                )
            )
        feed = self._feed()
        if feed.rendezvous is not None:
            rows.append(_line(_members_line(feed.rendezvous)))
        if feed.rendezvous_error:
            rows.append(_line(f"rendezvous unreadable: {feed.rendezvous_error}", "yellow"))
        room = budget - len(rows)
        stragglers = job.stragglers if job is not None else ()
        table, used = self._workers_table(snap, stragglers, room, feed)
        if table is not None:
            rows.append(table)
            room -= used
        with self._lock:
            events = list(self._events)
        if events and room > 0:
            grid = Table.grid(padding=(0, 1))
            grid.add_column(no_wrap=True, min_width=8)
            grid.add_column(no_wrap=True, overflow="ellipsis", min_width=20, max_width=20)
            grid.add_column(no_wrap=True, overflow="ellipsis")
            for event in events[-room:]:
                stamp = time.strftime("%H:%M:%S", time.localtime(event.timestamp))
                grid.add_row(stamp, event.kind, narrow_text(event.message))
            rows.append(grid)
        title = narrow_text(f"elastic-run {self._run_id}", 80)
        return Panel(Group(*rows), title=title, title_align="left", box=box.ROUNDED)

    def _header(self, snap: AgentSnapshot) -> str:
        return (
            f"job {snap.run_id}  round {snap.round}  node {snap.group_rank}/"
            f"{snap.group_world_size}  world {snap.world_size}  state {snap.state}  "
            f"restarts {snap.restarts}/{snap.max_restarts}"
        )

    def _workers_table(
        self, snap: AgentSnapshot, stragglers: tuple[int, ...], room: int, feed: FeedPicture
    ) -> tuple[Table | None, int]:
        if room < 3 or not snap.workers:
            return None, 0
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))
        for col in ("local", "rank", "pid", "state", "cpu", "memory", *worker_columns()):
            table.add_column(col, no_wrap=True, overflow="ellipsis")
        fits = len(snap.workers) <= room - 2  # the header row and its rule
        if not fits and room < 4:  # the header, its rule, one row and the "more" caption
            return None, 0
        shown = snap.workers if fits else snap.workers[: room - 3]
        for w in shown:
            usage = feed.usage.get(w.pid) if w.pid is not None else None
            cpu = f"{usage.cpu_percent:.0f}%" if usage is not None else "-"
            mem = f"{usage.rss_bytes / 2**20:.0f} MiB" if usage is not None else "-"
            cells = worker_cells(w, stragglers)
            table.add_row(
                str(w.local_rank),
                str(w.rank),
                str(w.pid or "-"),
                w.state,
                cpu,
                mem,
                *[
                    Text(narrow_text(c.plain), style=c.style) if isinstance(c, Text) else c
                    for c in cells
                ],
            )
        if not fits:
            table.caption = f"... {len(snap.workers) - len(shown)} more workers"
        return table, len(shown) + (2 if fits else 3)


def _line(text: str, style: str = "") -> Text:
    return Text(narrow_text(text, 400), style=style, no_wrap=True, overflow="ellipsis")


def _members_line(rdzv: RendezvousSnapshot) -> str:
    nnodes = f"{rdzv.min_nodes}:{rdzv.max_nodes}" if rdzv.min_nodes or rdzv.max_nodes else "?"
    states: dict[str, int] = {}
    for member in rdzv.members:
        states[member.state or "?"] = states.get(member.state or "?", 0) + 1
    members = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    text = (
        f"rendezvous {rdzv.backend} {rdzv.endpoint}  round {rdzv.round} {rdzv.state}  "
        f"nnodes {nnodes}  members {len(rdzv.members)}" + (f" ({members})" if members else "")
    )
    if rdzv.waiting:
        text += f"  waiting {len(rdzv.waiting)}"
    if rdzv.lost:
        text += f"  lost {len(rdzv.lost)}"
    return text
