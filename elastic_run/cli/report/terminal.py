"""The report in a terminal (rich): the outcome and root cause, the goodput, the rounds, the
verdicts and how many problems the input had, for a machine with no browser. Pure (it renders into the
console it is given)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from elastic_run.agent.loop.goodput import summary_line
from elastic_run.cli.report.model import Report

__all__ = ["MAX_ROWS", "print_summary"]

MAX_ROWS = 50


def _rel(report: Report, t: float) -> str:
    return f"+{t - report.start_s:.1f}s"


def print_summary(report: Report, console: Console, page: str | None) -> None:
    """Print the report's summary.

    Args:
        report: the report.
        console: where to print.
        page: the page written (named last), or None.
    """
    nodes = len(report.lanes)
    console.print(
        Text.assemble(
            ("elastic-run report ", "bold"),
            (report.run_id, "bold cyan"),
            f": {nodes} node{'s' if nodes != 1 else ''}, {report.span_s:.1f} s, ",
            (report.outcome, "bold"),
        ),
        soft_wrap=True,
    )
    root = report.root_cause
    if root is not None:
        cause = f": {root.cause}" if root.cause else ""
        console.print(
            f"root cause (first failure): {report.lanes[root.lane].label} rank {root.rank} at "
            f"{_rel(report, root.at_s)}{cause}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if report.goodput is not None:
        console.print(summary_line(report.goodput), markup=False, highlight=False, soft_wrap=True)
    console.print(
        f"restarts: {report.restart_count} spent on failures; {len(report.rounds)} "
        f"round{'s' if len(report.rounds) != 1 else ''}",
        markup=False,
        highlight=False,
    )
    rounds = Table(title="rounds", title_justify="left", show_edge=False)
    for name in ("round", "completed", "nodes", "world", "ended by"):
        rounds.add_column(name, overflow="fold")
    for r in report.rounds[-MAX_ROWS:]:
        rounds.add_row(
            *(Text(c) for c in (str(r.number), _rel(report, r.at_s), str(len(r.lanes)))),
            Text(str(r.world_size)),
            Text(r.ended),
        )
    console.print(rounds)
    verdicts = report.verdicts()
    table = Table(title=f"verdicts ({len(verdicts)})", title_justify="left", show_edge=False)
    for name in ("when", "node", "what", "rank", "says"):
        table.add_column(name, overflow="fold")
    for m in verdicts[:MAX_ROWS]:
        cells = (
            _rel(report, m.at_s),
            report.lanes[m.lane].label,
            m.style,
            "" if m.rank is None else str(m.rank),
            m.text + (f" [{m.cause}]" if m.cause and m.cause not in m.text else ""),
        )
        table.add_row(*(Text(c) for c in cells))  # as written: no markup
    console.print(table)
    if len(verdicts) > MAX_ROWS:
        console.print(
            f"... and {len(verdicts) - MAX_ROWS} more (the page and --json have all)", markup=False
        )
    unaligned = [lane.label for lane in report.lanes if not lane.clock.aligned]
    aligned = [lane.clock.residual_s for lane in report.lanes if lane.clock.aligned]
    if aligned:
        console.print(
            f"clocks: {len(aligned)} nodes aligned by shared rounds, largest residual "
            f"{max(aligned):.3f} s"
            + (f"; not aligned: {', '.join(unaligned)}" if unaligned else ""),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if report.problems:
        n = len(report.problems)
        console.print(
            f"{n} problem{'s' if n != 1 else ''} with the input (on stderr; the rest is reported)",
            style="yellow",
        )
    if page is not None:
        console.print(f"page: {page}", markup=False, highlight=False, soft_wrap=True)
