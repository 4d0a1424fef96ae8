"""Our rendezvous under plain ``torchrun``: handlers for torch's entry point group.

torch (``torch/distributed/elastic/rendezvous/registry.py``) loads every entry point of the
group ``torchrun.handlers`` when its rendezvous package is imported, calls the loaded object
with no argument, and registers what that returns as the creator of the backend named like the
entry point: ``(torch RendezvousParameters) -> handler``, whose ``get_backend()`` must return
that same name. ``pyproject.toml`` registers two, named so that they shadow none of torch's:

    etcd-v3            our dynamic rendezvous on etcd v3 (torch's own ``etcd`` is v2)
    elastic-run-c10d   our O(N) dynamic rendezvous on a c10d TCPStore

so ``torchrun --rdzv-backend etcd-v3 --rdzv-endpoint host:2379 ...`` works after
``pip install elastic-run``. ``TorchrunHandler`` adapts our handler to what torch's agent reads:
a torch ``RendezvousInfo`` whose ``bootstrap_store_info`` says where rank 0 hosts the workers'
store, and torch's rendezvous errors (its agent and launcher catch those, not ours).

torch is imported only inside the calls: torch imports this module while its own rendezvous
package is still being set up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from elastic_run.rendezvous import errors as ours
from elastic_run.rendezvous.api import RendezvousHandler, RendezvousParameters

__all__ = ["PLUGIN_BACKENDS", "TorchrunHandler", "elastic_run_c10d", "etcd_v3"]

PLUGIN_BACKENDS = {"etcd-v3": "etcd", "elastic-run-c10d": "c10d"}
"""Each name torchrun sees -> the backend of ours it runs."""


@contextmanager
def _as_torch_errors() -> Iterator[None]:
    """Raise torch's rendezvous error for each of ours (same class name), chained."""
    from torch.distributed.elastic.rendezvous import api as torch_api

    try:
        yield
    except ours.RendezvousError as exc:
        cls = getattr(torch_api, type(exc).__name__, None)
        if not (isinstance(cls, type) and issubclass(cls, torch_api.RendezvousError)):
            cls = torch_api.RendezvousError
        raise cls(str(exc)) from exc


class TorchrunHandler:
    """One of our handlers as torch's agent expects a ``RendezvousHandler``.

    Args:
        name: the backend name torchrun was given (``etcd-v3``, ``elastic-run-c10d``).
        inner: our handler doing the work (it agrees on the bootstrap address: rank 0 publishes
            its ``local_addr``, or its FQDN, and a free port).
    """

    def __init__(self, name: str, inner: RendezvousHandler) -> None:
        self._name = name
        self._inner = inner

    def get_backend(self) -> str:
        """The name torchrun knows this backend by."""
        return self._name

    @property
    def use_agent_store(self) -> bool:
        """False: the workers build their own store at the bootstrap address (rank 0 hosts)."""
        return False

    def next_rendezvous(self) -> Any:
        """Join the next round; return torch's ``RendezvousInfo`` with the bootstrap address.

        Raises:
            torch's RendezvousError subclasses: the round failed (closed, timed out, ...).
        """
        from torch.distributed.elastic.rendezvous import api as torch_api

        with _as_torch_errors():
            info = self._inner.next_rendezvous()
        where = info.bootstrap_store_info
        assert where is not None  # torch's agent sets no change callback: the inner agrees on it
        return torch_api.RendezvousInfo(
            info.store,
            info.rank,
            info.world_size,
            torch_api.RendezvousStoreInfo(where.master_addr, where.master_port),
        )

    def is_closed(self) -> bool:
        """Whether the job's rendezvous is closed."""
        with _as_torch_errors():
            return self._inner.is_closed()

    def set_closed(self) -> None:
        """Close the job's rendezvous."""
        with _as_torch_errors():
            self._inner.set_closed()

    def num_nodes_waiting(self) -> int:
        """How many nodes wait for a new round: at the door, or in the next one already.

        torch's agent restarts its workers into a new round only when this is above zero. A
        peer that re-rendezvoused (its workers failed) ended this node's round and arrived in
        the next one: torch's own handler counts such a node as waiting, so this one does too.
        """
        with _as_torch_errors():
            waiting = self._inner.num_nodes_waiting()
        poll = getattr(self._inner, "poll", None)
        if callable(poll) and poll().round_over:
            return max(1, waiting)
        return waiting

    def get_run_id(self) -> str:
        """The job's id."""
        return self._inner.get_run_id()

    def shutdown(self) -> bool:
        """Leave the job without closing it."""
        with _as_torch_errors():
            return self._inner.shutdown()


def _creator(name: str) -> Callable[[Any], TorchrunHandler]:
    def create(params: Any) -> TorchrunHandler:
        from torch.distributed.elastic.rendezvous import api as torch_api

        from elastic_run.rendezvous.registry import create_rendezvous_handler

        torch_api.RendezvousHandler.register(TorchrunHandler)
        mine = RendezvousParameters(
            PLUGIN_BACKENDS[name],
            params.endpoint,
            params.run_id,
            params.min_nodes,
            params.max_nodes,
            params.local_addr,
            **params.config,
        )
        with _as_torch_errors():
            inner = create_rendezvous_handler(mine)
        return TorchrunHandler(name, inner)

    return create


def etcd_v3() -> Callable[[Any], TorchrunHandler]:
    """The creator torch registers as ``etcd-v3`` (the entry point's object; torch calls it)."""
    return _creator("etcd-v3")


def elastic_run_c10d() -> Callable[[Any], TorchrunHandler]:
    """The creator torch registers as ``elastic-run-c10d`` (torch calls the entry point)."""
    return _creator("elastic-run-c10d")
