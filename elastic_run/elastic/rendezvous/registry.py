"""torch.distributed.elastic.rendezvous.registry: a handler for a backend name."""

from __future__ import annotations

from elastic_run.rendezvous.registry import get_rendezvous_handler

__all__ = [
    "get_rendezvous_handler",
]
