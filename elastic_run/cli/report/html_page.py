"""The report as one self-contained HTML page: inline SVG and CSS, no script, no asset from
elsewhere; it opens from a file with no server. Pure (it returns the page's text).

Above: the job's outcome and root cause, its goodput by cause and its restart count. Then the
timeline: a row per node (or per group of nodes alike, at scale) over time, its phases coloured
as the goodput account books them, each marker where it happened with its text as a tooltip
and a link to the worker's log (or its stacks); the zoom is CSS: radio buttons set the canvas's
width (1x to 64x) inside a horizontal scroller, and finer time ticks show as it widens. Below:
the rounds, every verdict with links to the worker's log, error file and stacks, and every
node's clock offset and residual. Links are relative to the page's folder.
"""

from __future__ import annotations

import datetime
import html
import os
import urllib.parse
from collections.abc import Sequence

from elastic_run.cli.report.markers import STYLES
from elastic_run.cli.report.model import Link, Marker, Report, Row, Segment
from elastic_run.cli.report.phases import CAUSES

__all__ = ["CAUSE_COLORS", "MARKER_COLORS", "ROW_HEIGHT_PX", "ZOOMS", "render_page"]

# Exact colours (the tests look for them in a screenshot).
CAUSE_COLORS = {
    "training": "#2e9e4f",
    "running": "#7cc58f",
    "stall": "#e6b400",
    "startup": "#7fb3d5",
    "restart.detection": "#c0392b",
    "restart.stop": "#e67e22",
    "restart.rendezvous": "#8e44ad",
    "restart.worker_start": "#2c6fbb",
    "restart.first_beat": "#17a2b8",
    "end": "#9e9e9e",
}
MARKER_COLORS = {
    "failure": "#d0021b",
    "hang": "#6a1b9a",
    "straggler": "#f39c12",
    "lost": "#111111",
    "excluded": "#444444",
    "suspect": "#ff7f0e",
    "check_failed": "#b71c1c",
    "link_slow": "#1f5fbf",
    "close": "#222222",
    "signal": "#333333",
    "membership": "#777777",
    "restart": "#a04000",
    "log_end": "#888888",
    "other": "#0b6e99",
}
_SHAPES = {
    "failure": '<circle r="5.5"/>',
    "hang": '<path d="M0-6.5 6.5 0 0 6.5-6.5 0z"/>',
    "straggler": '<path d="M0-6 6 5H-6z"/>',
    "lost": '<path d="M-5-5 5 5M5-5-5 5" stroke-width="3" fill="none"/>',
    "excluded": '<rect x="-5" y="-5" width="10" height="10"/>',
    "suspect": '<circle r="4.5" fill="none" stroke-width="2.5"/>',
    "check_failed": '<rect x="-5" y="-5" width="10" height="10" transform="rotate(45)"/>',
    "link_slow": '<path d="M-6-3h12v6h-12z"/>',
    "close": '<rect x="-1.5" y="-9" width="3" height="18"/>',
    "signal": '<path d="M-5-6H5L0 4z"/>',
    "membership": '<rect x="-0.75" y="-7" width="1.5" height="14"/>',
    "restart": '<path d="M0-7 3-2H-3z"/>',
    "log_end": '<rect x="-1" y="-9" width="2" height="18" opacity=".7"/>',
    "other": '<circle r="3.5"/>',
}
_STYLE_NAMES = {
    "failure": "worker failure",
    "hang": "hang",
    "straggler": "straggler",
    "lost": "member lost",
    "excluded": "node excluded",
    "suspect": "node suspect",
    "check_failed": "node check failed",
    "link_slow": "slow link",
    "close": "job's end on the node",
    "signal": "signal",
    "membership": "membership change",
    "restart": "restart decided",
    "log_end": "log ends",
    "other": "other event",
}
ZOOMS = (1, 2, 4, 8, 16, 32, 64)
ROW_HEIGHT_PX = 20
_BAR_PX = 14
_AXIS_PX = 30
_NAMES_PX = 220
_MAX_TABLE_ROWS = 2000
_MAX_PROBLEMS = 200
_MAX_TITLED_SEGMENTS = 100
_NUDGE_PX = 11
_NUDGE_SHARE = 0.006  # of the span: closer verdicts would overlap at 1x
_NICE_S = (
    0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
    21600, 43200, 86400, 172800, 345600, 604800,
)  # fmt: skip


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _pct(report: Report, t: float) -> str:
    return f"{(t - report.start_s) / report.span_s * 100:.4f}%"


def _dur(seconds: float) -> str:
    """A duration for people: ``850 ms``, ``4.1 s``, ``2m05s``, ``3h02m``, ``2d04h``."""
    s = abs(seconds)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def _amount(seconds: float, node_seconds: bool) -> str:
    """Seconds of wall time (node-seconds once merged), in hours when they are many."""
    unit = "node-" if node_seconds else ""
    if seconds >= 36_000:
        return f"{seconds / 3600:,.1f} {unit}h"
    return f"{seconds:,.1f} {unit}s"


def _rel(report: Report, t: float) -> str:
    return "+" + _dur(t - report.start_s) if t > report.start_s else "0"


def _utc(ts: float) -> str:
    try:
        when = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"{ts:.3f}"
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def _href(path: str, page_dir: str) -> str:
    rel = os.path.relpath(path, page_dir) if os.path.isabs(path) else path
    return urllib.parse.quote(rel.replace(os.sep, "/"), safe="/._-~")


def _css() -> str:
    causes = "".join(
        f".c{i}{{fill:{CAUSE_COLORS[c]}}}.k{i}{{background:{CAUSE_COLORS[c]}}}"
        for i, c in enumerate(CAUSES)
    )
    marks = "".join(
        f".mk.{s} use,.mk.{s} path,.lg .{s}{{fill:{MARKER_COLORS[s]};stroke:{MARKER_COLORS[s]}}}"
        for s in STYLES
    )
    zooms = "".join(
        f"#z{z}:checked~.tl .canvas{{width:{z * 100}%}}"
        f"#z{z}:checked~.zl label[for=z{z}]{{background:#333;color:#fff}}"
        for z in ZOOMS
    )
    finer = "".join(f"#z{z}:checked~.tl .t2{{display:inline}}" for z in ZOOMS if z >= 4)
    finest = "".join(f"#z{z}:checked~.tl .t3{{display:inline}}" for z in ZOOMS if z >= 16)
    return f"""
body{{font:14px/1.4 system-ui,sans-serif;margin:16px 20px;color:#222;background:#fff}}
h1{{font-size:20px;margin:0 0 4px}}h2{{font-size:16px;margin:22px 0 6px}}
.sub{{color:#555}}.big{{font-size:28px;font-weight:600}}
table{{border-collapse:collapse;font-size:13px}}td,th{{padding:2px 8px;border-bottom:1px solid #e4e4e4;text-align:left;vertical-align:top}}
th{{background:#f3f3f3}}td:first-child{{white-space:nowrap}}td.n{{text-align:right;font-variant-numeric:tabular-nums}}
.problems{{background:#fff4e5;border:1px solid #f0c36d;padding:6px 12px}}.problems li{{font-family:monospace;font-size:12px}}
.k{{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:-1px;margin-right:4px}}
{causes}
.gbar{{width:100%;max-width:1100px;height:22px;display:block}}
.zr{{position:absolute;opacity:0;pointer-events:none}}
.zl label{{border:1px solid #999;border-radius:3px;padding:0 6px;margin-right:3px;cursor:pointer;user-select:none}}
.tl{{display:flex;border:1px solid #ddd;margin-top:6px}}
.names{{flex:0 0 {_NAMES_PX}px;overflow:hidden;border-right:1px solid #ddd;background:#fafafa}}
.names .pad{{height:{_AXIS_PX}px;border-bottom:1px solid #ddd}}
.lbl{{height:{ROW_HEIGHT_PX}px;line-height:{ROW_HEIGHT_PX}px;padding:0 6px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;font-size:12px}}
.lbl.grp{{font-style:italic;color:#444}}.lbl a{{color:inherit;text-decoration:none}}
.scroll{{flex:1 1 auto;overflow-x:auto;overflow-y:hidden}}
.canvas{{width:100%;min-width:100%}}
.canvas svg{{display:block}}
.axis text{{font-size:10px;fill:#444}}.axis line,.grid{{stroke:#bbb;stroke-width:1}}
.t2,.t3{{display:none}}{finer}{finest}
{zooms}
.row rect{{y:3px;height:{_BAR_PX}px}}.row rect.bg{{y:2px;height:{_BAR_PX + 2}px;fill:#f4f4f4}}
.grp rect.bg{{fill:#ebebf5}}
.inf{{opacity:.45}}
.mk use{{stroke-width:1.2}}.mk:hover use{{stroke:#000;stroke-width:2}}
{marks}
.mk.close.ok use{{fill:#1b5e20;stroke:#1b5e20}}
.gcs span{{margin-right:18px}}
.lg svg{{vertical-align:-3px}}.lg span{{margin-right:14px;white-space:nowrap}}
.mono{{font-family:monospace;font-size:12px}}
"""


def _symbols() -> str:
    body = "".join(f'<symbol id="s-{s}" overflow="visible">{_SHAPES[s]}</symbol>' for s in STYLES)
    return f'<svg width="0" height="0" style="position:absolute" aria-hidden="true"><defs>{body}</defs></svg>'


def _header(report: Report, page_dir: str) -> str:
    root = report.root_cause
    lines = [
        f"<h1>elastic-run report: {_esc(report.run_id)}</h1>",
        f'<div class="sub">{len(report.lanes)} node{"s" if len(report.lanes) != 1 else ""}; '
        f"from {_esc(_utc(report.start_s))} for {_esc(_dur(report.span_s))}"
        + (
            f" (on the clock of {_esc(report.lanes[report.reference].label)})"
            if report.reference >= 0
            else ""
        )
        + "</div>",
        f'<p id="outcome"><b>Outcome:</b> {_esc(report.outcome)}</p>',
    ]
    if root is not None:
        where = report.lanes[root.lane].label
        cause = f": {_esc(root.cause)}" if root.cause else ""
        links = _links_html(root.links, page_dir)
        lines.append(
            f'<p id="root-cause"><b>Root cause</b> (first failure, {_esc(_rel(report, root.at_s))}, '
            f"{_esc(where)}, rank {_esc(root.rank)}){cause} {links}</p>"
        )
    if report.other_runs:
        named = ", ".join(f"{r} ({n} node{'s' if n != 1 else ''})" for r, n in report.other_runs)
        lines.append(
            f'<p class="sub">Other runs in these logs: {_esc(named)} (pick one with --run-id).</p>'
        )
    return "\n".join(lines)


def _links_html(links: Sequence[Link], page_dir: str) -> str:
    return " ".join(
        f'<a href="{_esc(_href(link.path, page_dir))}">{_esc(link.label)}</a>' for link in links
    )


def _problems(report: Report) -> str:
    if not report.problems:
        return ""
    items = "".join(f"<li>{_esc(p.line())}</li>" for p in report.problems[:_MAX_PROBLEMS])
    more = len(report.problems) - _MAX_PROBLEMS
    if more > 0:
        items += f"<li>... and {more} more (see --json)</li>"
    return (
        f'<section class="problems" id="problems"><b>Problems with the input '
        f"({len(report.problems)})</b>: the rest is drawn.<ul>{items}</ul></section>"
    )


def _goodput(report: Report) -> str:
    acc = report.goodput
    rounds = len(report.rounds)
    counts = (
        f'<p><b id="restarts">{report.restart_count} restart'
        f"{'s' if report.restart_count != 1 else ''}</b> spent on failures; "
        f"{rounds} round{'s' if rounds != 1 else ''} of the rendezvous"
        f"{f' ({rounds - 1} re-rendezvous)' if rounds > 1 else ''}.</p>"
    )
    if acc is None:
        return (
            '<section id="goodput"><h2>Goodput</h2><p>No node left a goodput account (each '
            "agent writes one as its run ends).</p>" + counts + "</section>"
        )
    many = acc.nodes > 1
    parts: list[tuple[str, float]] = [("training", acc.training_s)]
    parts += [(c, s) for c, s in acc.lost_by_cause().items()]
    total = max(acc.wall_s, 1e-9)
    x = 0.0
    rects = []
    rows = []
    for cause, seconds in parts:
        if seconds <= 0:
            continue
        i = CAUSES.index(cause)
        w = seconds / total * 100
        rects.append(
            f'<rect class="c{i}" x="{x:.3f}%" y="0" width="{w:.3f}%" height="22">'
            f"<title>{_esc(cause)} {_amount(seconds, many)} ({w:.1f}%)</title></rect>"
        )
        x += w
        rows.append(
            f'<span class="gc" data-cause="{_esc(cause)}"><i class="k k{i}"></i>{_esc(cause)} '
            f"<b>{_amount(seconds, many)}</b> ({w:.1f}%)</span>"
        )
    with_account = sum(1 for lane in report.lanes if lane.account is not None)
    note = (
        f" ({with_account} of {len(report.lanes)} nodes left an account: the others' time is "
        "not in it)"
        if with_account < len(report.lanes)
        else ""
    )
    return (
        f'<section id="goodput"><h2>Goodput</h2><div><span class="big">{acc.share * 100:.1f}%</span> '
        f"training: {_amount(acc.training_s, many)} of {_amount(acc.wall_s, many)}"
        f"{_esc(note)}</div>"
        f'<svg class="gbar" role="img">{"".join(rects)}</svg>'
        f'<p class="lg gcs">{"".join(rows)}</p>{counts}</section>'
    )


def _ticks(report: Report, height: int) -> tuple[str, str]:
    """The axis's ticks (three levels, finer ones shown as the zoom grows) and the lanes'
    grid lines (the coarsest level)."""
    span = report.span_s
    steps = []
    for divisions in (10, 50, 250):
        step = next((n for n in _NICE_S if n >= span / divisions), _NICE_S[-1])
        steps.append(step)
    axis, grid = [], []
    seen: set[int] = set()
    for level, step in enumerate(steps, 1):
        k = 0
        while k * step <= span + 1e-9:
            t = k * step
            key = round(t * 1000)
            k += 1
            if key in seen:
                continue
            seen.add(key)
            x = f"{t / span * 100:.4f}%"
            anchor = ' text-anchor="start"' if t == 0 else ""
            if t / span > 0.97:
                anchor = ' text-anchor="end"'

            axis.append(
                f'<g class="t{level}"><line x1="{x}" x2="{x}" y1="{_AXIS_PX - (9 if level == 1 else 5)}" '
                f'y2="{_AXIS_PX}"/><text x="{x}" y="{12 if level == 1 else 20}"{anchor}>'
                f"{_esc('0' if t == 0 else '+' + _dur(t))}</text></g>"
            )
            if level == 1:
                grid.append(f'<line class="grid" x1="{x}" x2="{x}" y1="0" y2="{height}"/>')
    return "".join(axis), "".join(grid)


def _segment(report: Report, seg: Segment, titled: bool) -> str:
    x0 = (seg.start_s - report.start_s) / report.span_s * 100
    w = max((seg.end_s - seg.start_s) / report.span_s * 100, 0.002)
    cls = f"c{CAUSES.index(seg.cause)}" + (" inf" if seg.inferred else "")
    title = ""
    if titled:
        how = " (inferred: after its last event)" if seg.inferred else ""
        title = f"<title>{_esc(seg.cause)} {_esc(_dur(seg.end_s - seg.start_s))}{how}</title>"
    return f'<rect class="{cls}" x="{x0:.4f}%" width="{w:.4f}%">{title}</rect>'


def _marker(report: Report, m: Marker, page_dir: str, nudge_px: int = 0) -> str:
    where = report.lanes[m.lane].label
    by = report.lanes[m.source].label if 0 <= m.source != m.lane else ""
    parts = [f"{_rel(report, m.at_s)} {where}: {m.text}"]
    if m.count > 1:
        parts[0] = f"{m.count} x {_STYLE_NAMES[m.style]}, the first: " + parts[0]
    if m.cause:
        parts.append(f"cause: {m.cause}")
    if by:
        parts.append(f"(judged by {by})")
    title = _esc("\n".join(parts))
    ok = " ok" if m.kind == "succeeded" else ""
    rank = f' data-rank="{m.rank}"' if m.rank is not None else ""
    shift = f' transform="translate({nudge_px},0)"' if nudge_px else ""
    use = f'<use href="#s-{m.style}" x="{_pct(report, m.at_s)}" y="{ROW_HEIGHT_PX // 2}"{shift}/>'
    attrs = f'class="mk {m.style}{ok}" data-kind="{_esc(m.kind)}" data-node="{_esc(where)}"{rank}'
    link = _primary(m)
    if link is not None:
        return (
            f'<a {attrs} href="{_esc(_href(link.path, page_dir))}"><title>{title}</title>{use}</a>'
        )
    return f"<g {attrs}><title>{title}</title>{use}</g>"


def _primary(m: Marker) -> Link | None:
    """The link a marker opens: a hang's stacks, else the worker's log."""
    order = (
        ("stacks", "stderr", "stdout", "error.json")
        if m.style == "hang"
        else ("stderr", "stdout", "error.json", "stacks")
    )
    for label in order:
        for link in m.links:
            if link.label == label:
                return link
    return None


def _timeline(report: Report, page_dir: str) -> str:
    rows = report.rows
    height = max(len(rows), 1) * ROW_HEIGHT_PX
    axis, grid = _ticks(report, height)
    names, body = [], []
    for i, row in enumerate(rows):
        names.append(_label(report, row, page_dir))
        body.append(_row(report, row, i * ROW_HEIGHT_PX, page_dir))
    radios = "".join(
        f'<input class="zr" type="radio" name="zoom" id="z{z}"{" checked" if z == 1 else ""}>'
        for z in ZOOMS
    )
    labels = "".join(f'<label for="z{z}">{z}&#215;</label>' for z in ZOOMS)
    return (
        f'<section id="timeline"><h2>Nodes over time</h2>{radios}'
        f'<div class="zl">zoom: {labels} <span class="sub">(then scroll sideways)</span></div>'
        f'<div class="tl"><div class="names"><div class="pad"></div>{"".join(names)}</div>'
        f'<div class="scroll"><div class="canvas">'
        f'<svg class="axis" width="100%" height="{_AXIS_PX}">{axis}</svg>'
        f'<svg class="lanes" width="100%" height="{height}">{grid}{"".join(body)}</svg>'
        f"</div></div></div>{_legend()}</section>"
    )


def _label(report: Report, row: Row, page_dir: str) -> str:
    if row.is_group:
        return f'<div class="lbl grp" title="{_esc(row.note)}">{_esc(row.label)}</div>'
    lane = report.lanes[row.lanes[0]]
    clock = lane.clock
    how = (
        "the reference clock"
        if clock.reference
        else (
            f"clock offset {clock.offset_s:+.3f} s, residual {clock.residual_s:.3f} s over "
            f"{clock.shared} round{'s' if clock.shared != 1 else ''}"
            if clock.aligned
            else "its own clock: not aligned (no round shared)"
        )
    )
    title = f"{lane.name}\n{how}\nended: {lane.ended}"
    href = _esc(_href(f"{lane.path}/events.jsonl", page_dir))
    return (
        f'<div class="lbl" title="{_esc(title)}"><a href="{href}">{_esc(lane.label)}</a>'
        f' <span class="sub">{_esc(lane.ended)}</span></div>'
    )


def _row(report: Report, row: Row, y: int, page_dir: str) -> str:
    titled = len(row.segments) <= _MAX_TITLED_SEGMENTS
    rects = "".join(_segment(report, s, titled) for s in row.segments)
    marks = "".join(
        _marker(report, m, page_dir, nudge)
        for m, nudge in zip(row.markers, _nudges(report, row), strict=True)
    )
    group = " grp" if row.is_group else ""
    lanes = len(row.lanes)
    return (
        f'<g class="row{group}" data-label="{_esc(row.label)}" data-lanes="{lanes}" '
        f'transform="translate(0,{y})"><rect class="bg" x="0" width="100%"/>'
        f"{rects}{marks}</g>"
    )


def _nudges(report: Report, row: Row) -> list[int]:
    """How many pixels to shift each of the row's verdict markers right so that verdicts at
    (nearly) one instant sit side by side, not on top of each other."""
    out, last_x, shift = [], -1.0, 0
    for m in row.markers:
        if not m.verdict:
            out.append(0)
            continue
        x = (m.at_s - report.start_s) / report.span_s
        shift = shift + _NUDGE_PX if x - last_x < _NUDGE_SHARE else 0
        last_x = x
        out.append(shift)
    return out


def _legend() -> str:
    causes = "".join(f'<span><i class="k k{i}"></i>{_esc(c)}</span>' for i, c in enumerate(CAUSES))
    marks = "".join(
        f'<span><svg width="16" height="18"><g class="mk {s}"><use href="#s-{s}" x="8" y="9"/>'
        f"</g></svg>{_esc(_STYLE_NAMES[s])}</span>"
        for s in STYLES
    )
    return f'<p class="lg">{causes}</p><p class="lg">{marks}</p>'


def _rounds(report: Report) -> str:
    rows = []
    for r in report.rounds[:_MAX_TABLE_ROWS]:
        names = [report.lanes[i].label for i in r.lanes]
        who = ", ".join(names) if len(names) <= 8 else f"{len(names)} nodes"
        rows.append(
            f'<tr><td class="n">{r.number}</td><td>{_esc(_rel(report, r.at_s))}</td>'
            f'<td>{_esc(who)}</td><td class="n">{r.world_size}</td>'
            f'<td class="n">{r.restart_count}</td><td>{_esc(r.ended)}</td></tr>'
        )
    return (
        '<section id="rounds"><h2>Rounds</h2><table><tr><th>round</th><th>completed</th>'
        "<th>nodes</th><th>world size</th><th>restart count</th><th>ended by</th></tr>"
        f"{''.join(rows)}</table></section>"
    )


def _verdicts(report: Report, page_dir: str) -> str:
    verdicts = report.verdicts()
    rows = []
    for m in verdicts[:_MAX_TABLE_ROWS]:
        by = report.lanes[m.source].label if 0 <= m.source != m.lane else ""
        rows.append(
            f'<tr class="v {m.style}"><td>{_esc(_rel(report, m.at_s))}</td>'
            f"<td>{_esc(report.lanes[m.lane].label)}</td><td>{_esc(_STYLE_NAMES[m.style])}</td>"
            f'<td class="n">{_esc("" if m.rank is None else m.rank)}</td>'
            f"<td>{_esc(m.text)}{_esc(f' (judged by {by})' if by else '')}</td>"
            f"<td>{_esc(m.cause or '')}</td><td>{_links_html(m.links, page_dir)}</td></tr>"
        )
    more = len(verdicts) - _MAX_TABLE_ROWS
    tail = f"<p>... and {more} more (see --json).</p>" if more > 0 else ""
    empty = "<p>None: no failure, hang, straggler, loss or exclusion.</p>" if not verdicts else ""
    return (
        f'<section id="verdicts"><h2>Verdicts ({len(verdicts)})</h2>{empty}'
        "<table><tr><th>when</th><th>node</th><th>what</th><th>rank</th><th>says</th>"
        f"<th>root cause</th><th>files</th></tr>{''.join(rows)}</table>{tail}</section>"
    )


def _clocks(report: Report) -> str:
    lanes = report.lanes
    aligned = [lane for lane in lanes if lane.clock.aligned]
    worst = max((lane.clock.residual_s for lane in aligned), default=0.0)
    unaligned = len(lanes) - len(aligned)
    ref = lanes[report.reference].label if report.reference >= 0 else "none"
    rows = "".join(
        f'<tr><td>{_esc(lane.label)}</td><td class="mono">{_esc(lane.name)}</td>'
        + (
            "<td>reference</td><td></td><td></td>"
            if lane.clock.reference
            else (
                f'<td class="n">{lane.clock.offset_s:+.3f} s</td>'
                f'<td class="n">{lane.clock.residual_s:.3f} s</td><td class="n">{lane.clock.shared}</td>'
                if lane.clock.aligned
                else "<td>not aligned</td><td></td><td></td>"
            )
        )
        + "</tr>"
        for lane in lanes
    )
    return (
        f'<section id="clocks"><details{" open" if len(lanes) <= 16 else ""}><summary><b>Clocks</b>: '
        f"{len(aligned)} of {len(lanes)} nodes on the clock of {_esc(ref)}, aligned by the rounds "
        f"they completed together; largest residual {worst:.3f} s"
        f"{f'; {unaligned} not aligned (drawn on their own clocks)' if unaligned else ''}"
        "</summary><table><tr><th>node</th><th>folder</th><th>offset</th><th>residual</th>"
        f"<th>rounds shared</th></tr>{rows}</table></details></section>"
    )


def render_page(report: Report, page_dir: str) -> str:
    """The page's HTML.

    Args:
        report: the report.
        page_dir: the folder the page is written to (absolute): links are relative to it.

    Returns:
        The page's text.
    """
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>elastic-run report: {_esc(report.run_id)}</title>"
        f"<style>{_css()}</style></head><body>{_symbols()}\n"
        f"<header>{_header(report, page_dir)}</header>\n{_problems(report)}\n{_goodput(report)}\n"
        f"{_timeline(report, page_dir)}\n{_rounds(report)}\n{_verdicts(report, page_dir)}\n"
        f"{_clocks(report)}\n"
        '<footer class="sub"><p>Phases as each node\'s goodput account books them (replayed '
        "from its events; stalls inside training are in the totals, the hangs' silences in the "
        "lanes). Times on one clock: see Clocks. Made by elastic-run report.</p></footer>"
        "</body></html>\n"
    )
