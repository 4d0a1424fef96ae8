"""Worker failures: the error files workers write, and the summary the launcher prints.

A worker decorated with torch's ``@record`` (or ours) writes, at ``TORCHELASTIC_ERROR_FILE``::

    {"message": {"message": "<ExcType>: <text>",
                 "extraInfo": {"py_callstack": "<traceback>", "timestamp": "<epoch s>"}}}

:func:`read_error_file` reads it and never raises on a bad file: a file that is not that JSON is
kept as raw text. The summary names the earliest failure as the root cause, then lists every
failed rank with its exit code or signal, time, pid, host, error and log location.

:class:`ProcessFailure` is torch's record of one failed process (``local_rank``, ``pid``,
``exitcode``, ``error_file``, and what it derives from the file: ``error_file_data``,
``message``, ``timestamp``); :class:`FailureRecord`, what the agent reports in
``RunResult.failures``, is one, with the rank, host and log location added.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_run.worker.error_handler import NOT_AVAILABLE

__all__ = [
    "NOT_AVAILABLE",
    "FailureRecord",
    "ProcessFailure",
    "WorkerErrorInfo",
    "failure_facts",
    "format_failure_summary",
    "load_error_file",
    "ordered_failures",
    "read_error_file",
    "root_cause",
]

_MAX_RAW_CHARS = 4000
_NO_ERROR_DATA = "<NONE>"
# What torch adds to ``error_file_data`` of a process that exited (not by a signal) and said
# nothing: no error file, or one without a message.
_SILENT_EXIT_TRAITS = {"category": "system_terminated_error", "retryability": "False"}


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
    if isinstance(outer, str):  # the flat form: {"message": "...", "timestamp": ...}
        return WorkerErrorInfo(message=outer, timestamp=_as_float(data.get("timestamp")))
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
    return load_error_file(path)[0]


def load_error_file(path: Path | str) -> tuple[WorkerErrorInfo | None, dict[str, Any] | None]:
    """Read a worker's error file once: what it says, and its JSON object as written.

    Args:
        path: the worker's TORCHELASTIC_ERROR_FILE.

    Returns:
        ``(info, data)``: ``info`` as :func:`read_error_file` returns it; ``data`` the file's
        JSON object, or None when there is no file or it is not a JSON object.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return WorkerErrorInfo(message=f"cannot read error file {path}: {exc}", raw=""), None
    text = raw.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    info = _parse_error(data)
    if info is not None and isinstance(data, dict):
        return info, data
    return WorkerErrorInfo(message=f"malformed error file {path}", raw=text[:_MAX_RAW_CHARS]), None


@dataclass
class ProcessFailure:
    """One failed process, as torch's ``ProcessFailure`` (its fields and what it derives).

    Built from ``(local_rank, pid, exitcode, error_file)``; the error file, when there is
    one, is read at once. Unlike torch's, a malformed error file is no error: its message
    says so.

    Attributes:
        local_rank: the process's local rank.
        pid: its process id.
        exitcode: its exit status, or ``-signum`` when a signal killed it.
        error_file: its error file, or ``"<N/A>"`` when it wrote none.
        error_file_data: the error file's JSON (``{"message": "<NONE>"}`` without one; a
            process that exited without a signal and said nothing also gets torch's
            ``errorTraits``: ``system_terminated_error``, not retryable).
        message: the file's ``message`` entry (torch's ``{"message", "extraInfo"}`` object,
            or a string), else a sentence saying how the process ended.
        timestamp: when it failed, epoch seconds: the error file's, else when this was built.
    """

    local_rank: int
    pid: int
    exitcode: int
    error_file: str
    error_file_data: dict[str, Any] = field(init=False, repr=False)
    message: Any = field(init=False)
    timestamp: float = field(init=False)

    def __post_init__(self) -> None:
        info = self._read_error_file()
        stamp = info.timestamp if info is not None else None
        self.timestamp = int(stamp) if stamp is not None else int(time.time())

    def _read_error_file(self) -> WorkerErrorInfo | None:
        """Set ``error_file`` (N/A without a file), ``error_file_data`` and ``message``."""
        info, data = (None, None)
        # as torch reads it: a path that is no regular file (empty, a folder) is no error file
        if self.error_file != NOT_AVAILABLE and os.path.isfile(self.error_file):
            info, data = load_error_file(self.error_file)
        if info is None:
            self.error_file = NOT_AVAILABLE
            self.error_file_data = {"message": _NO_ERROR_DATA}
            self.message = self._ended_text()
        elif data is None:  # there, but not in the format
            self.error_file_data = {"message": info.message}
            self.message = info.message
        else:
            self.error_file_data = data
            self.message = data["message"]
        said = info is not None and bool(self.message)
        if not self.message:  # a file without a message: described by the exit, as none is
            self.message = self._ended_text()
        if not said and self.exitcode >= 0:
            self.error_file_data["errorTraits"] = dict(_SILENT_EXIT_TRAITS)
        return info

    def _ended_text(self) -> str:
        if self.exitcode < 0:
            return f"Signal {-self.exitcode} ({self.signal_name()}) received by PID {self.pid}"
        return (
            f"exit code {self.exitcode}, no error file (decorate the entrypoint with @record "
            f"to have its exception and traceback here)"
        )

    def signal_name(self) -> str:
        """The name of the signal that killed the process (``"SIGKILL"``), else ``"<N/A>"``."""
        if self.exitcode >= 0:
            return NOT_AVAILABLE
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return NOT_AVAILABLE

    def timestamp_isoformat(self) -> str:
        """The failure time as torch writes it: local time, ``YYYY-MM-DD_HH:MM:SS``."""
        return datetime.datetime.fromtimestamp(int(self.timestamp)).isoformat(sep="_")


@dataclass
class FailureRecord(ProcessFailure):
    """One failed worker, as the agent reports it (a :class:`ProcessFailure`, with more facts).

    Attributes:
        local_rank: its rank on its node.
        pid: its process id.
        exitcode: its exit status, or ``-signum`` when a signal killed it.
        error_file: its TORCHELASTIC_ERROR_FILE, or ``"<N/A>"`` when it wrote none.
        timestamp: when it failed, epoch seconds.
        global_rank: its rank in the job.
        role: its role name.
        host: the node it ran on.
        log_dir: the directory of its logs, or None.
        error: what its error file says, or None when it wrote none.
        stacks_file: its Python stacks as the agent took them (``stacks.txt``), or None.
    """

    timestamp: float
    global_rank: int
    role: str
    host: str
    log_dir: Path | None
    error: WorkerErrorInfo | None
    stacks_file: Path | None = None

    def __post_init__(self) -> None:
        given = self.error_file
        self._read_error_file()  # the timestamp is given: the exit's, or the error file's
        self.error_file = given  # as the agent found it

    @classmethod
    def of(cls, failure: ProcessFailure, global_rank: int, role: str, host: str) -> FailureRecord:
        """The record of a plain ``ProcessFailure`` (what a torch-style agent subclass reports).

        Args:
            failure: the failure.
            global_rank: the failed worker's global rank.
            role: its role.
            host: the node it ran on.
        """
        path = failure.error_file
        return cls(
            local_rank=failure.local_rank,
            pid=failure.pid,
            exitcode=failure.exitcode,
            error_file=path,
            timestamp=failure.timestamp,
            global_rank=global_rank,
            role=role,
            host=host,
            log_dir=None,
            error=read_error_file(path) if path != NOT_AVAILABLE else None,
        )

    @property
    def how(self) -> str:
        """How it ended, in words: ``exit code 1`` or ``killed by SIGKILL (signal 9)``."""
        if self.exitcode >= 0:
            return f"exit code {self.exitcode}"
        name = self.signal_name()
        if name == NOT_AVAILABLE:
            return f"killed by signal {-self.exitcode}"
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
    if failure.error_file != NOT_AVAILABLE:
        facts.append(("error file", failure.error_file))
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
