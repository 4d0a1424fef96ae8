"""torch.distributed.elastic.rendezvous.utils: endpoint parsing."""

from __future__ import annotations

from elastic_run.rendezvous.endpoints import parse_rendezvous_endpoint

__all__ = [
    "parse_rendezvous_endpoint",
]
