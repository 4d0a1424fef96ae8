"""torch.distributed.elastic.rendezvous.etcd_rendezvous_backend: the backend on etcd (v3 here;
torch's speaks the removed v2 API). Importing it imports the etcd client."""

from __future__ import annotations

from elastic_run.rendezvous.etcd.backend import (
    EtcdRendezvousBackend,
    create_backend,
)

__all__ = [
    "EtcdRendezvousBackend",
    "create_backend",
]
