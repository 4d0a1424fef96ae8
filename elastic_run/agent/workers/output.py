"""Where a worker's stdout and stderr go: files, the console, or both.

This is torchrun's ``--redirects`` / ``--tee`` / ``--local-ranks-filter``. As in torchrun, a stream
that is only shown on the console passes through unchanged (no prefix, the worker's bytes as
written, so ``elastic-run ... | jq`` works), and a teed stream's console lines carry a prefix (torchrun's ``[default0]:``, or what
``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` makes of it; the caller chooses). Lines of a teed stream
that contain one of the duplicate filters' strings also go to a shared file (torchrun's
``--duplicate-stdout-filters`` / ``--duplicate-stderr-filters``), prefixed the same way:

=====================  ==========================  ====================================
stream is ...          rank shown on the console   rank filtered out of the console
=====================  ==========================  ====================================
redirected             file only                   file only
teed (redirected too)  file and console            file only
neither                console only                discarded
=====================  ==========================  ====================================

As in torchrun, no ``stdout.log`` / ``stderr.log`` is written for a stream that is neither
redirected nor teed, even when a log directory is set.

Invariants:
- A file-only stream is the worker's own file descriptor: the kernel writes it, so nothing is lost
  when the worker is killed and no thread of ours is on the path.
- A stream that reaches the console goes through a pipe and one reader thread, which drains it to
  EOF (so the last lines of a killed worker still arrive) and hands the console only whole lines
  (a prefixed line longer than ``_MAX_PARTIAL_BYTES`` is cut into prefixed pieces; an
  unprefixed one is passed on in pieces without a newline of ours, at a character boundary, so
  its bytes reach the console as written), under one process-wide lock: lines
  of different ranks never interleave mid-line. (Under torchrun the workers share the console's
  descriptor, and ``python -u`` writes a line's text and its newline in two calls, so two ranks'
  lines can be cut into each other: ``| jq`` then fails.) An unprefixed partial line (a progress
  bar, a prompt) is passed on as it is once its stream has been quiet for
  ``_PARTIAL_FLUSH_S``, so it shows without waiting for its newline.
- The console sink is replaceable (:func:`set_console_sink`), so a live view can print above its
  panel; by default it writes to the agent's ``sys.stdout`` / ``sys.stderr``.
"""

from __future__ import annotations

import enum
import logging
import os
import select
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from elastic_run.agent.config import Std

__all__ = [
    "ConsoleSink",
    "LineFilter",
    "StreamName",
    "StreamPlan",
    "WorkerOutput",
    "plan_stream",
    "set_console_sink",
    "write_console",
]

logger = logging.getLogger(__name__)

_READ_CHUNK_BYTES = 65536
_MAX_PARTIAL_BYTES = 65536
_PARTIAL_FLUSH_S = 0.05


def _utf8_boundary(data: bytes) -> int:
    """The length of ``data``'s longest prefix that does not end inside a UTF-8 character."""
    end = len(data)
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: its lead is further back
        if byte & 0x80 == 0:
            return end  # ASCII
        needed = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return end if back >= needed else end - back
    return end  # not UTF-8 there: pass it on as it is


class StreamName(str, enum.Enum):
    """One of a worker's two output streams."""

    STDOUT = "stdout"
    STDERR = "stderr"


ConsoleSink = Callable[[StreamName, str], None]
"""Receives console text: the stream it came from, and one or more whole lines."""


def _default_sink(stream: StreamName, text: str) -> None:
    target = sys.stdout if stream is StreamName.STDOUT else sys.stderr
    target.write(text)
    target.flush()


_console_lock = threading.Lock()
_console_sink: ConsoleSink = _default_sink


def set_console_sink(sink: ConsoleSink | None) -> None:
    """Send workers' console lines to ``sink`` instead of ``sys.stdout`` / ``sys.stderr``.

    Args:
        sink: called with the stream and a block of whole lines (each ending in a newline; a
            teed stream's lines carry their prefix), under the console lock, from reader threads.
            ``None`` restores the default sink.
    """
    global _console_sink
    with _console_lock:
        _console_sink = sink if sink is not None else _default_sink


def write_console(stream: StreamName, text: str) -> None:
    """Write ``text`` to the console sink under the console lock.

    The agent may use this for its own lines so that they never cut into a worker's line.

    Args:
        stream: which console stream the text belongs to.
        text: whole lines, each ending in a newline.
    """
    with _console_lock:
        _console_sink(stream, text)


class LineFilter:
    """Appends the lines that contain any of ``needles`` to one file shared by every worker.

    torchrun's ``--duplicate-stdout-filters`` / ``--duplicate-stderr-filters``: the file is
    ``attempt_<n>/filtered_stdout.log`` (or ``filtered_stderr.log``), created empty at once.

    Args:
        needles: the strings; a line matches when it contains one of them.
        path: the file.

    Raises:
        OSError: the file cannot be created.
    """

    def __init__(self, needles: tuple[str, ...], path: Path) -> None:
        self.needles = needles
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")

    def write_matching(self, lines: list[str]) -> None:
        """Append the matching lines (each ending in a newline, already prefixed)."""
        matching = [line for line in lines if any(n in line for n in self.needles)]
        if not matching:
            return
        with self._lock, open(self.path, "a", encoding="utf-8", errors="replace") as f:
            f.writelines(matching)


@dataclass(frozen=True)
class StreamPlan:
    """How one stream of one worker is handled.

    Attributes:
        to_file: the stream is written to ``file_path``.
        to_console: the stream is shown on the console.
        file_path: the log file, or None when the stream has no file.
    """

    to_file: bool
    to_console: bool
    file_path: Path | None

    @property
    def needs_pipe(self) -> bool:
        """Whether a reader thread must sit between the worker and its destinations."""
        return self.to_console

    @property
    def is_teed(self) -> bool:
        """Whether the stream goes to its file and to the console (its lines get the prefix)."""
        return self.to_file and self.to_console


def plan_stream(
    stream: StreamName,
    *,
    redirect: Std,
    tee: Std,
    show_on_console: bool,
    log_dir: Path | None,
) -> StreamPlan:
    """Decide where one stream of a worker goes (see the module's table).

    Args:
        stream: the stream.
        redirect: the streams that go to files only.
        tee: the streams that go to files and the console.
        show_on_console: False when --local-ranks-filter hides this rank.
        log_dir: the worker's log directory, or None when there is none.

    Returns:
        The plan for the stream.

    Raises:
        ValueError: the stream is redirected or teed but there is no log directory.
    """
    flag = Std.OUT if stream is StreamName.STDOUT else Std.ERR
    # As torchrun: a teed stream is redirected to its file and tailed to the console, whether
    # or not --redirects names it too (`-r 3 -t 3` shows both streams, prefixed).
    teed = bool(tee & flag)
    redirected = bool(redirect & flag) and not teed
    to_file = redirected or teed
    if to_file and log_dir is None:
        raise ValueError(f"{stream.value} is redirected or teed but the worker has no log dir")
    file_path = log_dir / f"{stream.value}.log" if to_file and log_dir is not None else None
    to_console = show_on_console and not redirected
    return StreamPlan(to_file=to_file, to_console=to_console, file_path=file_path)


class _LineForwarder:
    """Reads one pipe to EOF; writes raw bytes to a file and prefixed whole lines to the console."""

    def __init__(
        self,
        stream: StreamName,
        read_fd: int,
        prefix: str,
        file: IO[bytes] | None,
        duplicate: LineFilter | None = None,
        name: str = "",
    ) -> None:
        self._stream = stream
        self._read_fd = read_fd
        self._prefix = prefix
        self._file = file
        self._duplicate = duplicate
        self._partial = b""
        self._started = False
        self._thread = threading.Thread(
            target=self._run, name=f"output-{name}-{stream.value}", daemon=True
        )

    def start(self) -> None:
        self._started = True
        self._thread.start()

    def join(self, timeout_s: float) -> bool:
        """Wait for EOF; return whether the thread finished."""
        if not self._started:
            # Never started (the spawn failed): nobody else owns the read end.
            if self._read_fd >= 0:
                os.close(self._read_fd)
                self._read_fd = -1
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            while True:
                if self._partial and not self._prefix and not self._is_readable(_PARTIAL_FLUSH_S):
                    # Quiet: show the partial line as it is (a character cut by the pipe waits).
                    cut = _utf8_boundary(self._partial)
                    if cut:
                        self._emit_raw(self._partial[:cut])
                        self._partial = self._partial[cut:]
                        continue
                try:
                    chunk = os.read(self._read_fd, _READ_CHUNK_BYTES)
                except InterruptedError:
                    continue
                except OSError as exc:
                    logger.warning("reading worker %s failed: %s", self._stream.value, exc)
                    break
                if not chunk:
                    break
                self._handle(chunk)
            if self._partial:  # the last line had no newline
                if self._prefix:
                    self._emit([self._partial])
                else:
                    self._emit_raw(self._partial)
                self._partial = b""
        finally:
            os.close(self._read_fd)
            if self._file is not None:
                self._file.flush()

    def _is_readable(self, timeout_s: float) -> bool:
        try:
            readable, _, _ = select.select([self._read_fd], [], [], timeout_s)
        except InterruptedError:
            return True
        return bool(readable)

    def _emit_raw(self, data: bytes) -> None:
        try:
            write_console(self._stream, data.decode("utf-8", errors="replace"))
        except Exception:
            logger.exception("the console sink failed; worker output dropped from the console")

    def _handle(self, chunk: bytes) -> None:
        if self._file is not None:
            self._file.write(chunk)
            self._file.flush()
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        head = b""
        if len(self._partial) >= _MAX_PARTIAL_BYTES:
            if self._prefix:  # a prefixed console line: cut into prefixed pieces
                lines.append(self._partial)
                self._partial = b""
            else:  # unprefixed: passed on as written, never with a newline of ours
                cut = _utf8_boundary(self._partial)
                head, self._partial = self._partial[:cut], self._partial[cut:]
        if lines:
            self._emit(lines)
        if head:
            self._emit_raw(head)

    def _emit(self, lines: list[bytes]) -> None:
        prefix = self._prefix
        shown = [f"{prefix}{line.decode('utf-8', errors='replace')}\n" for line in lines]
        try:
            write_console(self._stream, "".join(shown))
            if self._duplicate is not None:
                self._duplicate.write_matching(shown)
        except Exception:
            # Keep draining: a reader that stops would block the worker on a full pipe.
            logger.exception("the console sink failed; worker output dropped from the console")


class WorkerOutput:
    """The output plumbing of one worker: the files and pipes handed to ``Popen``, and readers.

    Use: build it, pass :attr:`stdout` / :attr:`stderr` to ``subprocess.Popen``, call
    :meth:`after_spawn` (closes the child's ends and starts the readers), and :meth:`close` once
    the worker and its descendants are gone.
    """

    def __init__(
        self,
        *,
        global_rank: int,
        log_dir: Path | None,
        redirect: Std,
        tee: Std,
        show_on_console: bool,
        tee_prefix: str = "",
        duplicates: dict[StreamName, LineFilter] | None = None,
    ) -> None:
        """Open the worker's log files and pipes.

        Args:
            global_rank: the worker's rank (names its reader threads).
            log_dir: the directory for ``stdout.log`` / ``stderr.log``, or None.
            redirect: the streams that go to files only.
            tee: the streams that go to files and the console.
            show_on_console: False when --local-ranks-filter hides this worker.
            tee_prefix: the prefix of a teed stream's console lines (torchrun's ``[default0]:``).
            duplicates: per stream, where a teed stream's matching lines are also written.

        Raises:
            ValueError: a stream is redirected or teed without a log directory.
            OSError: a log file or pipe could not be created.
        """
        self._name = f"rank{global_rank}"
        self._prefix = tee_prefix
        self._duplicates = duplicates or {}
        self._files: list[IO[bytes]] = []
        self._child_fds: list[int] = []
        self._forwarders: list[_LineForwarder] = []
        self.stdout: int | IO[bytes]
        self.stderr: int | IO[bytes]
        self.plans = {
            stream: plan_stream(
                stream,
                redirect=redirect,
                tee=tee,
                show_on_console=show_on_console,
                log_dir=log_dir,
            )
            for stream in StreamName
        }
        try:
            if log_dir is not None and any(p.to_file for p in self.plans.values()):
                log_dir.mkdir(parents=True, exist_ok=True)
            self.stdout = self._prepare(StreamName.STDOUT)
            self.stderr = self._prepare(StreamName.STDERR)
        except BaseException:
            self.close(timeout_s=0.0)
            raise

    def _prepare(self, stream: StreamName) -> int | IO[bytes]:
        plan = self.plans[stream]
        file: IO[bytes] | None = None
        if plan.file_path is not None:
            file = open(plan.file_path, "wb")  # noqa: SIM115 - closed in close()
            self._files.append(file)
        if not plan.needs_pipe:
            return file if file is not None else subprocess.DEVNULL
        read_fd, write_fd = os.pipe()
        self._child_fds.append(write_fd)
        teed = plan.is_teed
        self._forwarders.append(
            _LineForwarder(
                stream,
                read_fd,
                self._prefix if teed else "",
                file,
                self._duplicates.get(stream) if teed else None,
                self._name,
            )
        )
        return write_fd

    def after_spawn(self) -> None:
        """Close the worker's ends of the pipes in the agent and start the reader threads."""
        for fd in self._child_fds:
            os.close(fd)
        self._child_fds.clear()
        for forwarder in self._forwarders:
            forwarder.start()

    def close(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the readers to drain their pipes, then close the files.

        Call it after the worker and every process that inherited its pipes have exited.

        Args:
            timeout_s: how long to wait for each reader thread.

        Returns:
            True when every reader drained its pipe; False when one is still blocked (a process
            that holds the pipe is alive), in which case its file stays open for it.
        """
        for fd in self._child_fds:
            os.close(fd)
        self._child_fds.clear()
        drained = all(forwarder.join(timeout_s) for forwarder in self._forwarders)
        if drained:
            for file in self._files:
                file.close()
            self._files.clear()
        else:
            for file in self._files:
                file.flush()
        return drained
