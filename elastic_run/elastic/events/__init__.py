"""torch.distributed.elastic.events, mirrored: event records logged to a destination's handler.

Owns nothing: the names are ``elastic_run.torch_events``'s, resolved on first use. The modules:
``api``, ``handlers``."""

from __future__ import annotations

from typing import Any

from elastic_run.elastic.lazy_names import resolve

_NAMES = {
    "Event": "elastic_run.torch_events",
    "EventMetadataValue": "elastic_run.torch_events",  # torch's alias, outside its __all__ too
    "EventSource": "elastic_run.torch_events",
    "NodeState": "elastic_run.torch_events",
    "RdzvEvent": "elastic_run.torch_events",
    "construct_and_record_rdzv_event": "elastic_run.torch_events",
    "get_logging_handler": "elastic_run.torch_events",
    "record": "elastic_run.torch_events",
    "record_rdzv_event": "elastic_run.torch_events",
}

__all__ = [
    "Event",
    "EventSource",
    "NodeState",
    "RdzvEvent",
    "construct_and_record_rdzv_event",
    "get_logging_handler",
    "record",
    "record_rdzv_event",
]


def __getattr__(name: str) -> Any:
    return resolve(__name__, _NAMES, name)
