"""torch.distributed.elastic.rendezvous.etcd_store: a torch ``Store`` on etcd (v3). Importing it
imports torch and the etcd client."""

from __future__ import annotations

from elastic_run.rendezvous.etcd.store import EtcdStore

__all__ = [
    "EtcdStore",
]
