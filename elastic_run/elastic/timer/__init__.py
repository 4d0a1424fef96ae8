"""torch.distributed.elastic.timer, mirrored: expiration timers on the agent's watchdog.

Owns nothing: the client side is ``elastic_run.worker``'s, the server the agent's watchdog,
resolved on first use. The modules: ``api``, ``file_based_local_timer``. torch's
multiprocessing-queue timers (``local_timer``) are not kept (README)."""

from __future__ import annotations

from typing import Any

from elastic_run.elastic.lazy_names import resolve

_NAMES = {
    "FileTimerClient": "elastic_run.elastic.timer.file_based_local_timer",
    "FileTimerRequest": "elastic_run.elastic.timer.file_based_local_timer",
    "FileTimerServer": "elastic_run.elastic.timer.file_based_local_timer",
    "TimerClient": "elastic_run.elastic.timer.api",
    "configure": "elastic_run.elastic.timer.api",
    "expires": "elastic_run.elastic.timer.api",
}

__all__ = [
    "FileTimerClient",
    "FileTimerRequest",
    "FileTimerServer",
    "TimerClient",
    "configure",
    "expires",
]


def __getattr__(name: str) -> Any:
    return resolve(__name__, _NAMES, name)
