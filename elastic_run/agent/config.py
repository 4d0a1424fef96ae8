"""The launch configuration: parsed once at the edge (CLI, SLURM), frozen, passed down."""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LaunchConfig", "Std", "StdSpec"]


class Std(enum.IntFlag):
    """Which standard streams go to files (redirect) or to both files and console (tee)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3


@dataclass(frozen=True)
class StdSpec:
    """A --redirects/--tee value: one Std for all local ranks, or one per local rank."""

    default: Std = Std.NONE
    per_rank: tuple[tuple[int, Std], ...] = ()

    def for_rank(self, local_rank: int) -> Std:
        """Return the Std that applies to ``local_rank``."""
        for rank, std in self.per_rank:
            if rank == local_rank:
                return std
        return self.default


@dataclass(frozen=True)
class LaunchConfig:
    """Everything the agent needs to run one node of a job.

    Attributes mirror torchrun's flags; durations carry their unit.
    """

    entrypoint: str
    args: tuple[str, ...] = ()
    min_nodes: int = 1
    max_nodes: int = 1
    nproc_per_node: int = 1
    run_id: str = "none"
    role: str = "default"
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_configs: tuple[tuple[str, str], ...] = ()
    standalone: bool = False
    max_restarts: int = 0
    monitor_interval_s: float = 0.1
    module: bool = False
    no_python: bool = False
    run_path: bool = False
    log_dir: Path | None = None
    redirects: StdSpec = StdSpec()
    tee: StdSpec = StdSpec()
    local_ranks_filter: frozenset[int] | None = None
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    local_addr: str | None = None
    signals_to_handle: tuple[signal.Signals, ...] = (
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
    )
    shutdown_timeout_s: float = 30.0
    watchdog: bool = False
    timer_file: str | None = None
    health_check_port: int | None = None
    health_check_addr: str = "127.0.0.1"
    health_check_timeout_s: float = 60.0
    live: bool | None = None
    exit_barrier_timeout_s: float = 300.0
    python_exec: str | None = None
    extra_env: tuple[tuple[str, str], ...] = field(default=())
