"""torch.distributed.elastic.events.api: the event records.

``EventMetadataValue`` (the type of a metadata value) is importable, as torch's, though neither
``__all__`` names it."""

from __future__ import annotations

from elastic_run.torch_events import Event, EventSource, NodeState, RdzvEvent
from elastic_run.torch_events import EventMetadataValue as EventMetadataValue  # a re-export

__all__ = [
    "Event",
    "EventSource",
    "NodeState",
    "RdzvEvent",
]
