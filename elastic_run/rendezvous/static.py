"""StaticRendezvousHandler: a fixed set of nodes with known ranks (torchrun's ``static``).

Used when ``--rdzv-backend`` is ``static`` (torchrun's default without ``--standalone``):
``--nnodes N`` with ``--node-rank`` and ``--master-addr/--master-port``. Node 0 hosts a
TCPStore at the master address; the others connect to it. No node may join or leave; each
restart is one more round, private by prefix.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.api import RendezvousHandler, RendezvousInfo, RendezvousParameters
from elastic_run.rendezvous.c10d import parse_endpoint
from elastic_run.rendezvous.errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousTimeoutError,
)

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

__all__ = ["StaticRendezvousHandler", "create_static_handler"]


class StaticRendezvousHandler(RendezvousHandler):
    """Rank ``node_rank`` of ``world_size`` nodes, meeting at ``host:port``.

    Args:
        run_id: the job id.
        host: the master address.
        port: the master port (node 0 hosts the store there).
        node_rank: this node's rank.
        world_size: the number of nodes.
        timeout_s: how long to wait for the other nodes.
    """

    def __init__(
        self, run_id: str, host: str, port: int, node_rank: int, world_size: int, timeout_s: float
    ) -> None:
        if not 0 <= node_rank < world_size:
            raise ConfigurationError(
                f"--node-rank {node_rank} is out of range for --nnodes {world_size}"
            )
        self._run_id = run_id
        self._host = host
        self._port = port
        self._node_rank = node_rank
        self._world_size = world_size
        self._timeout_s = timeout_s
        self._store: Store | None = None
        self._round = -1

    def get_backend(self) -> str:
        return "static"

    def get_run_id(self) -> str:
        return self._run_id

    @property
    def use_agent_store(self) -> bool:
        return True

    def _connect(self) -> Store:
        from torch._C._distributed_c10d import PrefixStore, TCPStore

        if self._store is None:
            try:
                raw = TCPStore(
                    self._host,
                    self._port,
                    world_size=self._world_size,
                    is_master=self._node_rank == 0,
                    timeout=timedelta(seconds=self._timeout_s),
                    wait_for_workers=False,
                )
            except RuntimeError as exc:
                role = "host" if self._node_rank == 0 else "reach"
                raise RendezvousConnectionError(
                    f"cannot {role} the static rendezvous store at {self._host}:{self._port}: "
                    f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}"
                ) from exc
            self._store = PrefixStore(f"elastic-run/{self._run_id}/", raw)
        return self._store

    def next_rendezvous(self) -> RendezvousInfo:
        from torch._C._distributed_c10d import PrefixStore
        from torch.distributed import DistStoreError

        store = self._connect()
        if self.is_closed():
            raise RendezvousClosedError(f"rendezvous '{self._run_id}' is closed")
        self._round += 1
        round_store = PrefixStore(f"static/r{self._round}/", store)
        try:
            # Every node arrives before any starts its workers.
            round_store.set(f"node/{self._node_rank}", "1")
            round_store.wait(
                [f"node/{i}" for i in range(self._world_size)],
                timedelta(seconds=self._timeout_s),
            )
        except DistStoreError as exc:
            raise RendezvousTimeoutError(
                f"static rendezvous '{self._run_id}' timed out after {self._timeout_s:g} s "
                f"waiting for {self._world_size} nodes at {self._host}:{self._port}"
            ) from exc
        return RendezvousInfo(
            store=round_store, rank=self._node_rank, world_size=self._world_size, round=self._round
        )

    def is_closed(self) -> bool:
        store = self._connect()
        return bool(store.check(["closed"]))

    def set_closed(self) -> None:
        self._connect().set("closed", "closed")

    def num_nodes_waiting(self) -> int:
        return 0


def create_static_handler(params: RendezvousParameters) -> StaticRendezvousHandler:
    """Build the static handler from the parameters the CLI gives it.

    The CLI passes ``rank`` (--node-rank) in the config, and the master address as the
    endpoint; ``timeout`` (s) bounds the wait for the other nodes (default 900).
    """
    if params.min_nodes != params.max_nodes:
        raise ConfigurationError(
            "the static rendezvous needs a fixed --nnodes (use --rdzv-backend c10d for MIN:MAX)"
        )
    host, port = parse_endpoint(params.endpoint or "127.0.0.1:29500", default_port=29500)
    rank = params.get_as_int("rank", 0)
    timeout_s = params.get_as_float("timeout", 900.0)
    assert rank is not None and timeout_s is not None
    return StaticRendezvousHandler(params.run_id, host, port, rank, params.max_nodes, timeout_s)
