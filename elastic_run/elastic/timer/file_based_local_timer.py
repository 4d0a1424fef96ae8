"""torch.distributed.elastic.timer.file_based_local_timer: the FIFO timer's client, request
and server (the agent's watchdog)."""

from __future__ import annotations

from elastic_run.agent.watchdog.server import FileTimerServer
from elastic_run.worker import FileTimerClient
from elastic_run.worker.timer_wire import FileTimerRequest

__all__ = [
    "FileTimerClient",
    "FileTimerRequest",
    "FileTimerServer",
]
