"""torch's error recording, worker side: ``@record``, ``ErrorHandler``, ``ChildFailedError``.

A worker's ``@record``-decorated main writes its uncaught exception to the file named by
``TORCHELASTIC_ERROR_FILE``; the agent reads every failed worker's file into a
:class:`ProcessFailure` and names the one with the earliest timestamp as the root cause. A
launcher that is itself a child (a nanny process) raises :class:`ChildFailedError`, and its own
``@record`` copies the root cause's file into its own error file, so the cause travels up as is.

Names and signatures are torch's: ``record(fn, error_handler=None)``, ``ErrorHandler``
(``initialize``, ``record_exception``, ``dump_error_file``), ``get_error_handler()``,
``ChildFailedError(name, failures)`` (``get_first_failure``, ``format_msg``). torch's module
also holds ``ProcessFailure``, the agent's reading of an error file: the mirror
(``elastic_run.elastic.multiprocessing.errors``) joins the two. This module imports nothing of
the agent; the file format has one home: :func:`elastic_run.worker.write_error_file` writes it
and :mod:`elastic_run.agent.workers.failures` reads it.
"""

from __future__ import annotations

import faulthandler
import functools
import json
import logging
import os
import socket
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, Protocol, TypeVar

from elastic_run.worker.api import ERROR_FILE_ENV, write_error_data, write_error_file

__all__ = [
    "NOT_AVAILABLE",
    "ChildFailedError",
    "ChildFailure",
    "ErrorHandler",
    "get_error_handler",
    "record",
]

# What torch's failure records say for a field they do not know (an error file that is absent).
NOT_AVAILABLE = "<N/A>"

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")
_MAX_WIDTH = 60


class ChildFailure(Protocol):
    """What :class:`ChildFailedError` reads of a failed child: torch's ``ProcessFailure``'s
    fields (the agent's :class:`~elastic_run.agent.workers.failures.ProcessFailure` is one)."""

    local_rank: int
    pid: int
    exitcode: int
    error_file: str
    timestamp: int | float

    @property
    def message(self) -> Any:
        """The error file's message record, or a text when there is none."""

    def signal_name(self) -> str:
        """The name of the signal that ended the child, or ``NOT_AVAILABLE``."""

    def timestamp_isoformat(self) -> str:
        """When the child failed, ISO 8601."""


class ErrorHandler:
    """Writes a worker's exception to its error file (``TORCHELASTIC_ERROR_FILE``), as torch's.

    Without that variable nothing is written (the exception is only re-raised). Subclasses may
    override :meth:`initialize` and :meth:`record_exception`.
    """

    def _get_error_file_path(self) -> str | None:
        """The error file to write, or None to write none."""
        return os.environ.get(ERROR_FILE_ENV)

    def initialize(self) -> None:
        """Prepare to record errors: enable ``faulthandler`` (a fatal signal prints stacks)."""
        try:
            faulthandler.enable(all_threads=True)
        except (OSError, RuntimeError, ValueError) as exc:  # no usable stderr
            warnings.warn(f"cannot enable faulthandler: {exc}", stacklevel=2)

    def record_exception(self, e: BaseException) -> None:
        """Write ``e`` and its traceback to the error file (torch's format), when one is set.

        Args:
            e: the exception the worker ends with.
        """
        path = self._get_error_file_path()
        if not path:
            return
        try:
            write_error_file(path, e)
        except OSError as exc:
            print(f"cannot write the error file {path}: {exc}", file=sys.stderr)

    def override_error_code_in_rootcause_data(
        self,
        rootcause_error_file: str,
        rootcause_error: dict[str, Any],
        error_code: int = 0,
    ) -> None:
        """Set ``errorCode`` in a child's error record (a child killed by a signal cannot).

        Args:
            rootcause_error_file: where the record came from (for the log).
            rootcause_error: the record, changed in place.
            error_code: the child's exit code.
        """
        message = rootcause_error.get("message")
        if isinstance(message, dict):
            message["errorCode"] = error_code
        else:
            logger.warning(
                "the error file %s has no message object; its error code stays unset",
                rootcause_error_file,
            )

    def dump_error_file(self, rootcause_error_file: str, error_code: int = 0) -> None:
        """Copy a child's error file into this process's own error file.

        Args:
            rootcause_error_file: the root-cause child's error file.
            error_code: the child's exit code, recorded in the copy when not 0.

        Raises:
            OSError: the child's file cannot be read, or this process's cannot be written.
            ValueError: the child's file is not a JSON object.
        """
        with open(rootcause_error_file, encoding="utf-8") as f:
            record_data = json.load(f)
        if not isinstance(record_data, dict):
            raise ValueError(f"the error file {rootcause_error_file} is not a JSON object")
        if error_code:
            self.override_error_code_in_rootcause_data(
                rootcause_error_file, record_data, error_code
            )
        path = self._get_error_file_path()
        if not path:
            logger.error(
                "no error file is set for this process to copy %s into", rootcause_error_file
            )
            return
        write_error_data(path, record_data)


def get_error_handler() -> ErrorHandler:
    """Return the error handler ``record`` uses by default (torch's ``get_error_handler``)."""
    return ErrorHandler()


class ChildFailedError(Exception):
    """Child processes failed; raised by a launcher so that ``@record`` passes the cause up.

    Args:
        name: what failed (the entrypoint's name), for the message.
        failures: the failed processes by global rank (at least one).

    Raises:
        ValueError: ``failures`` is empty.
    """

    def __init__(self, name: str, failures: Mapping[int, ChildFailure]) -> None:
        if not failures:
            raise ValueError("ChildFailedError needs at least one failure")
        self.name = name
        self.failures = dict(failures)
        super().__init__(self.format_msg())

    def get_first_failure(self) -> tuple[int, ChildFailure]:
        """Return the global rank and the failure with the earliest timestamp (the root cause)."""
        rank = min(self.failures, key=lambda r: (self.failures[r].timestamp, r))
        return rank, self.failures[rank]

    def format_msg(self, boarder_delim: str = "=", section_delim: str = "-") -> str:
        """The report: every other failure, then the root cause, framed by delimiter lines.

        Args:
            boarder_delim: the character of the outer lines (torch's spelling).
            section_delim: the character of the section lines.

        Returns:
            The report, with a leading and a trailing newline.
        """
        root_rank, _ = self.get_first_failure()
        title = f"{self.name} FAILED"
        blocks = {r: _failure_block(i, r, f) for i, (r, f) in enumerate(self.failures.items())}
        others = [b for r, b in blocks.items() if r != root_rank] or ["  <NO_OTHER_FAILURES>"]
        width = max(len(line) for b in blocks.values() for line in b.splitlines())
        width = min(max(width, len(title)), _MAX_WIDTH)
        lines = [
            "",
            boarder_delim * width,
            title,
            section_delim * width,
            "Failures:",
            *others,
            section_delim * width,
            "Root Cause (first observed failure):",
            blocks[root_rank],
            boarder_delim * width,
        ]
        return "\n".join(lines)


def _failure_text(failure: ChildFailure) -> str:
    """The traceback of a failure when its error file has one, else its message."""
    message = failure.message
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        callstack = extra.get("py_callstack") if isinstance(extra, dict) else None
        text = callstack if isinstance(callstack, str) else message.get("message", NOT_AVAILABLE)
        return str(text).rstrip("\n").replace("\n", "\n  ")
    return str(message)


def _failure_block(index: int, rank: int, failure: ChildFailure) -> str:
    signame = failure.signal_name()
    host = getattr(failure, "host", None) or socket.getfqdn()
    return "\n".join(
        [
            f"[{index}]:",
            f"  time      : {failure.timestamp_isoformat()}",
            f"  host      : {host}",
            f"  rank      : {rank} (local_rank: {failure.local_rank})",
            f"  exitcode  : {failure.exitcode} (pid: {failure.pid})"
            + (f" ({signame})" if signame != NOT_AVAILABLE else ""),
            f"  error_file: {failure.error_file}",
            f"  traceback : {_failure_text(failure)}",
        ]
    )


def record(
    fn: Callable[_P, _R], error_handler: ErrorHandler | None = None
) -> Callable[_P, _R | None]:
    """Decorate a process's main so that its failure is written to its error file (torch's).

    An ``Exception`` is recorded by ``error_handler`` and re-raised; a
    :class:`ChildFailedError` copies its root cause's error file into this process's (so a
    launcher reports its worker's error as its own) and is re-raised; ``SystemExit(0)`` returns
    None. Use it once per process, on the top-level function.

    Args:
        fn: the function to wrap, usually ``main``.
        error_handler: the handler (default: :func:`get_error_handler`'s).

    Returns:
        The wrapped function.
    """
    handler = error_handler if error_handler is not None else get_error_handler()

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R | None:
        handler.initialize()
        try:
            return fn(*args, **kwargs)
        except SystemExit as exc:
            if exc.code in (0, None):
                return None
            raise
        except ChildFailedError as exc:
            rank, failure = exc.get_first_failure()
            if failure.error_file != NOT_AVAILABLE:
                handler.dump_error_file(failure.error_file, failure.exitcode)
            else:
                logger.info("rank %s failed without an error file (decorate it with @record)", rank)
            raise
        except Exception as exc:
            handler.record_exception(exc)
            raise

    return wrapper
