"""torch.distributed.elastic.rendezvous, mirrored: the API, and one module per torch module.

Owns nothing: every name is elastic-run's (``elastic_run.rendezvous``), resolved on first use.
The modules: ``api``, ``registry``, ``dynamic_rendezvous``, ``c10d_rendezvous_backend``,
``etcd_rendezvous_backend``, ``etcd_store``, ``etcd_server``, ``static_tcp_rendezvous``,
``utils``. May import elastic-run's public rendezvous modules only."""

from __future__ import annotations

from typing import Any

from elastic_run.elastic.lazy_names import resolve

_NAMES = {
    "RendezvousClosedError": "elastic_run.elastic.rendezvous.api",
    "RendezvousConnectionError": "elastic_run.elastic.rendezvous.api",
    "RendezvousError": "elastic_run.elastic.rendezvous.api",
    "RendezvousGracefulExitError": "elastic_run.elastic.rendezvous.api",
    "RendezvousHandler": "elastic_run.elastic.rendezvous.api",
    "RendezvousHandlerCreator": "elastic_run.elastic.rendezvous.api",
    "RendezvousHandlerRegistry": "elastic_run.elastic.rendezvous.api",
    "RendezvousInfo": "elastic_run.elastic.rendezvous.api",
    "RendezvousParameters": "elastic_run.elastic.rendezvous.api",
    "RendezvousStateError": "elastic_run.elastic.rendezvous.api",
    "RendezvousStoreInfo": "elastic_run.elastic.rendezvous.api",
    "RendezvousTimeoutError": "elastic_run.elastic.rendezvous.api",
    "rendezvous_handler_registry": "elastic_run.elastic.rendezvous.api",
}

__all__ = [
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousHandlerCreator",
    "RendezvousHandlerRegistry",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeoutError",
    "rendezvous_handler_registry",
]


def __getattr__(name: str) -> Any:
    return resolve(__name__, _NAMES, name)
