"""The agent's public shapes, named as torch.distributed.elastic.agent.server names them.

``ElasticAgent`` is the interface (``run(role) -> RunResult``, ``get_worker_group``);
``SimpleElasticAgent`` is the loop every node runs:

    rendezvous -> assign ranks -> start workers -> monitor every monitor_interval
        -> a local worker failed:    end the round (counts one restart if this node failed
                                     first), stop workers, rendezvous again
        -> nodes wait / member lost: stop workers, rendezvous again (counts nothing)
        -> every local worker ok:    exit barrier, close the rendezvous as succeeded
        -> the rendezvous closed:    stop workers, leave

``LocalElasticAgent`` (``local.py``) fills in how workers are started and stopped.
"""

from __future__ import annotations

import enum
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from elastic_run.agent.settings import table as settings
from elastic_run.agent.workers.failures import FailureRecord
from elastic_run.rendezvous.api import RendezvousHandler

if TYPE_CHECKING:
    from torch.distributed import Store

__all__ = [
    "ElasticAgent",
    "RunResult",
    "Worker",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerState",
]


class WorkerState(str, enum.Enum):
    """The state of a worker group (as torch's)."""

    UNKNOWN = "UNKNOWN"
    INIT = "INIT"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @staticmethod
    def is_running(state: WorkerState) -> bool:
        """Whether workers in ``state`` are (still) running."""
        return state in (WorkerState.HEALTHY, WorkerState.UNHEALTHY)


@dataclass
class WorkerSpec:
    """What to run on this node (torch's WorkerSpec, field for field).

    Attributes:
        role: the workers' role name (ROLE_NAME).
        local_world_size: how many workers this node runs.
        rdzv_handler: the rendezvous this node joins.
        fn: deprecated alias of ``entrypoint`` (as in torch).
        entrypoint: the program (``sys.executable`` for a script, with ``args`` holding
            ``-u script ...``), or a Python callable run in each worker process (its return
            value comes back in ``RunResult.return_values``).
        args: the program's arguments, or the callable's (``${local_rank}`` in a program's
            arguments is replaced per worker).
        max_restarts: how many worker failures of the job are restarted.
        monitor_interval: seconds between checks of the workers.
        master_port: the workers' store port (static rendezvous; None: the agent picks).
        master_addr: the workers' store address (static rendezvous).
        local_addr: the address this node advertises for the workers' store.
        event_log_handler: torch's event log handler name (``null``: none).
        numa_options: NUMA binding options (None: no binding).
        duplicate_stdout_filters: stdout lines matching any of these also go to a second file.
        duplicate_stderr_filters: stderr lines matching any of these also go to a second file.
        virtual_local_rank: every worker sees LOCAL_RANK=0 (its device comes from
            CUDA_VISIBLE_DEVICES).
    """

    role: str
    local_world_size: int
    rdzv_handler: RendezvousHandler
    fn: Callable[..., Any] | None = None
    entrypoint: Callable[..., Any] | str | None = None
    args: tuple[Any, ...] = ()
    max_restarts: int = 3  # torch's WorkerSpec default; torchrun's --max-restarts is 0
    monitor_interval: float = settings.MONITOR_INTERVAL.default
    master_port: int | None = None
    master_addr: str | None = None
    local_addr: str | None = None
    event_log_handler: str = settings.EVENT_LOG_HANDLER.default
    numa_options: Any = None
    duplicate_stdout_filters: list[str] | None = None
    duplicate_stderr_filters: list[str] | None = None
    virtual_local_rank: bool = settings.VIRTUAL_LOCAL_RANK.default

    def __post_init__(self) -> None:
        if self.local_world_size <= 0:
            raise ValueError(f"local_world_size must be positive, got {self.local_world_size}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must not be negative, got {self.max_restarts}")
        if not self.monitor_interval > 0:
            raise ValueError(f"monitor_interval must be positive, got {self.monitor_interval}")
        if self.fn is not None:
            if self.entrypoint is None:
                self.entrypoint = self.fn
        if self.entrypoint is None:
            raise ValueError("WorkerSpec needs an entrypoint (a program path or a callable)")
        self.args = tuple(self.args)

    def get_entrypoint_name(self) -> str:
        """The entrypoint's name: the program's file name, or the callable's qualified name."""
        entry = self.entrypoint
        if isinstance(entry, str):
            return os.path.basename(entry)
        return str(getattr(entry, "__qualname__", repr(entry)))


@dataclass
class Worker:
    """One worker of this node (ranks are -1 until a round assigns them).

    Attributes:
        local_rank: its rank on this node.
        global_rank: its rank in the job (RANK).
        role_rank: its rank among the workers of its role (ROLE_RANK).
        world_size: the number of workers in the job (WORLD_SIZE).
        role_world_size: the number of workers of its role (ROLE_WORLD_SIZE).
        id: its pid once started.
    """

    local_rank: int
    global_rank: int = -1
    role_rank: int = -1
    world_size: int = -1
    role_world_size: int = -1
    id: int | None = None


@dataclass
class WorkerGroup:
    """This node's workers for one spec, and where they stand in the current round.

    Attributes:
        spec: what they run.
        workers: one Worker per local rank.
        store: the round's private store (None before the first round).
        group_rank: this node's rank in the round (GROUP_RANK; None before the first).
        group_world_size: the number of nodes in the round (None before the first).
        state: the group's state.
        master_addr: where the workers' store runs.
        master_port: its port.
        round: the rendezvous round.
    """

    spec: WorkerSpec
    workers: list[Worker] = field(default_factory=list)
    store: Store | None = None
    group_rank: int | None = None
    group_world_size: int | None = None
    state: WorkerState = WorkerState.INIT
    master_addr: str | None = None
    master_port: int | None = None
    round: int = -1

    def __post_init__(self) -> None:
        if not self.workers:
            self.workers = [Worker(local_rank=i) for i in range(self.spec.local_world_size)]


@dataclass
class RunResult:
    """How a run ended (as torch's).

    Attributes:
        state: SUCCEEDED, FAILED or STOPPED.
        return_values: each succeeded worker's return value, by global rank: what a callable
            entrypoint returned; None for a program (as torch).
        failures: each failed worker (a ``ProcessFailure``), by global rank.
        exit_code: the process exit code the CLI uses (0, 1, 3, 4, 128+N).
        reason: one line saying why the run ended, when it did not succeed.
    """

    state: WorkerState
    return_values: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, FailureRecord] = field(default_factory=dict)
    exit_code: int = 0
    reason: str = ""

    def is_failed(self) -> bool:
        """Whether the run failed."""
        return self.state == WorkerState.FAILED


class ElasticAgent(ABC):
    """An agent that runs one node's workers of an elastic job."""

    @abstractmethod
    def run(self, role: str = settings.ROLE.default) -> RunResult:
        """Run the job on this node until it succeeds, fails or is stopped."""

    @abstractmethod
    def get_worker_group(self, role: str = settings.ROLE.default) -> WorkerGroup:
        """Return this node's worker group."""
