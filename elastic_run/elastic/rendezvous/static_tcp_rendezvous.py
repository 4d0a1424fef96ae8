"""torch.distributed.elastic.rendezvous.static_tcp_rendezvous: fixed nodes and ranks on a
TCPStore."""

from __future__ import annotations

from elastic_run.rendezvous.static import (
    StaticTCPRendezvous,
    create_rdzv_handler,
)

__all__ = [
    "StaticTCPRendezvous",
    "create_rdzv_handler",
]
