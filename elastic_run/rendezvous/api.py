"""The rendezvous API: handler interface, parameters and what a round hands out.

Names and call shapes follow torch.distributed.elastic.rendezvous so a torch user's
code ports; the implementation is ours.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from elastic_run.errors import ConfigurationError

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

__all__ = [
    "MemberSnapshot",
    "RendezvousHandler",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousSnapshot",
    "RendezvousStoreInfo",
]

_TRUE = {"1", "true", "t", "yes", "y"}
_FALSE = {"0", "false", "f", "no", "n"}


class RendezvousParameters:
    """What a handler is built from: backend, endpoint, run id, node counts and config.

    Args:
        backend: the backend name (``c10d``, ``etcd``, ``static``...).
        endpoint: ``host[:port]`` of the backend (several, comma-separated, for etcd).
        run_id: the job's id; every node of one job passes the same.
        min_nodes: the fewest nodes a round may complete with.
        max_nodes: the most nodes a round admits.
        local_addr: the address this node advertises (default: its FQDN).
        **kwargs: backend configuration (``--rdzv-conf``), kept as given.

    Raises:
        ConfigurationError: when the node counts are not ``0 < min <= max``.
    """

    def __init__(
        self,
        backend: str,
        endpoint: str,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None = None,
        **kwargs: Any,
    ) -> None:
        if not backend:
            raise ConfigurationError("the rendezvous backend name must not be empty")
        if min_nodes < 1:
            raise ConfigurationError(f"min_nodes must be at least 1, got {min_nodes}")
        if max_nodes < min_nodes:
            raise ConfigurationError(
                f"max_nodes ({max_nodes}) must not be less than min_nodes ({min_nodes})"
            )
        self.backend = backend
        self.endpoint = endpoint
        self.run_id = run_id
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.local_addr = local_addr
        self.config: dict[str, Any] = dict(kwargs)

    def get(self, key: str, default: Any = None) -> Any:
        """Return the config value of ``key``, or ``default``."""
        return self.config.get(key, default)

    def get_as_bool(self, key: str, default: bool | None = None) -> bool | None:
        """Return ``key`` as a bool (1/0, true/false, t/f, yes/no, y/n in any case).

        Raises:
            ConfigurationError: when the value is none of those.
        """
        value = self.get(key, default)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            if value in (0, 1):
                return bool(value)
        elif isinstance(value, str):
            lowered = value.strip().lower()
            if lowered in _TRUE:
                return True
            if lowered in _FALSE:
                return False
        raise ConfigurationError(f"the rendezvous config '{key}={value}' is not a valid boolean")

    def get_as_int(self, key: str, default: int | None = None) -> int | None:
        """Return ``key`` as an int.

        Raises:
            ConfigurationError: when the value is not an integer.
        """
        value = self.get(key, default)
        if value is None:
            return value
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"the rendezvous config '{key}={value}' is not a valid integer"
            ) from None

    def get_as_float(self, key: str, default: float | None = None) -> float | None:
        """Return ``key`` as a float (seconds, for the timeouts).

        Raises:
            ConfigurationError: when the value is not a number.
        """
        value = self.get(key, default)
        if value is None:
            return value
        try:
            result = float(value)
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"the rendezvous config '{key}={value}' is not a valid number"
            ) from None
        if result < 0:
            raise ConfigurationError(f"the rendezvous config '{key}={value}' must not be negative")
        return result


@dataclass(frozen=True)
class RendezvousStoreInfo:
    """Where the workers of a round find their store (MASTER_ADDR, MASTER_PORT)."""

    master_addr: str
    master_port: int


@dataclass
class RendezvousInfo:
    """What a completed round gives each member.

    Attributes:
        store: a store private to this round.
        rank: this node's rank in the round (0..world_size-1).
        world_size: the number of nodes in the round.
        bootstrap_store_info: where rank 0 hosts the workers' store, when known.
        round: the round number.
    """

    store: Store
    rank: int
    world_size: int
    bootstrap_store_info: RendezvousStoreInfo | None = None
    round: int = 0


@dataclass(frozen=True)
class MemberSnapshot:
    """One member of a round as the status view shows it."""

    rank: int
    node_id: str
    addr: str
    host: str
    pid: int
    local_world_size: int
    heartbeat: int | None
    state: str = ""
    restarts: int = 0


@dataclass(frozen=True)
class RendezvousSnapshot:
    """A read-only picture of a rendezvous, for ``elastic-run status``.

    Heartbeat ages are not here: a single read cannot tell them without comparing
    clocks. The status view reads twice and reports which counters moved.
    """

    run_id: str
    backend: str
    endpoint: str
    round: int
    state: str
    min_nodes: int
    max_nodes: int
    closed: bool
    members: tuple[MemberSnapshot, ...] = ()
    waiting: tuple[MemberSnapshot, ...] = ()
    arrivals: int = 0
    lost: tuple[str, ...] = ()
    events: tuple[dict[str, Any], ...] = field(default_factory=tuple)


class RendezvousHandler(ABC):
    """The interface every rendezvous handler implements (as torch's)."""

    @abstractmethod
    def get_backend(self) -> str:
        """Return the backend name."""

    @abstractmethod
    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and block until it completes.

        Raises:
            RendezvousClosedError: the rendezvous is closed.
            RendezvousTimeoutError: the round did not complete within join_timeout.
            RendezvousConnectionError: the backend cannot be reached.
            RendezvousStateError: the stored state is not ours.
        """

    @abstractmethod
    def is_closed(self) -> bool:
        """Return whether the rendezvous is closed."""

    @abstractmethod
    def set_closed(self) -> None:
        """Close the rendezvous: no new round forms, every node sees it."""

    @abstractmethod
    def num_nodes_waiting(self) -> int:
        """Return how many nodes wait at the door of the completed round."""

    @abstractmethod
    def get_run_id(self) -> str:
        """Return the run id."""

    def shutdown(self) -> bool:
        """Leave the rendezvous without closing it. Returns True when done cleanly."""
        return True

    @property
    def use_agent_store(self) -> bool:
        """Whether workers use the store the agent hosts (TORCHELASTIC_USE_AGENT_STORE)."""
        return False

    def has_lost_member(self) -> bool:
        """Return whether the current round lost a member (beyond torch's API)."""
        return False

    def snapshot(self) -> RendezvousSnapshot | None:
        """Return a read-only picture of the rendezvous, or None when not supported."""
        return None
