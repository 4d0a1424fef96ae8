"""torch.distributed.elastic.timer.api: the client interface and the ``expires`` context."""

from __future__ import annotations

from elastic_run.worker import (
    TimerClient,
    configure,
    expires,
)

__all__ = [
    "TimerClient",
    "configure",
    "expires",
]
