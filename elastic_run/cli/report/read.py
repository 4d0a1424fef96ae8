"""Reading the log directories: every node's run folder (the one with an ``events.jsonl``),
its events, and what its workers left (``attempt_<n>/<local_rank>/``: logs, error file,
stacks). The only module of the report that touches files.

A log directory may be a node's ``--log-dir`` (its run folders inside), one shared directory
holding every node's run folders (a shared file system under Slurm), a folder of such
directories, or a run folder itself: every ``events.jsonl`` under it is found, down to
``MAX_DEPTH`` levels (the attempts' folders are not searched). What cannot be read is a
problem, one line each; nothing here raises for bad input.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from elastic_run.agent.workers.failures import read_error_file
from elastic_run.cli.report.events_file import parse_events
from elastic_run.cli.report.model import NodeLog, Problem, WorkerFiles

__all__ = ["MAX_DEPTH", "MAX_EVENTS_BYTES", "read_log_dirs"]

MAX_DEPTH = 4
MAX_EVENTS_BYTES = 1 << 30  # a larger events.jsonl is read up to here
_WORKER_FILES = ("stdout.log", "stderr.log", "error.json", "stacks.txt")


def _event_files(root: Path) -> Iterator[Path]:
    base_depth = len(root.parts)
    for here, dirs, files in os.walk(root):
        if "events.jsonl" in files:
            yield Path(here) / "events.jsonl"
        depth = len(Path(here).parts) - base_depth
        dirs[:] = sorted(d for d in dirs if not d.startswith("attempt_") and depth < MAX_DEPTH)


def _workers(run_dir: Path) -> tuple[WorkerFiles, ...]:
    out = []
    try:
        attempts = sorted(p for p in run_dir.iterdir() if p.name.startswith("attempt_"))
    except OSError:
        return ()
    for attempt_dir in attempts:
        try:
            attempt = int(attempt_dir.name.removeprefix("attempt_"))
            ranks = sorted(p for p in attempt_dir.iterdir() if p.is_dir() and p.name.isdigit())
        except (ValueError, OSError):
            continue
        for rank_dir in ranks:
            names = tuple(n for n in _WORKER_FILES if (rank_dir / n).is_file())
            error = None
            if "error.json" in names:
                info = read_error_file(rank_dir / "error.json")
                if info is not None and info.message:
                    error = (
                        info.message.strip().splitlines()[0][:300] if info.message.strip() else None
                    )
            out.append(WorkerFiles(attempt, int(rank_dir.name), names, error))
    return tuple(out)


def _read_text(path: Path) -> tuple[str | None, str]:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_EVENTS_BYTES)
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"
    return raw.decode("utf-8", errors="replace"), ""


def read_log_dirs(paths: Sequence[str]) -> tuple[tuple[NodeLog, ...], tuple[Problem, ...]]:
    """Every node's log under ``paths``.

    Args:
        paths: the log directories given.

    Returns:
        ``(nodes, problems)``: a node per ``events.jsonl`` found (with the problems of its
        lines), and the problems of the directories themselves (missing, unreadable, no events).
    """
    nodes: list[NodeLog] = []
    problems: list[Problem] = []
    seen: set[Path] = set()
    for given in paths:
        root = Path(given)
        if not root.exists():
            problems.append(Problem(given, "no such directory"))
            continue
        if not root.is_dir():
            problems.append(Problem(given, "not a directory"))
            continue
        found = 0
        for file in _event_files(root):
            run_dir = file.parent.resolve()
            if run_dir in seen:
                continue
            seen.add(run_dir)
            found += 1
            rel = os.path.relpath(file.parent, root)
            name = root.resolve().name if rel == "." else rel
            where = str(file)
            text, why = _read_text(file)
            if text is None:
                problems.append(Problem(where, why))
                continue
            events, line_problems = parse_events(text, where)
            nodes.append(NodeLog(name, str(run_dir), events, _workers(run_dir), line_problems))
        if not found:
            problems.append(
                Problem(given, "no events.jsonl found (not a log directory of elastic-run?)")
            )
    return tuple(nodes), tuple(problems)
