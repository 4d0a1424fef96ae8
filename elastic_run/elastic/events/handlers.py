"""torch.distributed.elastic.events.handlers: a destination's logging handler."""

from __future__ import annotations

from elastic_run.torch_events import get_logging_handler

__all__ = [
    "get_logging_handler",
]
