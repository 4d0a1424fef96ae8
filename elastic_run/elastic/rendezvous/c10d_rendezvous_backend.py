"""torch.distributed.elastic.rendezvous.c10d_rendezvous_backend: the backend on a TCPStore or
FileStore."""

from __future__ import annotations

from elastic_run.rendezvous.c10d.backend import (
    DEFAULT_PORT,
    C10dRendezvousBackend,
    create_backend,
)

__all__ = [
    "DEFAULT_PORT",
    "C10dRendezvousBackend",
    "create_backend",
]
