"""A worker's exit waits for torch's gloo threads to put down their last work.

torch's gloo process group runs each collective on a ``pt_gloo_runloop`` thread, which drops
its reference to the finished work only after the caller has seen the result. That work holds
the caller's thread-local state, Python objects included. When the caller's interpreter has
already begun to finalize by then (the script returned right after its last collective or
``destroy_process_group``, which does not stop gloo's threads), the drop takes the GIL from a
thread the interpreter no longer lets in: CPython ends that thread with ``pthread_exit``, which
unwinds through a ``noexcept`` destructor, and the worker dies of ``std::terminate``
(``terminate called without an active exception``, SIGABRT) after its script succeeded. It is
rare (two gloo ranks exiting under a stack sampler, which pauses their threads at random as a
busy host does: 1 abort in 17 runs once, none in 40 another time; about once per full test run
on two loaded cores) and it is torch's, under torchrun as well.

:func:`arm` registers :func:`wait_for_idle_threads` with :mod:`atexit` at the worker's start,
so it runs last, after the script's own exit handlers and before finalization: when
``torch.distributed`` was imported, it waits until every gloo run-loop thread is asleep (state
``S`` in ``/proc/self/task/<tid>/stat``, seen :data:`SETTLED_LOOKS` times in a row), at most
:data:`LIMIT_S` seconds. A thread asleep has put its work down; one blocked in a collective that
never ends is asleep too, so the wait never holds an exit for longer than the looks. Elsewhere
(no torch.distributed, no such thread, no ``/proc``) it returns at once.

The site hook (:mod:`elastic_run.worker.site_hook.sitecustomize`) and the warm zygote arm it in every
Python worker; ``--no-auto-progress`` leaves cold workers without the site hook, and so without
this wait.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from collections.abc import Iterable

from elastic_run import clock

__all__ = [
    "GLOO_THREADS",
    "LIMIT_S",
    "LOOK_S",
    "SETTLED_LOOKS",
    "arm",
    "threads_named",
    "wait_for_idle_threads",
]

GLOO_THREADS = ("pt_gloo_runloop",)
"""The ``comm`` names of the threads waited for."""

LOOK_S = 0.002
"""The pause between two looks at the threads' states."""

SETTLED_LOOKS = 3
"""How many looks in a row must find every thread asleep."""

LIMIT_S = 2.0
"""The longest an exit waits."""

_TASKS = "/proc/self/task"
_armed = False


def threads_named(names: Iterable[str]) -> list[str]:
    """The ids of this process's threads whose ``comm`` is one of ``names``."""
    wanted = set(names)
    found = []
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return []
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/comm", encoding="utf-8", errors="replace") as comm:
                if comm.read().strip() in wanted:
                    found.append(tid)
        except OSError:
            continue  # the thread ended
    return found


def _asleep(tid: str) -> bool:
    """Whether the thread sleeps (``S``) or has ended; running, runnable or stopped is awake."""
    try:
        with open(f"{_TASKS}/{tid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state == b"S"


def wait_for_idle_threads(
    names: Iterable[str] = GLOO_THREADS,
    *,
    limit_s: float = LIMIT_S,
    needs_module: str | None = "torch.distributed",
) -> bool:
    """Wait until every thread named ``names`` is asleep; whether they all were by the limit.

    Args:
        names: the threads' ``comm`` names.
        limit_s: the longest wait.
        needs_module: return at once (True) unless this module was imported; None looks always.
    """
    if needs_module is not None and needs_module not in sys.modules:
        return True
    tids = threads_named(names)
    if not tids:
        return True
    deadline = time.monotonic() + limit_s
    settled = 0
    while True:
        settled = settled + 1 if all(_asleep(tid) for tid in tids) else 0
        if settled >= SETTLED_LOOKS:
            return True
        if time.monotonic() >= deadline:
            return False
        clock.sleep(LOOK_S)  # a /proc poll: nothing to wait on


def _at_exit() -> None:
    try:
        wait_for_idle_threads()
    except Exception:  # an exit never fails for this wait
        pass


def arm() -> None:
    """Register the wait with :mod:`atexit` (once per process; the first handler runs last)."""
    global _armed
    if not _armed:
        atexit.register(_at_exit)
        _armed = True
