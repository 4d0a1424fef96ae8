"""torch.distributed.elastic.rendezvous.etcd_server: a local etcd for tests and demos."""

from __future__ import annotations

from elastic_run.rendezvous.etcd.server import EtcdServer

__all__ = [
    "EtcdServer",
]
