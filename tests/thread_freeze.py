"""Freeze one thread of another process for real, with ptrace: the rest of it keeps running.

Used to make an agent's main loop stall (a hang in a syscall, as a stuck store read or a
deadlock would) while its health server and rendezvous threads go on, without any test seam in
the agent. Root (or CAP_SYS_PTRACE) is needed; the tests run as root here.

A thread is only left frozen when it is stopped inside a blocking system call (select, poll,
a futex wait, a sleep): CPython releases the GIL around those, so the process's other Python
threads keep running. A thread caught running Python code (holding the GIL) is let go and
caught again a moment later.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager

from tests.helpers import wait_until

__all__ = ["frozen_thread"]

_PTRACE_DETACH = 17
_PTRACE_SEIZE = 0x4206
_PTRACE_INTERRUPT = 0x4207
_WALL = 0x40000000
# x86_64 numbers of the blocking calls CPython makes with the GIL released.
_BLOCKING_SYSCALLS = {7, 23, 35, 202, 230, 232, 270, 271, 281}  # poll select nanosleep futex
# clock_nanosleep epoll_wait pselect6 ppoll epoll_pwait

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


def _ptrace(request: int, tid: int) -> None:
    if _libc.ptrace(request, tid, None, None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"ptrace({request:#x}, {tid}): {os.strerror(errno)}")


def _syscall(pid: int, tid: int) -> int | None:
    try:
        text = open(f"/proc/{pid}/task/{tid}/syscall").read().split()
    except OSError:
        return None
    return int(text[0]) if text and text[0].lstrip("-").isdigit() else None


def _try_freeze(pid: int, tid: int) -> bool:
    _ptrace(_PTRACE_SEIZE, tid)
    _ptrace(_PTRACE_INTERRUPT, tid)
    os.waitpid(tid, _WALL)
    if _syscall(pid, tid) in _BLOCKING_SYSCALLS:
        return True
    _ptrace(_PTRACE_DETACH, tid)
    return False


@contextmanager
def frozen_thread(pid: int, tid: int | None = None, timeout_s: float = 30.0) -> Iterator[None]:
    """Stop thread ``tid`` (default: the main thread) of ``pid`` for the ``with`` block.

    Raises:
        AssertionError: the thread was never caught in a blocking call within ``timeout_s``.
        OSError: ptrace is not allowed.
    """
    tid = pid if tid is None else tid
    wait_until(lambda: _try_freeze(pid, tid), timeout_s, interval_s=0.01, message="no freeze")
    try:
        yield
    finally:
        _ptrace(_PTRACE_DETACH, tid)
