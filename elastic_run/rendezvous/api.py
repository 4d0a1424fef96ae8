"""The rendezvous API: handler interface, parameters and what a round hands out.

Names and call shapes follow torch.distributed.elastic.rendezvous so a torch user's
code ports; the implementation is ours.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.settings import (
    RendezvousConf,
    RendezvousSettings,
    check_nnodes,
    parse_bool,
)

if TYPE_CHECKING:
    from torch.distributed import Store

__all__ = [
    "AgentRendezvous",
    "Assignment",
    "BackendLink",
    "InterruptibleRendezvous",
    "LivenessReport",
    "MemberSnapshot",
    "RendezvousHandler",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousSnapshot",
    "RendezvousStoreInfo",
    "RoundEnd",
    "RoundPoll",
    "SupportedClosedReason",
]


class RendezvousParameters:
    """What a handler is built from: backend, endpoint, run id, node counts and config.

    Args:
        backend: the backend name (``c10d``, ``etcd``, ``static``...).
        endpoint: ``host[:port]`` of the backend (several, comma-separated, for etcd).
        run_id: the job's id; every node of one job passes the same.
        min_nodes: the fewest nodes a round may complete with.
        max_nodes: the most nodes a round admits.
        local_addr: the address this node advertises (default: its FQDN).
        **kwargs: backend configuration (``--rdzv-conf``), kept as given in :attr:`config`
            and parsed once, on first use (:attr:`settings`).

    Raises:
        ConfigurationError: when the backend name is empty or the node counts are not
            ``1 <= min <= max <= MAX_NODES`` (``settings.check_nnodes``; a ``ValueError``).
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
        check_nnodes(min_nodes, max_nodes, "min_nodes:max_nodes")
        self.backend = backend
        self.endpoint = endpoint
        self.run_id = run_id
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.local_addr = local_addr
        self.config: dict[str, Any] = dict(kwargs)
        self._parsed: tuple[dict[str, Any], RendezvousSettings] | None = None

    @classmethod
    def from_conf(
        cls,
        backend: str,
        endpoint: str,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None,
        conf: RendezvousConf,
    ) -> RendezvousParameters:
        """Parameters whose config was parsed already at the edge (the CLI's ``--rdzv-conf``):
        :attr:`config` holds the pairs as given, :attr:`settings` the parse, not parsed again.

        Raises:
            ConfigurationError: as the constructor.
        """
        params = cls(
            backend, endpoint, run_id, min_nodes, max_nodes, local_addr, **dict(conf.given)
        )
        params._parsed = (dict(params.config), conf.settings)
        return params

    @property
    def settings(self) -> RendezvousSettings:
        """The config's one parse (``RendezvousSettings.parse``), made on first use and kept.

        The handler, the registry's early check and every backend read this object. A config
        changed after it was parsed (torch's ``config`` is a plain dict) is parsed again.

        Raises:
            ConfigurationError: a known key has a bad value (a ``ValueError``).
        """
        parsed = self._parsed
        if parsed is None or parsed[0] != self.config:
            parsed = (dict(self.config), RendezvousSettings.parse(self.config, self.backend))
            self._parsed = parsed
        return parsed[1]

    def get(self, key: str, default: Any = None) -> Any:
        """Return the config value of ``key``, or ``default``."""
        return self.config.get(key, default)

    def get_as_bool(self, key: str, default: bool | None = None) -> bool | None:
        """Return ``key`` as a bool (1/0, true/false, t/f, yes/no, y/n in any case).

        Raises:
            ConfigurationError: when the value is none of those (``settings.parse_bool``).
        """
        value = self.get(key, default)
        return None if value is None else parse_bool(value, f"--rdzv-conf {key}")

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

    MASTER_ADDR_KEY: ClassVar[str] = "MASTER_ADDR"
    MASTER_PORT_KEY: ClassVar[str] = "MASTER_PORT"
    master_addr: str
    master_port: int

    @staticmethod
    def build(
        rank: int, store: Store, local_addr: str | None, server_port: int | None = None
    ) -> RendezvousStoreInfo:
        """Agree on the workers' store address through ``store`` (torch's ``build``).

        Rank 0 publishes its address (``local_addr`` or its FQDN) and ``server_port`` (or a
        free port of this host) under :attr:`MASTER_ADDR_KEY` / :attr:`MASTER_PORT_KEY`; every
        rank then reads them (a blocking store read).

        Raises:
            RendezvousConnectionError: the store failed, or the published values are not an
                address and a port.
        """
        return _build_store_info(rank, store, local_addr, server_port)


@dataclass
class RendezvousInfo:
    """What a completed round gives each member.

    Attributes:
        store: a store private to this round.
        rank: this node's rank in the round (0..world_size-1).
        world_size: the number of nodes in the round.
        bootstrap_store_info: the workers' store address every node of the round agreed on
            (rank 0's, as it published it: torch's), or None when the agent hosts its
            workers' store itself (ours).
        round: the round number.
    """

    store: Store
    rank: int
    world_size: int
    bootstrap_store_info: RendezvousStoreInfo | None = None
    round: int = 0


@dataclass(frozen=True)
class MemberSnapshot:
    """One member of a round as the status view shows it (``health``: ``ok``, ``suspect (1 of
    2: ...)``, ``excluded: ...`` as the node published it, or ``spare`` for a node waiting at a
    full round)."""

    rank: int
    node_id: str
    addr: str
    host: str
    pid: int
    local_world_size: int
    heartbeat: int | None
    state: str = ""
    restarts: int = 0
    health: str = "ok"


@dataclass(frozen=True)
class RendezvousSnapshot:
    """A read-only picture of a rendezvous, for ``elastic-run status``.

    Heartbeat ages are not here: a single read cannot tell them without comparing
    clocks. The status view reads twice and reports which counters moved. ``problems``
    names each key whose value could not be decoded (the rest is shown). ``excluded``: the
    nodes excluded so far, one line each (``host: reason``).
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
    closed_reason: str | None = None
    problems: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()


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


# -- the agent's contract with its rendezvous, beyond torch's RendezvousHandler -------------


@dataclass(frozen=True)
class Assignment:
    """One member's place in a completed round, computed from the seal alone.

    Attributes:
        rank: the node's rank (GROUP_RANK).
        world_size: the number of nodes.
        rank_offset: the global rank of this node's first worker.
        total_workers: WORLD_SIZE, the sum of every node's local world size.
        role_offset: the role rank of this node's first worker.
        role_total: ROLE_WORLD_SIZE.
        successor_index: the arrival index this member watches (a ring); -1 alone.
        restart_count: the job's restart count (TORCHELASTIC_RESTART_COUNT), the same for
            every member of the round.
        links_untimed: how many of the round's members' links were never timed (the same
            for every member: the round's links are timed when it is above 0).
    """

    rank: int
    world_size: int
    rank_offset: int
    total_workers: int
    role_offset: int
    role_total: int
    successor_index: int = -1
    restart_count: int = 0
    links_untimed: int = 0


@dataclass(frozen=True)
class RoundEnd:
    """Who ended a round and why (for the agent's ``membership.changed`` event).

    Attributes:
        cause: ``member_lost``, ``worker_failure``, ``rejoin`` or ``liveness_lost``.
        ended_by: the node id that ended it.
        lost: the node ids judged dead, for ``member_lost``.
    """

    cause: str
    ended_by: str
    lost: tuple[str, ...] = ()


@dataclass(frozen=True)
class RoundPoll:
    """What one read of the store says about this node's round (the agent's safety net).

    Attributes:
        closed: why the job is closed (``closed``, ``succeeded``, ``failed``), None while open.
        round_over: the round this node is a member of has ended.
        member_lost: it ended because a member was judged dead.
        nodes_waiting: how many nodes wait at the door of the round.
        end_cause: why the round ended, as recorded by the node that ended it (None: unknown
            or still running).
        spares: nodes waiting at the door beyond what a next round has room for (the round
            is at MAX): they replace a member that is lost or leaves.
        learned_by: how this node first learned that its round ended or should end (closed,
            over, nodes waiting): ``notice`` (a member told it, and one store read confirmed
            it), ``look`` (its own read of the store), ``verdict`` (it judged a member lost);
            None while nothing ends the round.
        notice_from: the node id whose notice it was (``learned_by == "notice"``), else "".
        notice_at: when that notice arrived on this node's port (epoch seconds), else None.
        learned_at: when this node learned it (epoch seconds: the read that confirmed a
            notice, its own look, its verdict), None while nothing ends the round.
    """

    closed: str | None = None
    round_over: bool = False
    member_lost: bool = False
    nodes_waiting: int = 0
    end_cause: str | None = None
    spares: int = 0
    learned_by: str | None = None
    notice_from: str = ""
    notice_at: float | None = None
    learned_at: float | None = None


@dataclass(frozen=True)
class LivenessReport:
    """How this node's own liveness stands (no I/O: what the heartbeat thread recorded).

    Attributes:
        since_ok_s: seconds since this node's last successful heartbeat (0 before the first).
        budget_s: how long peers let a heartbeat stand still before judging a node gone.
        error: the error of the last heartbeat attempt, when it failed.
    """

    since_ok_s: float
    budget_s: float
    error: str | None = None

    @property
    def is_lost(self) -> bool:
        """Whether the peers have (or may have) judged this node gone by now."""
        return self.since_ok_s >= self.budget_s


SupportedClosedReason = Literal["closed", "succeeded", "failed"]


@runtime_checkable
class InterruptibleRendezvous(Protocol):
    """A rendezvous whose blocking calls the agent can interrupt (a signal arrived).

    Both of ours implement it (the static one too); a torch-style handler that does not makes
    a signal wait until its blocking call returns.
    """

    def set_interrupt(self, is_interrupted: Callable[[], bool] | None) -> None:
        """Make blocking calls give up (``RendezvousInterruptedError``) once this returns True."""


@runtime_checkable
class BackendLink(Protocol):
    """A handler whose backend connection the launcher checks before the agent starts and
    releases after it ends (the dynamic handler; a torch-style handler has neither)."""

    def check_reachable(self, timeout_s: float) -> None:
        """Raise ``RendezvousConnectionError`` unless the backend answers within ``timeout_s``."""

    def release(self) -> None:
        """Close the backend's connections."""


@runtime_checkable
class AgentRendezvous(InterruptibleRendezvous, Protocol):
    """What the elastic agent needs of a rendezvous beyond torch's :class:`RendezvousHandler`.

    The dynamic handler implements it; a torch-style handler that does not still runs under
    the agent, with ranks exchanged through the round's store and without the extras (no
    change callback, no telemetry, no liveness report). mypy checks the implementation
    against this protocol.
    """

    def set_local_info(self, local_world_size: int, role: str) -> None:
        """Tell the rendezvous how many workers this node runs and their role (before joining)."""

    def set_change_callback(self, callback: Callable[[], None] | None) -> None:
        """Have ``callback`` called (from a rendezvous thread) when this node's round changes."""

    def avoid_rank(self, rank: int | None) -> None:
        """Ask not to be given group rank ``rank`` in the next round (None: no wish)."""

    def note_links_untimed(self, untimed: bool) -> None:
        """Say in this node's next arrivals whether its links are still to be timed (True: it
        takes part in link checks and none of its checks completed yet)."""

    @property
    def min_nodes(self) -> int:
        """The job's MIN: the fewest nodes a round completes with."""

    @property
    def node_id(self) -> str:
        """This node's id in the rendezvous (unique per agent process)."""

    @property
    def assignment(self) -> Assignment | None:
        """This node's place in its current round (worker rank offsets), or None."""

    @property
    def advertised_addr(self) -> str:
        """The address this node advertises to the other nodes (for the workers' store)."""

    @property
    def is_hosting(self) -> bool:
        """Whether this node hosts the rendezvous store itself (it must leave last)."""

    @property
    def endpoint(self) -> str:
        """Where the backend is, for messages."""

    def poll(self) -> RoundPoll:
        """Read the store once: closed, round over, nodes waiting."""

    def round_end(self) -> RoundEnd | None:
        """Who ended this node's round and why (one store read), None while it runs."""

    def report_failure(self, last_restart: bool = False) -> bool:
        """End the round for this node's worker failure; True when this node ended it first.

        A member of the round that was lost meanwhile (its workers' peers fail first) ends it
        instead, and the failure does not count (False). ``last_restart``: the failure would
        end the job, so a verdict is waited for even where the members cannot all be asked.
        """

    def leave_round(self, reason: str) -> None:
        """End this node's round for ``reason`` (first writer wins), before re-rendezvousing."""

    def others_alive(self) -> int:
        """How many other nodes could still form a round with this job: the nodes of its round
        and of the round before (members, and those at the door) whose heartbeat stands."""

    def liveness(self) -> LivenessReport:
        """This node's own heartbeat standing (no I/O)."""

    def publish_state(self, state: str, restarts: int, message: str = "") -> None:
        """Publish this agent's state for ``status`` (best-effort, never raises)."""

    def publish_event(
        self, kind: str, message: str, fields: Mapping[str, Any] | None = None
    ) -> None:
        """Publish an event for ``status`` (best-effort, never raises)."""

    def closed_reason(self) -> str | None:
        """Why the job is closed, or None while it is open (one store read)."""

    def set_closed(self, reason: SupportedClosedReason = "closed") -> None:
        """Close the rendezvous, recording why (first close wins)."""

    def snapshot(self) -> RendezvousSnapshot | None:
        """A read-only picture of the rendezvous, for views."""


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _build_store_info(
    rank: int, store: Store, local_addr: str | None, server_port: int | None
) -> RendezvousStoreInfo:
    import socket

    from elastic_run.rendezvous.errors import RendezvousConnectionError

    try:
        if rank == 0:
            store.set(RendezvousStoreInfo.MASTER_ADDR_KEY, local_addr or socket.getfqdn())
            store.set(RendezvousStoreInfo.MASTER_PORT_KEY, str(server_port or _free_port()))
        # One multi_get (a TCPStore waits for the keys, then reads both: two requests where two
        # gets make four); a store without one reads them one by one.
        wanted = [RendezvousStoreInfo.MASTER_ADDR_KEY, RendezvousStoreInfo.MASTER_PORT_KEY]
        multi_get = getattr(store, "multi_get", None)
        try:
            values = list(multi_get(wanted)) if multi_get is not None else None
        except NotImplementedError:
            values = None
        if values is None:
            values = [store.get(key) for key in wanted]
        addr, port_text = (bytes(v).decode() for v in values)
    except (RuntimeError, OSError, UnicodeDecodeError) as exc:
        raise RendezvousConnectionError(
            f"cannot agree on the workers' store address through the rendezvous store: {exc}"
        ) from exc
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise RendezvousConnectionError(
            f"the rendezvous store holds no valid {RendezvousStoreInfo.MASTER_PORT_KEY}: "
            f"{port_text!r}"
        )
    return RendezvousStoreInfo(master_addr=addr, master_port=int(port_text))
