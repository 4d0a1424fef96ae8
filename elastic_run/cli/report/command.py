"""``elastic-run report LOG_DIR... [-o report.html] [--json] [--run-id ID]``.

Reads every node's ``events.jsonl`` under the log directories, writes the page (``-o``,
default ``report.html``; with ``--json`` only when ``-o`` is given) and prints the summary, or
the report as JSON with ``--json``. Each problem with the input is one line on stderr
(``report: <file>: <problem>``) and the rest is reported; only when nothing is usable does it
fail, with one ``Error: ...`` line and exit code 2 (nothing is written then). The page is
written to a temporary file beside it and renamed, so a reader never sees half a page.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
from pathlib import Path

import click

from elastic_run.cli.report.build import build_report, report_json, run_id_of
from elastic_run.cli.report.html_page import render_page
from elastic_run.cli.report.model import NodeLog, Problem, Report
from elastic_run.cli.report.read import read_log_dirs
from elastic_run.errors import ConfigurationError

__all__ = ["DEFAULT_PAGE", "make_report", "report_command", "write_page"]

DEFAULT_PAGE = "report.html"
_MAX_ERROR_PROBLEMS = 3


def write_page(text: str, path: Path) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file beside it, renamed).

    Raises:
        ConfigurationError: it cannot be written (one line, nothing left behind).
    """
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise ConfigurationError(f"cannot write the page {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ConfigurationError(f"cannot write the page {path}: {exc.strerror or exc}") from None


def make_report(
    log_dirs: tuple[str, ...] | list[str], run_id: str | None
) -> tuple[Report | None, tuple[NodeLog, ...], tuple[Problem, ...]]:
    """Read the log directories and build the report: ``(report or None, nodes, problems of
    the directories)``. The cyclic garbage collector is paused meanwhile: the build makes
    millions of small objects and no cycle (a quarter of the time at a million events)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        nodes, problems = read_log_dirs(log_dirs)
        return build_report(nodes, run_id), nodes, problems
    finally:
        if was_enabled:
            gc.enable()


@click.command("report")
@click.argument("log_dirs", nargs=-1, required=True, metavar="LOG_DIR...")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help=f"Where to write the page (default: {DEFAULT_PAGE}; with --json, none unless given).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (for tools).")
@click.option(
    "--run-id",
    default=None,
    help="The run to report when the logs hold several (default: the one that ended last).",
)
def report_command(
    log_dirs: tuple[str, ...], output: str | None, as_json: bool, run_id: str | None
) -> None:
    """A page of what happened to a job: every node's phases over time, its failures, hangs,
    stragglers, lost members and restarts, its goodput; and a summary here.

    LOG_DIR: a node's --log-dir, a shared folder holding every node's run folders, or a run
    folder; give as many as there are nodes' folders. Open the page from the file: it needs no
    server and fetches nothing.
    """
    report, nodes, problems = make_report(log_dirs, run_id)
    every = [*problems, *(p for n in nodes for p in n.problems)]
    if report is None:
        if run_id is not None and any(n.events for n in nodes):
            found = sorted({run_id_of(n) for n in nodes if n.events})
            raise ConfigurationError(
                f"no run '{run_id}' in {', '.join(log_dirs)} (found: {', '.join(found)})"
            )
        shown = "; ".join(p.line() for p in every[:_MAX_ERROR_PROBLEMS])
        more = len(every) - _MAX_ERROR_PROBLEMS
        raise ConfigurationError(
            f"nothing to report in {', '.join(log_dirs)}: {shown}"
            + (f" (and {more} more)" if more > 0 else "")
        )
    from dataclasses import replace

    report = replace(report, problems=(*problems, *report.problems))
    for problem in report.problems:
        click.echo(f"report: {problem.line()}", err=True)
    page: Path | None = None
    if output is not None or not as_json:
        page = Path(output if output is not None else DEFAULT_PAGE)
        folder = str(page.parent.resolve()) if page.parent.exists() else str(page.parent)
        write_page(render_page(report, folder), page)
    if as_json:
        body = report_json(report)
        body["page"] = str(page) if page is not None else None
        click.echo(json.dumps(body, indent=1))
        return
    from rich.console import Console

    from elastic_run.cli.report.terminal import print_summary

    print_summary(report, Console(file=sys.stdout, highlight=False), str(page))
