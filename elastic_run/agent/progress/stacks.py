"""Taking workers' Python stacks from outside, with py-spy, and writing them to ``stacks.txt``.

Why py-spy: it reads a live CPython's frames through ``process_vm_readv``/ptrace with no code
in the worker (a worker stuck in C, in a collective or a deadlock cannot run a signal handler
such as ``faulthandler``'s), for every thread, in tens of milliseconds, and it is a binary wheel
on PyPI (a declared dependency). The agent is the workers' ancestor, which Yama's default
``ptrace_scope=1`` allows.

Every worker is dumped at once (one py-spy process each, in parallel), bounded by a timeout;
a dump that fails is retried once (py-spy can miss a process that is just starting). A worker
whose stacks cannot be taken (no py-spy, no permission, not Python) gets a report whose
``error`` says why in one line, and the agent goes on.
"""

from __future__ import annotations

import datetime
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from elastic_run.agent.progress.stack_report import StackReport, format_stacks, parse_py_spy_json

__all__ = ["capture_stacks", "py_spy_command", "write_stacks"]

log = logging.getLogger(__name__)

_DEFAULT_TIMEOUT_S = 10.0
_TRIES = 3


def py_spy_command() -> str | None:
    """The py-spy program: beside this interpreter (a virtual environment), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def _why(stderr: str, returncode: int) -> str:
    text = stderr.strip()
    lowered = text.lower()
    if "permission denied" in lowered or "operation not permitted" in lowered:
        return (
            "no permission to read the worker's memory (ptrace): run the agent as the workers' "
            "user and allow ptrace of descendants (kernel.yama.ptrace_scope <= 1, CAP_SYS_PTRACE "
            "in containers)"
        )
    if "no such process" in lowered:
        return "the worker exited before its stacks were taken"
    first = next((line for line in text.splitlines() if line.strip()), "")
    return first.removeprefix("Error: ") or f"py-spy exited with code {returncode}"


def capture_stacks(
    pids: Mapping[int, int], timeout_s: float = _DEFAULT_TIMEOUT_S
) -> dict[int, StackReport]:
    """Take the Python stacks of several processes at once.

    Args:
        pids: key (a local rank) -> process id.
        timeout_s: the most all the dumps may take together.

    Returns:
        key -> report (with ``error`` set where the stacks could not be taken).
    """
    command = py_spy_command()
    if command is None:
        why = "py-spy is not installed (pip install py-spy)"
        return {key: StackReport(pid, error=why) for key, pid in pids.items()}
    deadline = time.monotonic() + timeout_s
    reports: dict[int, StackReport] = {}
    todo = dict(pids)
    for _ in range(_TRIES):
        started = {
            key: subprocess.Popen(
                [command, "dump", "--pid", str(pid), "--json"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for key, pid in todo.items()
        }
        failed: dict[int, int] = {}
        for key, proc in started.items():
            pid = todo[key]
            try:
                out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                reports[key] = StackReport(pid, error=f"py-spy did not answer in {timeout_s:g} s")
                continue
            if proc.returncode == 0:
                try:
                    reports[key] = parse_py_spy_json(pid, out)
                    main = reports[key].main_thread
                    if main is not None and main.frames:
                        continue
                    # A main thread caught without a Python frame: between two states (seen
                    # under load), or really past its script (finalization); look again.
                except ValueError as exc:
                    reports[key] = StackReport(pid, error=str(exc))
            else:
                reports[key] = StackReport(pid, error=_why(err, proc.returncode))
            failed[key] = pid
        todo = failed
        if not todo or time.monotonic() >= deadline:
            break
    return reports


def write_stacks(path: Path, report: StackReport, title: str) -> bool:
    """Write ``report`` as text to ``path`` (``<attempt>/<local rank>/stacks.txt``).

    Args:
        path: the file.
        report: the stacks.
        title: what the first line says (who and why); the time is added.

    Returns:
        Whether the file was written (a failure is logged, never raised).
    """
    stamp = datetime.datetime.now().astimezone().isoformat(timespec="milliseconds")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(format_stacks(report, f"# {title} (taken {stamp})"), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot write %s: %s", path, exc.strerror or exc)
        return False
    return True
