"""A worker's Python stacks as py-spy reports them: parsed, summarised, written out. Pure.

``py-spy dump --pid P --json`` lists every thread of the process with its frames, innermost
first. From that this module says where the worker is (:class:`Where`): the innermost frame's
function (what it is blocked in: ``all_reduce``, ``Event.wait``), the innermost frame of the
user's own code (``train.py:88``: not the standard library, not an installed package, not
torch, not elastic-run), and whether the main thread is inside torch.distributed (a rank
waiting in a collective for a peer) or elsewhere (the rank that keeps the others waiting).

No process or file here: :mod:`elastic_run.agent.progress.stacks` runs py-spy and writes the text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Frame",
    "StackReport",
    "ThreadStack",
    "Where",
    "format_stacks",
    "is_library_file",
    "parse_py_spy_json",
]

_LIBRARY_MARKS = ("/site-packages/", "/dist-packages/", "/lib/python3", "/torch/")
_COLLECTIVE_MARKS = ("/torch/distributed/", "/torch/nn/parallel/")
_BACKWARD_MARKS = ("/torch/autograd/", "/torch/_tensor.py")


@dataclass(frozen=True)
class Frame:
    """One Python frame.

    Attributes:
        function: the function's name as py-spy gives it (``Event.wait``, ``<module>``).
        filename: the file's path.
        line: the line number (0: unknown).
    """

    function: str
    filename: str
    line: int

    @property
    def short_file(self) -> str:
        """The file's last path component."""
        return self.filename.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class ThreadStack:
    """One thread's stack.

    Attributes:
        name: the thread's Python name (``MainThread``), or ``""``.
        os_thread_id: the kernel's thread id (the pid for the main thread).
        active: py-spy saw it running (not idle).
        frames: innermost first.
    """

    name: str
    os_thread_id: int
    active: bool
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class Where:
    """Where a worker's main thread is.

    Attributes:
        function: the innermost frame's function: what it is blocked in.
        user_frame: the innermost frame of the user's code, or None when none is on the stack.
        in_collective: the main thread is inside torch.distributed (or in a backward pass,
            where DDP reduces gradients): it waits for its peers.
    """

    function: str
    user_frame: Frame | None
    in_collective: bool

    def text(self) -> str:
        """``all_reduce at train.py:88`` (or the function alone when no user frame is seen)."""
        if self.user_frame is None:
            return self.function
        return f"{self.function} at {self.user_frame.short_file}:{self.user_frame.line}"


def is_library_file(filename: str, library_dirs: Sequence[str] = ()) -> bool:
    """Whether ``filename`` is library code (stdlib, installed packages, torch, ours).

    Args:
        filename: a frame's file.
        library_dirs: more directories that are not the user's (elastic-run's own).
    """
    if not filename or filename.startswith("<"):
        return True
    if any(mark in filename for mark in _LIBRARY_MARKS):
        return True
    return any(filename.startswith(d.rstrip("/") + "/") for d in library_dirs if d)


@dataclass(frozen=True)
class StackReport:
    """The stacks of one process, or why they could not be taken.

    Attributes:
        pid: the process.
        threads: every thread (empty when ``error`` is set).
        error: one line saying why no stacks were taken, or None.
    """

    pid: int
    threads: tuple[ThreadStack, ...] = ()
    error: str | None = None

    @property
    def main_thread(self) -> ThreadStack | None:
        """The main thread (its thread id is the pid), else the first thread."""
        for thread in self.threads:
            if thread.os_thread_id == self.pid or thread.name == "MainThread":
                return thread
        return self.threads[0] if self.threads else None

    def where(self, library_dirs: Sequence[str] = ()) -> Where | None:
        """Where the main thread is; None when there are no stacks.

        Args:
            library_dirs: directories that are not user code, beyond the usual ones.
        """
        main = self.main_thread
        if main is None or not main.frames:
            return None
        user = next((f for f in main.frames if not is_library_file(f.filename, library_dirs)), None)
        in_collective = any(
            mark in f.filename for f in main.frames for mark in _COLLECTIVE_MARKS
        ) or any(mark in main.frames[0].filename for mark in _BACKWARD_MARKS)
        return Where(main.frames[0].function, user, in_collective)


def parse_py_spy_json(pid: int, text: str) -> StackReport:
    """Parse ``py-spy dump --json`` output.

    Args:
        pid: the process it was taken of.
        text: py-spy's standard output.

    Returns:
        The report.

    Raises:
        ValueError: the text is not py-spy's JSON list of threads.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"py-spy's output is not JSON: {exc}") from None
    if not isinstance(data, list):
        raise ValueError("py-spy's output is not a list of threads")
    threads = []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("frames"), list):
            raise ValueError("py-spy's output has a thread without frames")
        frames = tuple(
            Frame(
                str(f.get("name", "?")),
                str(f.get("filename", "")),
                int(f.get("line") or 0),
            )
            for f in item["frames"]
            if isinstance(f, dict)
        )
        threads.append(
            ThreadStack(
                name=str(item.get("thread_name") or ""),
                os_thread_id=int(item.get("os_thread_id") or 0),
                active=bool(item.get("active")),
                frames=frames,
            )
        )
    # The main thread first: it is the one people read.
    main = pid
    threads.sort(key=lambda t: t.os_thread_id != main and t.name != "MainThread")
    return StackReport(pid, tuple(threads))


def format_stacks(report: StackReport, title: str) -> str:
    """The text of ``stacks.txt``: a title line, then each thread's frames, innermost first.

    Args:
        report: the stacks (or the error).
        title: the first line (who, when, why).
    """
    lines = [title]
    if report.error is not None:
        lines.append(f"no stacks: {report.error}")
        return "\n".join(lines) + "\n"
    for thread in report.threads:
        state = "active" if thread.active else "idle"
        name = f' "{thread.name}"' if thread.name else ""
        lines.append("")
        lines.append(f"Thread {thread.os_thread_id} ({state}){name}")
        for frame in thread.frames:
            lines.append(f"    {frame.function} ({frame.filename}:{frame.line})")
    return "\n".join(lines) + "\n"
