"""gRPC's fork handlers, which must be off in a process that forks while gRPC runs in it.

The agent spawns workers with fork + exec, and where util-linux's setpriv is missing it sets
their parent-death signal with a ``preexec_fn``, which makes subprocess fork the whole agent
(without one, subprocess uses vfork, which runs no fork handlers). gRPC (the etcd client)
registers fork handlers that then run in the child, between fork and exec.

Measured with ``scripts/probe_grpc_fork.py`` (grpcio 1.85.1, an etcd client busy in the
process: a kept-alive lease, a watch, puts and gets), 300 children each way:
- GRPC_ENABLE_FORK_SUPPORT unset: 4 of 300 preexec_fn children aborted (SIGABRT: epoll on a
  closed descriptor), and in another run one hung before its exec, which hangs ``Popen``;
- ``true``: every preexec_fn child hung;
- ``false``: none failed;
- ``false`` set after ``import grpc``: 8 of 300 aborted (too late: gRPC read it at import);
- vfork (no preexec_fn): none failed, whatever the variable.

So the variable must be ``false`` before grpc is imported. The library never writes
``os.environ`` on import; the command line calls ``disable_grpc_fork_handlers()`` first
thing. This module imports nothing of gRPC.
"""

from __future__ import annotations

import functools
import logging
import os
import sys

__all__ = ["GRPC_FORK_VARIABLE", "disable_grpc_fork_handlers"]

log = logging.getLogger(__name__)

GRPC_FORK_VARIABLE = "GRPC_ENABLE_FORK_SUPPORT"
_TRUE_VALUES = ("1", "true", "yes")  # what gRPC reads as "on"


@functools.cache
def disable_grpc_fork_handlers() -> bool:
    """Turn gRPC's fork handlers off for this process, if gRPC is not loaded yet.

    Sets GRPC_ENABLE_FORK_SUPPORT=false unless the variable is already set (a value the
    user chose, in the environment the process started with, is kept). Call it before
    anything imports ``grpc``; the first call decides, later ones return its answer.

    Returns:
        Whether gRPC in this process runs without fork handlers: False when the user set
        the variable to a true value, or when this call had to set it but ``grpc`` was
        already imported (too late; a warning is logged).
    """
    chosen = os.environ.get(GRPC_FORK_VARIABLE)
    if chosen is not None:
        return chosen.strip().lower() not in _TRUE_VALUES
    os.environ[GRPC_FORK_VARIABLE] = "false"
    if "grpc" in sys.modules:
        log.warning(
            "gRPC was loaded before its fork handlers could be turned off: a worker spawned "
            "with a preexec_fn may abort or hang (set %s=false in the environment)",
            GRPC_FORK_VARIABLE,
        )
        return False
    return True
