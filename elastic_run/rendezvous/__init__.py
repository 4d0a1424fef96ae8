"""The rendezvous: API, registry, the dynamic handler, its backends and stores.

Read the layout as the design:

- ``api.py`` (the handler interface, parameters, what a round hands out), ``errors.py``,
  ``registry.py`` (backend name -> handler), ``settings.py`` (``--rdzv-conf`` parsed once),
  ``endpoints.py``, ``backend.py`` (the key-value seam every backend implements),
  ``static.py`` (torchrun's static mode), ``torchrun_plugin.py`` (our handlers under torchrun),
  ``memory.py`` (the in-memory backend: the supported fake at the seam, for logic tests);
  ``owned_dir.py`` (etcd's data folders, held by a living process, reclaimed after it);
- ``protocol/``: the pure O(N) protocol, its records and keys;
- ``dynamic/``: the dynamic handler and its rounds, the status reader, telemetry;
- ``liveness/``: heartbeats, death notices, the ring;
- ``c10d/``, ``etcd/``: the backends;
- ``embedded/``: the embedded etcd cluster (members run by the agents of the listed hosts).

The rendezvous knows nothing of processes. Names follow torch.distributed.elastic.rendezvous.
Submodules that need torch or the etcd client are imported on first use of their names, so
importing this package stays cheap.
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
    "DynamicRendezvousHandler": "elastic_run.rendezvous.dynamic.handler",
    "create_handler": "elastic_run.rendezvous.dynamic.handler",
    "RendezvousBackend": "elastic_run.rendezvous.backend",
    "C10dRendezvousBackend": "elastic_run.rendezvous.c10d.backend",
    "EtcdRendezvousBackend": "elastic_run.rendezvous.etcd.backend",
    "EtcdStore": "elastic_run.rendezvous.etcd.store",
    "EtcdServer": "elastic_run.rendezvous.etcd.server",
    "InMemoryRendezvousBackend": "elastic_run.rendezvous.memory",
    "InMemoryStore": "elastic_run.rendezvous.memory",
    "StaticRendezvousHandler": "elastic_run.rendezvous.static",
}

__all__ = [
    "C10dRendezvousBackend",
    "DynamicRendezvousHandler",
    "EtcdRendezvousBackend",
    "EtcdServer",
    "EtcdStore",
    "InMemoryRendezvousBackend",
    "InMemoryStore",
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
