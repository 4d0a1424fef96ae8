"""StaticRendezvousHandler: a fixed set of nodes with known ranks (torchrun's ``static``).

Used when ``--rdzv-backend`` is ``static`` (torchrun's default without ``--standalone``):
``--nnodes N`` with ``--node-rank`` and ``--master-addr/--master-port``. Node 0 hosts a
TCPStore at the master address; the others connect to it. No node may join or leave; each
restart is one more round, private by prefix.

As in torchrun, the workers use that same store: each round's ``RendezvousInfo`` carries
``bootstrap_store_info`` = (master address, master port), so the workers get exactly
``MASTER_ADDR``/``MASTER_PORT`` as given, and torch's env:// rendezvous in each worker
connects to it as a client (keys under ``/worker/attempt_<restart count>``).

Waits are sliced (``_SLICE_S``) so the agent's interrupt check (a signal) is honoured.

A store that cannot be reached (or hosted), or that went away, raises
:class:`StaticStoreConnectionError`: our ``RendezvousConnectionError`` (exit 4) and, as torch's
static rendezvous raises ``DistNetworkError`` there, a ``RuntimeError``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.api import (
    InterruptibleRendezvous,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
)
from elastic_run.rendezvous.endpoints import parse_rendezvous_endpoint
from elastic_run.rendezvous.errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousInterruptedError,
    RendezvousTimeoutError,
)
from elastic_run.rendezvous.settings import STATIC_KEYS, RendezvousSettings, check_conf_keys

if TYPE_CHECKING:
    from torch.distributed import Store

__all__ = [
    "CONF_KEYS",
    "StaticRendezvousHandler",
    "StaticStoreConnectionError",
    "StaticTCPRendezvous",
    "TORCHRUN_STATIC_TIMEOUT_S",
    "check_static_nodes",
    "create_rdzv_handler",
]

CONF_KEYS = STATIC_KEYS
TORCHRUN_STATIC_TIMEOUT_S = 900.0
"""What torchrun's static rendezvous waits when no timeout is given: its ``LaunchConfig`` puts
``timeout=900`` in the rendezvous config (``--rdzv-conf``'s keys win), where torch's static
handler alone would wait 600 s."""
_SLICE_S = 0.5


class StaticStoreConnectionError(RendezvousConnectionError, RuntimeError):
    """The static rendezvous store cannot be reached or hosted, or went away.

    A ``RendezvousConnectionError`` (the CLI exits 4) and a ``RuntimeError``, as torch's
    ``DistNetworkError`` is, so code written against torch's static rendezvous still catches it.
    """


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
        check_static_nodes(world_size, world_size, node_rank)
        self._run_id = run_id
        self._host = host
        self._port = port
        self._node_rank = node_rank
        self._world_size = world_size
        self._timeout_s = timeout_s
        self._store: Store | None = None
        self._round = -1
        self._is_interrupted: Callable[[], bool] = lambda: False

    def get_backend(self) -> str:
        return "static"

    def get_run_id(self) -> str:
        return self._run_id

    @property
    def use_agent_store(self) -> bool:
        return True

    @property
    def timeout_s(self) -> float:
        """How long ``next_rendezvous`` waits for the other nodes (and a client to connect)."""
        return self._timeout_s

    def set_interrupt(self, is_interrupted: Callable[[], bool] | None) -> None:
        """Make ``next_rendezvous`` give up once ``is_interrupted()`` is True (sliced waits)."""
        self._is_interrupted = is_interrupted or (lambda: False)

    def _connect(self) -> Store:
        from torch.distributed import PrefixStore, TCPStore

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
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise StaticStoreConnectionError(
                    f"cannot {role} the static rendezvous store at {self._host}:{self._port}: "
                    f"{first}"
                ) from exc
            self._store = PrefixStore(f"elastic-run/{self._run_id}/", raw)
        return self._store

    def next_rendezvous(self) -> RendezvousInfo:
        from torch.distributed import DistNetworkError, DistStoreError, PrefixStore

        store = self._connect()
        if self.is_closed():
            raise RendezvousClosedError(f"rendezvous '{self._run_id}' is closed")
        self._round += 1
        round_store = PrefixStore(f"static/r{self._round}/", store)
        deadline = time.monotonic() + self._timeout_s
        names = [f"node/{i}" for i in range(self._world_size)]
        try:
            # Every node arrives before any starts its workers.
            round_store.set(f"node/{self._node_rank}", "1")
            while True:
                if self._is_interrupted():
                    raise RendezvousInterruptedError(f"rendezvous '{self._run_id}': interrupted")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RendezvousTimeoutError(
                        f"static rendezvous '{self._run_id}' timed out after "
                        f"{self._timeout_s:g} s waiting for {self._world_size} nodes at "
                        f"{self._host}:{self._port}"
                    )
                try:
                    round_store.wait(names, timedelta(seconds=min(_SLICE_S, left)))
                    break
                except DistNetworkError:
                    raise
                except DistStoreError:
                    continue
        except DistNetworkError as exc:
            raise self._gone(exc) from exc
        return RendezvousInfo(
            store=round_store,
            rank=self._node_rank,
            world_size=self._world_size,
            bootstrap_store_info=RendezvousStoreInfo(self._host, self._port),
            round=self._round,
        )

    def is_closed(self) -> bool:
        store = self._connect()
        try:
            return bool(store.check(["closed"]))
        except RuntimeError as exc:
            raise self._gone(exc) from exc

    def set_closed(self) -> None:
        store = self._connect()
        try:
            store.set("closed", "closed")
        except RuntimeError as exc:
            raise self._gone(exc) from exc

    def _gone(self, exc: BaseException) -> StaticStoreConnectionError:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return StaticStoreConnectionError(
            f"the static rendezvous store at {self._host}:{self._port} went away: {first}"
        )

    def num_nodes_waiting(self) -> int:
        return 0


def _conforms(handler: StaticRendezvousHandler) -> InterruptibleRendezvous:
    return handler  # mypy checks the handler against the agent's contract here


def check_static_nodes(min_nodes: int, max_nodes: int, node_rank: int) -> None:
    """The static rendezvous's node rules, in one place (the CLI checks them with this too).

    Raises:
        ConfigurationError: ``--nnodes`` is MIN:MAX, or the node rank is not in 0..N-1.
    """
    if min_nodes != max_nodes:
        raise ConfigurationError(
            "--nnodes MIN:MAX needs an elastic backend (--rdzv-backend c10d or etcd)"
        )
    if not 0 <= node_rank < max_nodes:
        raise ConfigurationError(
            f"--node-rank {node_rank} is out of range for --nnodes {max_nodes}"
        )


class StaticTCPRendezvous(StaticRendezvousHandler):
    """The static handler under torch's name and constructor (``static_tcp_rendezvous``).

    Args:
        master_addr: the host of the store (node 0 hosts it).
        master_port: its port.
        rank: this node's rank.
        world_size: the number of nodes.
        run_id: the job id.
        timeout: how long to wait for the other nodes, seconds.

    Raises:
        ConfigurationError: ``rank`` is not in ``0..world_size-1`` (a ``ValueError``).
    """

    def __init__(
        self,
        master_addr: str,
        master_port: int,
        rank: int,
        world_size: int,
        run_id: str,
        timeout: float,
    ) -> None:
        super().__init__(run_id, master_addr, master_port, rank, world_size, float(timeout))
        self.master_addr = master_addr
        self.master_port = master_port
        self.rank = rank
        self.world_size = world_size
        self.run_id = run_id
        self.timeout = timedelta(seconds=timeout)


def create_rdzv_handler(params: RendezvousParameters) -> StaticTCPRendezvous:
    """Build the static handler (torch's ``create_rdzv_handler``): the one set of its rules.

    What torch wants: ``rank`` in the config (``--node-rank``) and an endpoint with a port
    (``--master-addr:--master-port``); and the node rules of :func:`check_static_nodes`. The wait
    for the other nodes is ``join_timeout`` (or torch's older ``timeout``, fractions kept),
    parsed as every rendezvous parses it; without either, torch's 600 s. The CLI gives what
    torchrun's launcher gives: the rank, the endpoint, and ``timeout=``
    :data:`TORCHRUN_STATIC_TIMEOUT_S` unless ``--rdzv-conf`` names one.

    Args:
        params: the rendezvous parameters.

    Returns:
        The handler.

    Raises:
        ConfigurationError: no ``rank``, no endpoint, an endpoint without a port, a node rule
            broken, or a bad value (a ``ValueError``, as torch raises).
    """
    settings = RendezvousSettings.from_params(params)
    check_conf_keys(params, CONF_KEYS, "static")
    if settings.rank is None:
        raise ConfigurationError("the static rendezvous needs 'rank' in its config (--node-rank)")
    if not params.endpoint.strip():
        raise ConfigurationError(
            "the static rendezvous needs an endpoint (--master-addr and --master-port)"
        )
    host, port = parse_rendezvous_endpoint(params.endpoint, -1)
    if port == -1:
        raise ConfigurationError(
            f"the static rendezvous endpoint '{params.endpoint}' names no port (--master-port)"
        )
    check_static_nodes(params.min_nodes, params.max_nodes, settings.rank)
    return StaticTCPRendezvous(
        host, port, settings.rank, params.max_nodes, params.run_id, settings.join_timeout_s
    )
