"""torch.distributed.elastic.rendezvous.dynamic_rendezvous: the dynamic handler on a backend.

The handler runs elastic-run's O(N) protocol; ``RendezvousBackend`` is its key-value seam (not
torch's pickled ``get_state``/``set_state``), and torch's ``RendezvousSettings`` is not kept
(see the README's table)."""

from __future__ import annotations

from elastic_run.rendezvous.backend import RendezvousBackend
from elastic_run.rendezvous.dynamic.handler import (
    DynamicRendezvousHandler,
    create_handler,
)
from elastic_run.rendezvous.settings import RendezvousTimeout

__all__ = [
    "DynamicRendezvousHandler",
    "RendezvousBackend",
    "RendezvousTimeout",
    "create_handler",
]
