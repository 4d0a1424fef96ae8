"""Worker failures: the error files workers write, and the summary the launcher prints.

A worker decorated with torch's ``@record`` (or ours) writes, at ``TORCHELASTIC_ERROR_FILE``::

    {"message": {"message": "<ExcType>: <text>",
                 "extraInfo": {"py_callstack": "<traceback>", "timestamp": "<epoch s>"}}}

:func:`read_error_file` reads it and never raises on a bad file: a file that is not that JSON is
kept as raw text. The summary names the earliest failure as the root cause, then lists every
failed rank with its exit code or signal, time, pid, host, error and log location.
"""

from __future__ import annotations

import datetime
import json
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "FailureRecord",
    "WorkerErrorInfo",
    "failure_facts",
    "format_failure_summary",
    "ordered_failures",
    "read_error_file",
    "root_cause",
]

_MAX_RAW_CHARS = 4000


@dataclass(frozen=True)
class WorkerErrorInfo:
    """What a worker's error file says.

    Attributes:
        message: the error, e.g. ``"ValueError: bad lr"``; for an unreadable file, a sentence
            that says so.
        traceback: the Python traceback of the failure, when the file has one.
        timestamp: when the worker recorded the error, epoch seconds, when the file has it.
        raw: the file's text when it could not be parsed (cut to a few thousand characters).
    """

    message: str
    traceback: str | None = None
    timestamp: float | None = None
    raw: str | None = None

    @property
    def is_malformed(self) -> bool:
        """Whether the file was not in the error-file format."""
        return self.raw is not None


def _as_float(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _parse_error(data: Any) -> WorkerErrorInfo | None:
    if not isinstance(data, dict):
        return None
    outer = data.get("message")
    if isinstance(outer, str):
        return WorkerErrorInfo(message=outer)
    if not isinstance(outer, dict):
        return None
    message = outer.get("message")
    if not isinstance(message, str):
        return None
    extra = outer.get("extraInfo")
    traceback: str | None = None
    timestamp: float | None = None
    if isinstance(extra, dict):
        callstack = extra.get("py_callstack")
        traceback = callstack if isinstance(callstack, str) else None
        timestamp = _as_float(extra.get("timestamp"))
    return WorkerErrorInfo(message=message, traceback=traceback, timestamp=timestamp)


def read_error_file(path: Path | str) -> WorkerErrorInfo | None:
    """Read a worker's error file.

    Args:
        path: the worker's TORCHELASTIC_ERROR_FILE.

    Returns:
        The error, or None when the file does not exist (the worker wrote none). A file that
        exists but is not in the error-file format gives an info with ``raw`` set.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return WorkerErrorInfo(message=f"cannot read error file {path}: {exc}", raw="")
    text = data.decode("utf-8", errors="replace")
    try:
        info = _parse_error(json.loads(text))
    except ValueError:
        info = None
    if info is not None:
        return info
    return WorkerErrorInfo(
        message=f"malformed error file {path}",
        raw=text[:_MAX_RAW_CHARS],
    )


@dataclass(frozen=True)
class FailureRecord:
    """One failed worker.

    Attributes:
        local_rank: its rank on its node.
        global_rank: its rank in the job.
        role: its role name.
        pid: its process id.
        exitcode: its exit status, or ``-signum`` when a signal killed it.
        timestamp: when it failed, epoch seconds.
        host: the node it ran on.
        error_file: its TORCHELASTIC_ERROR_FILE, or None.
        log_dir: the directory of its logs, or None.
        error: what its error file says, or None when it wrote none.
        stacks_file: its Python stacks as the agent took them (``stacks.txt``), or None.
    """

    local_rank: int
    global_rank: int
    role: str
    pid: int
    exitcode: int
    timestamp: float
    host: str
    error_file: Path | None
    log_dir: Path | None
    error: WorkerErrorInfo | None
    stacks_file: Path | None = None

    @property
    def signal_name(self) -> str | None:
        """The name of the signal that killed the worker (``"SIGKILL"``), or None if it exited."""
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    @property
    def how(self) -> str:
        """How it ended, in words: ``exit code 1`` or ``killed by SIGKILL (signal 9)``."""
        name = self.signal_name
        if name is None:
            return f"exit code {self.exitcode}"
        return f"killed by {name} (signal {-self.exitcode})"

    @property
    def time_text(self) -> str:
        """The failure time as a local ISO-8601 timestamp."""
        return (
            datetime.datetime.fromtimestamp(self.timestamp)
            .astimezone()
            .isoformat(timespec="milliseconds")
        )


def root_cause(failures: Sequence[FailureRecord]) -> FailureRecord | None:
    """Return the earliest failure (ties: lowest global rank), or None for no failures."""
    if not failures:
        return None
    return min(failures, key=lambda f: (f.timestamp, f.global_rank))


def ordered_failures(failures: Sequence[FailureRecord]) -> list[FailureRecord]:
    """Return the failures root cause first, then the others by time and rank."""
    first = root_cause(failures)
    rest = sorted(
        (f for f in failures if f is not first), key=lambda f: (f.timestamp, f.global_rank)
    )
    return ([first] if first is not None else []) + rest


def _error_text(failure: FailureRecord) -> str:
    if failure.error is None:
        return "<no error file: the worker wrote none (see its stderr)>"
    return failure.error.message


def failure_facts(failure: FailureRecord) -> list[tuple[str, str]]:
    """Return the (label, value) lines that describe one failure, in display order."""
    facts = [
        ("rank", f"{failure.global_rank} (local_rank {failure.local_rank}, role {failure.role})"),
        ("exit", failure.how),
        ("time", failure.time_text),
        ("host", failure.host),
        ("pid", str(failure.pid)),
        ("error", _error_text(failure)),
    ]
    if failure.error_file is not None:
        facts.append(("error file", str(failure.error_file)))
    if failure.log_dir is not None:
        facts.append(("logs", str(failure.log_dir)))
    if failure.stacks_file is not None:
        facts.append(("stacks", str(failure.stacks_file)))
    return facts


def format_failure_summary(run_id: str, failures: Sequence[FailureRecord]) -> str:
    """The failure summary as plain text, for logs and non-terminals.

    Args:
        run_id: the job's run id.
        failures: the failed workers (any order).

    Returns:
        The summary: the root cause first, then every other failure; ends with a newline.
    """
    ordered = ordered_failures(failures)
    lines = [f"run {run_id!r} failed: {len(ordered)} worker(s) failed"]
    for index, failure in enumerate(ordered):
        title = "root cause (first failure)" if index == 0 else f"failure {index + 1}"
        lines.append(f"[{title}] rank {failure.global_rank}")
        for key, value in failure_facts(failure):
            lines.append(f"  {key + ':':<12}{value}")
        if failure.error is not None:
            detail = failure.error.traceback or failure.error.raw
            if detail:
                label = "traceback" if failure.error.traceback else "raw error file"
                lines.append(f"  {label}:")
                lines.extend(f"    {line}" for line in detail.rstrip("\n").splitlines())
    return "\n".join(lines) + "\n"
