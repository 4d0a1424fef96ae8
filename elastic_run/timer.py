"""torch's expiration-timer API, served by elastic-run: the names of ``torch.distributed.elastic.timer``.

A script moves from torch's timers to ours by changing one import::

    from elastic_run import timer  # was: from torch.distributed.elastic import timer

    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    with timer.expires(after=60, scope="train_step"):
        train_step()

The calls are torch's: ``configure(timer_client)``, ``expires(after, scope=None, client=None)``,
``FileTimerClient(file_path, signal=SIGKILL)``, ``FileTimerRequest(worker_pid, scope_id,
expiration_time, signal=0)`` and ``FileTimerServer(file_path, run_id, max_interval=10,
daemon=True, log_event=None)``. Where they differ: :func:`expires` without a configured client
uses ``TORCHELASTIC_TIMER_FILE`` (torch raises), and errors are
:class:`~elastic_run.worker.TimerClientError` (a ``RuntimeError``, as torch's) or, when no
watchdog reads the pipe, :class:`~elastic_run.worker.WatchdogUnreachableError` (a
``BrokenPipeError``, as torch's). ``elastic_run.elastic.timer`` holds the same names under
torch's module layout.

The worker-side names come from :mod:`elastic_run.worker`, which stays cheap to import. The
server is the agent's (:mod:`elastic_run.agent.watchdog.server`) and is imported only when asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from elastic_run.timer_wire import FileTimerRequest
from elastic_run.worker import (
    FileTimerClient,
    TimerClient,
    TimerClientError,
    WatchdogUnreachableError,
    configure,
    expires,
)

if TYPE_CHECKING:
    from elastic_run.agent.watchdog.server import ArmedTimer, FileTimerServer, TimerExpiry

__all__ = [
    "ArmedTimer",
    "FileTimerClient",
    "FileTimerRequest",
    "FileTimerServer",
    "TimerClient",
    "TimerClientError",
    "TimerExpiry",
    "WatchdogUnreachableError",
    "configure",
    "expires",
]

_SERVER_SIDE = frozenset({"ArmedTimer", "FileTimerServer", "TimerExpiry"})


def __getattr__(name: str) -> object:
    """Import the server-side names on first use, so that importing this module stays cheap.

    Args:
        name: the attribute asked for.

    Returns:
        The attribute of :mod:`elastic_run.agent.watchdog.server`.

    Raises:
        AttributeError: ``name`` is not a name of this module.
    """
    if name in _SERVER_SIDE:
        return getattr(importlib.import_module("elastic_run.agent.watchdog.server"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
