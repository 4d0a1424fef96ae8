"""elastic-run's ``sitecustomize`` for cold Python workers: arm the optimizer-step beats, leave.

Python imports this at start-up because the agent put this folder first on the worker's
``PYTHONPATH``. Before the script runs it:

1. takes this folder off ``sys.path`` (and ``sys.path_importer_cache``) and restores the
   worker's ``PYTHONPATH`` in ``os.environ`` to what it was (unset or empty as it was; the
   agent's ``ELASTIC_RUN_EMPTY_PYTHONPATH`` says it was empty, and is removed too), so the
   script and its children see the path and environment a plain ``python -u script`` gets;
2. arms :func:`elastic_run.worker.auto_progress.install_when_torch_optim_loads` (nothing imported of
   torch) and :func:`elastic_run.worker.exit_guard.arm` (its exit handler, which runs last);
3. imports the next ``sitecustomize`` on the path (the environment's own), which then stands in
   ``sys.modules`` as it would have; when there is none, this module stays there until the
   script's first import and is then removed.

``/proc/self/environ`` (the process's environment block, which ``ps`` and psutil read) is
rewritten to match (:func:`_tidy_proc_environ`). What a script could still notice:
``sys.modules`` holds ``elastic_run``, ``elastic_run.worker.auto_progress`` and
``elastic_run.worker.exit_guard``; :mod:`atexit` holds one handler; ``sys.meta_path`` starts with the
waiting finder until torch's optimizer module is imported; and torch's global optimizer hook
registries hold two hooks.

Errors never stop the worker: anything that goes wrong here is said in one line on stderr and
the script runs without automatic beats.
"""

from __future__ import annotations

import os
import sys

__all__ = ["start"]


def _leave_path() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for index, entry in enumerate(sys.path):
        if os.path.abspath(entry or os.curdir) == here:
            del sys.path[index]
            break
    sys.path_importer_cache.pop(here, None)
    was_empty = os.environ.pop("ELASTIC_RUN_EMPTY_PYTHONPATH", None) == "1"
    value = os.environ.get("PYTHONPATH")
    if value is None:
        return
    head, sep, rest = value.partition(os.pathsep)
    if os.path.abspath(head or os.curdir) != here:
        return
    if sep or was_empty:
        os.environ["PYTHONPATH"] = rest
    else:
        del os.environ["PYTHONPATH"]
    _tidy_proc_environ(value, rest if sep or was_empty else None)


def _tidy_proc_environ(started: str, restored: str | None) -> None:
    """Make ``/proc/self/environ`` show the restored ``PYTHONPATH`` too.

    The agent put ``PYTHONPATH`` (and ``ELASTIC_RUN_EMPTY_PYTHONPATH``) last in the worker's
    environment block, so rewriting those bytes moves no other variable (libc and native
    libraries may hold pointers into the block; ``os.environ`` already points libc's
    ``PYTHONPATH`` elsewhere). Written through ``/proc/self/mem``; when that is not possible
    the block keeps what the process was started with.
    """
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            area = mem.read(end - start)
            found = (b"\0" + area).find(b"\0PYTHONPATH=" + os.fsencode(started) + b"\0")
            if found < 0:
                return
            tail = area[found:]
            ours = (b"PYTHONPATH=", b"ELASTIC_RUN_EMPTY_PYTHONPATH=")
            if not all(item.startswith(ours) for item in tail.split(b"\0") if item):
                return  # something else follows: leave the block as it is
            text = b"" if restored is None else b"PYTHONPATH=" + os.fsencode(restored) + b"\0"
            mem.seek(start + found)
            mem.write(text.ljust(len(tail), b"\0"))
    except (OSError, ValueError, IndexError):
        pass


def _arm(me: object) -> None:
    try:
        from elastic_run.worker.exit_guard import arm

        arm()
    except Exception as exc:  # an interpreter without elastic_run, or a broken install
        print(f"elastic_run: the exit guard is off: {type(exc).__name__}: {exc}", file=sys.stderr)
    try:
        from types import ModuleType

        from elastic_run.worker.auto_progress import install_when_torch_optim_loads

        install_when_torch_optim_loads(me if isinstance(me, ModuleType) else None)
    except Exception as exc:  # an interpreter without elastic_run, or a broken install
        print(
            f"elastic_run: automatic progress beats are off: {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )


def _chain(me: object) -> None:
    """Import the environment's own sitecustomize, as if this one were not there."""
    sys.modules.pop("sitecustomize", None)
    try:
        __import__("sitecustomize")  # the next one on the path
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        # None of its own: Python's import of this module expects to find it in sys.modules.
        sys.modules["sitecustomize"] = me  # type: ignore[assignment]


def start() -> None:
    """Leave the path, arm the optimizer hooks, chain to the environment's own sitecustomize.

    Run once, when Python imports this module as ``sitecustomize`` at start-up.
    """
    me = sys.modules.get(__name__)
    _leave_path()
    _arm(me)
    _chain(me)


if __name__ == "sitecustomize":
    start()
