"""torch.distributed.elastic.events.api: the event records."""

from __future__ import annotations

from elastic_run.events import (
    Event,
    EventSource,
    NodeState,
    RdzvEvent,
)

__all__ = [
    "Event",
    "EventSource",
    "NodeState",
    "RdzvEvent",
]
