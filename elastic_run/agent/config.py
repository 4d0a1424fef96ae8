"""The launch configuration: parsed once at the edge (CLI, SLURM), frozen, passed down."""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from elastic_run.agent.progress.config import ProgressOptions

if TYPE_CHECKING:
    from elastic_run.rendezvous.settings import RendezvousConf

__all__ = [
    "DEFAULT_SIGNALS",
    "TORCHELASTIC_ENABLE_FILE_TIMER",
    "TORCHELASTIC_HEALTH_CHECK_PORT",
    "TORCHELASTIC_TIMER_FILE",
    "AgentOptions",
    "LaunchConfig",
    "Std",
    "StdSpec",
]

# The environment variables torchrun reads for the agent (the CLI reads them into LaunchConfig).
TORCHELASTIC_ENABLE_FILE_TIMER = "TORCHELASTIC_ENABLE_FILE_TIMER"
TORCHELASTIC_TIMER_FILE = "TORCHELASTIC_TIMER_FILE"
TORCHELASTIC_HEALTH_CHECK_PORT = "TORCHELASTIC_HEALTH_CHECK_PORT"

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
)


class Std(enum.IntFlag):
    """Which standard streams go to files (redirect) or to both files and console (tee)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3

    @classmethod
    def from_str(cls, vm: str) -> Std | dict[int, Std]:
        """Parse torch's form: ``3`` for every rank, or ``0:1,1:2`` per local rank.

        Raises:
            ValueError: the text is neither.
        """
        text = vm.strip()
        if not text:
            _bad_std(vm)  # torch's: an empty text is not a value either
        if ":" not in text:
            return cls(int(text)) if text in ("0", "1", "2", "3") else _bad_std(vm)
        out: dict[int, Std] = {}
        for item in text.split(","):
            rank, _, value = item.partition(":")
            if not rank.strip().isdigit() or value.strip() not in ("0", "1", "2", "3"):
                _bad_std(vm)
            out[int(rank)] = cls(int(value))
        return out


def _bad_std(vm: str) -> Std:
    raise ValueError(f"{vm!r} is not 0..3 or LOCAL_RANK:0..3 items separated by commas")


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
class AgentOptions:
    """What elastic-run's agent does beyond torch's LocalElasticAgent, fixed for the run.

    Attributes:
        signals: the signals the agent handles (forwarded to the workers; all but SIGUSR1 and
            SIGUSR2 stop the job).
        watchdog: run the file-timer watchdog (TORCHELASTIC_ENABLE_FILE_TIMER).
        timer_file: its FIFO (default: in the run's log directory).
        health_check_port: serve /healthz, /status, /metrics here (None: no server).
        health_check_addr: the health server's address.
        health_check_timeout_s: how long without progress before /healthz fails.
        extra_env: variables set in every worker's environment.
        base_env: the environment workers start from (None: the agent's, when they start).
        progress: hang and straggler verdicts on the workers' progress beats.
        duplicate_stdout_filters: lines of teed stdout containing one of these strings also go
            to ``attempt_<n>/filtered_stdout.log`` (torchrun's --duplicate-stdout-filters).
        duplicate_stderr_filters: the same for stderr.
        virtual_local_rank: every worker sees LOCAL_RANK=0 and only its own device through
            CUDA_VISIBLE_DEVICES (torchrun's --virtual-local-rank).
        numa_binding: bind each worker to the CPUs near its GPU: node, socket, exclusive or
            core-complex (torchrun's --numa-binding; None: no binding).
        warm_start: fork Python workers from a per-node zygote that has torch imported.
        preload: modules the zygote imports after torch.
    """

    signals: tuple[signal.Signals, ...] = DEFAULT_SIGNALS
    watchdog: bool = False
    timer_file: str | None = None
    health_check_port: int | None = None
    health_check_addr: str = "127.0.0.1"
    health_check_timeout_s: float = 60.0
    extra_env: tuple[tuple[str, str], ...] = ()
    base_env: tuple[tuple[str, str], ...] | None = None
    progress: ProgressOptions = field(default_factory=ProgressOptions)
    duplicate_stdout_filters: tuple[str, ...] = ()
    duplicate_stderr_filters: tuple[str, ...] = ()
    virtual_local_rank: bool = False
    numa_binding: str | None = None
    warm_start: bool = False
    preload: tuple[str, ...] = ()


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
    rdzv_conf: RendezvousConf | None = None  # rdzv_configs parsed once, by the CLI
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
    base_env: tuple[tuple[str, str], ...] | None = None
    progress: ProgressOptions = field(default_factory=ProgressOptions)
    # torchrun 2.13's further flags (see AgentOptions for their meaning).
    logs_specs: str | None = None
    event_log_handler: str = "null"
    log_line_prefix_template: str | None = None
    duplicate_stdout_filters: tuple[str, ...] = ()
    duplicate_stderr_filters: tuple[str, ...] = ()
    virtual_local_rank: bool = False
    numa_binding: str | None = None
    launcher_error_file: str | None = None
    warm_start: bool = False
    preload: tuple[str, ...] = ()
