"""What runs inside a worker process, and what a training script may import.

``elastic_run.worker`` is the public import: error recording (:func:`record`), the watchdog
client (:func:`expires`, :func:`configure`, :class:`FileTimerClient`), progress beats
(:func:`progress`, :func:`sync_point`) and typed access to the environment (:class:`WorkerEnv`),
all defined in :mod:`elastic_run.worker.api` and resolved here on first use, so that the site
hook's own imports (the exit guard, automatic beats) do not pay for them.

The package holds everything that runs in the worker's interpreter, and nothing else:

- ``api``: the public calls above;
- ``error_handler``: torch's ``@record`` / ``ErrorHandler`` / ``ChildFailedError``;
- ``beat_file``: the shared-memory beat slots (written here, read by the agent);
- ``timer_wire``: the watchdog's JSON-lines request format (written here, read by the agent);
- ``auto_progress``: a beat per optimizer step through torch's global optimizer hooks;
- ``exit_guard``: a worker's exit waits for gloo's threads;
- ``site_hook``: the ``sitecustomize`` that arms the last two in cold Python workers.

Invariant: nothing here imports the agent, the CLI, the rendezvous or torch (auto_progress
hooks into torch only once the script imported it). The agent imports from here (the formats
have one home), never the other way.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elastic_run.worker.api import (
        ERROR_FILE_ENV,
        TIMER_FILE_ENV,
        FileTimerClient,
        FileTimerRequest,
        TimerClient,
        TimerClientError,
        WatchdogUnreachableError,
        WorkerEnv,
        WorkerEnvError,
        configure,
        expires,
        progress,
        record,
        sync_point,
        write_error_data,
        write_error_file,
    )

__all__ = [
    "ERROR_FILE_ENV",
    "TIMER_FILE_ENV",
    "FileTimerClient",
    "FileTimerRequest",
    "TimerClient",
    "TimerClientError",
    "WatchdogUnreachableError",
    "WorkerEnv",
    "WorkerEnvError",
    "configure",
    "expires",
    "progress",
    "record",
    "sync_point",
    "write_error_data",
    "write_error_file",
]


def __getattr__(name: str) -> Any:
    """Resolve a public name from :mod:`elastic_run.worker.api` on first use.

    Raises:
        AttributeError: ``name`` is not a public name of the package.
    """
    if name in __all__:
        return getattr(importlib.import_module("elastic_run.worker.api"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
