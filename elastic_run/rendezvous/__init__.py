"""The rendezvous: API, registry, the dynamic handler, its backends and stores.

Names follow torch.distributed.elastic.rendezvous. Submodules that need torch or the etcd
client are imported on first use of their names, so importing this package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from elastic_run.rendezvous.api import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
)
from elastic_run.rendezvous.errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousStateError,
    RendezvousTimeoutError,
)

_LAZY = {
    "RendezvousHandlerRegistry": "elastic_run.rendezvous.registry",
    "RendezvousHandlerCreator": "elastic_run.rendezvous.registry",
    "get_rendezvous_handler": "elastic_run.rendezvous.registry",
    "rendezvous_handler_registry": "elastic_run.rendezvous.registry",
    "create_rendezvous_handler": "elastic_run.rendezvous.registry",
    "DynamicRendezvousHandler": "elastic_run.rendezvous.dynamic",
    "create_handler": "elastic_run.rendezvous.dynamic",
    "RendezvousBackend": "elastic_run.rendezvous.backend",
    "C10dRendezvousBackend": "elastic_run.rendezvous.c10d",
    "EtcdRendezvousBackend": "elastic_run.rendezvous.etcd_backend",
    "EtcdStore": "elastic_run.rendezvous.etcd_store",
    "EtcdServer": "elastic_run.rendezvous.etcd_server",
    "StaticRendezvousHandler": "elastic_run.rendezvous.static",
}

__all__ = [
    "C10dRendezvousBackend",
    "DynamicRendezvousHandler",
    "EtcdRendezvousBackend",
    "EtcdServer",
    "EtcdStore",
    "RendezvousBackend",
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
    "StaticRendezvousHandler",
    "create_handler",
    "create_rendezvous_handler",
    "get_rendezvous_handler",
    "rendezvous_handler_registry",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'elastic_run.rendezvous' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
