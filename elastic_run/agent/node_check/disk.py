"""The disk check: the log directory's disk has room for the job's logs.

One concept: read the free space (available to this user, as ``df`` shows it) of the disk that
holds the log directory, or of its nearest existing parent when the directory is not made yet
(the check makes nothing), and compare it with the bound. The read runs on a thread of its own,
waited for until the deadline: a dead network mount can block ``statvfs`` forever, and it must
block only that thread (a daemon, left behind), never the agent.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from elastic_run.agent.node_check.lines import one_line, show_bytes, show_seconds
from elastic_run.agent.node_check.result import CheckResult, CheckStatus

__all__ = ["NAME", "check_disk", "existing_parent"]

NAME = "disk"


def existing_parent(path: Path) -> Path:
    """``path`` itself when it exists, else its nearest parent that does.

    Args:
        path: the log directory (relative paths are taken from the working directory).

    Returns:
        The directory whose disk will hold ``path``.
    """
    current = Path(os.path.abspath(path))
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def check_disk(
    log_dir: Path,
    min_free_bytes: int,
    timeout_s: float,
    *,
    free_bytes: Callable[[Path], int] = lambda p: shutil.disk_usage(p).free,
    clock: Callable[[], float] = time.monotonic,
) -> CheckResult:
    """Check that the log directory's disk has at least ``min_free_bytes`` free.

    Args:
        log_dir: the job's log directory (it need not exist yet).
        min_free_bytes: the bound; 0: not checked (skip).
        timeout_s: how long the read may take.
        free_bytes: reads a directory's free bytes (``shutil.disk_usage``; injected by tests).
        clock: monotonic seconds, for the duration.

    Returns:
        ok (``120 GiB free``), fail (too little room, an unreadable disk, a read that did not
        answer in time) or skip (no bound).
    """
    start = clock()
    if min_free_bytes <= 0:
        return CheckResult(NAME, CheckStatus.SKIP, "no bound, nothing checked", 0.0)
    answer: list[tuple[Path, int | OSError]] = []

    def read() -> None:  # stat and statvfs both: either can block on a dead mount
        where = existing_parent(log_dir)
        try:
            answer.append((where, free_bytes(where)))
        except OSError as exc:
            answer.append((where, exc))

    reader = threading.Thread(target=read, name="node-check-disk", daemon=True)
    reader.start()
    reader.join(max(0.0, timeout_s))
    took = clock() - start
    if not answer:
        return CheckResult(
            NAME,
            CheckStatus.FAIL,
            f"the free space of {log_dir} did not answer within {show_seconds(timeout_s)} "
            "(a dead network mount?)",
            took,
        )
    where, free = answer[0]
    if isinstance(free, OSError):
        reason = one_line(free.strerror or str(free))
        return CheckResult(
            NAME, CheckStatus.FAIL, f"cannot read the free space of {where}: {reason}", took
        )
    if free < min_free_bytes:
        return CheckResult(
            NAME,
            CheckStatus.FAIL,
            f"the log directory's disk ({where}) has {show_bytes(free)} free, under the "
            f"{show_bytes(min_free_bytes)} the node check asks",
            took,
        )
    return CheckResult(NAME, CheckStatus.OK, f"{show_bytes(free)} free", took)
