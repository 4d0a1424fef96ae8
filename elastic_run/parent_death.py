"""Children that die with their parent: Linux's parent-death signal, set without forking us.

Everything elastic-run spawns (workers, the local etcd) must not outlive it, even when it is
SIGKILLed. Linux's ``PR_SET_PDEATHSIG`` does that, but it must be set in the child. Two ways:

- ``death_signal_prefix()``: util-linux's ``setpriv --pdeathsig KILL --`` in front of the
  command sets it and execs; subprocess then spawns by vfork-and-exec (0.4 ms for a worker
  with torch loaded, where a fork of this whole process takes about 12 ms, and where a fork
  while gRPC threads run can abort or hang the child, see ``rendezvous/etcd/grpc_fork.py``).
- ``set_parent_death_signal``: a ``preexec_fn`` for hosts without setpriv (it forks).

Note that Linux fires the signal when the *thread* that spawned the child exits.
"""

from __future__ import annotations

import ctypes
import functools
import shutil
import signal
import subprocess
from collections.abc import Callable

__all__ = ["death_signal_prefix", "set_parent_death_signal"]

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[[int, int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


# Resolved once in the parent, so the child between fork and exec only makes the call.
_prctl = _load_prctl()


def set_parent_death_signal() -> None:
    """In the child, between fork and exec: SIGKILL it when the spawning thread exits."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@functools.cache
def death_signal_prefix() -> tuple[str, ...]:
    """``setpriv --pdeathsig KILL --`` where util-linux's setpriv does that, else ``()``.

    Probed once per process by running it.
    """
    found = shutil.which("setpriv")
    if found is None:
        return ()
    probe = (found, "--pdeathsig", "KILL", "--", "true")
    try:
        ok = subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return probe[:4] if ok else ()
