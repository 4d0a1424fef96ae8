"""The launch configuration: parsed once at the edge (CLI, SLURM), frozen, passed down.

Two frozen objects, both shaped by the settings table (:mod:`elastic_run.agent.settings.table`):
:class:`AgentOptions`, what elastic-run's agent does beyond torch's ``LocalElasticAgent`` (each
field's default is its row's), and :class:`LaunchConfig`, every setting's effective value for one
node of a job, one attribute per row (the row's ``attribute``), plus what the CLI works out from
them (the node counts, the run id, the rendezvous config). :meth:`LaunchConfig.arguments` hands
the values to ``WorkerSpec``, ``LocalElasticAgent``, ``AgentOptions`` and ``ProgressOptions`` by a
loop over the rows.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastic_run.agent.node_check.device_request import NOTHING, DeviceRequest
from elastic_run.agent.progress.config import ProgressOptions
from elastic_run.agent.rules.progress.beats import HangRule
from elastic_run.agent.settings import table as settings
from elastic_run.agent.settings.setting import Target
from elastic_run.agent.settings.streams import Std, StdSpec
from elastic_run.agent.settings.table import (
    DEFAULT_SIGNALS,
    TORCHELASTIC_ENABLE_FILE_TIMER,
    TORCHELASTIC_HEALTH_CHECK_PORT,
    TORCHELASTIC_TIMER_FILE,
)

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
        max_node_failures: failures charged to this node, with different ranks, that exclude
            it (``--max-node-failures``).
        node_check: check this node before it joins, and before a suspect node rejoins.
        node_check_timeout_s: the whole node check's bound.
        node_check_cmd: the user's own check (a shell command; None: none).
        node_devices: the devices the flags ask of this node, for the node check.
        link_check: ``off``, ``warn`` or ``exclude`` (``--link-check``).
    """

    signals: tuple[signal.Signals, ...] = settings.SIGNALS_TO_HANDLE.default
    watchdog: bool = settings.WATCHDOG.default
    timer_file: str | None = settings.TIMER_FILE.default
    health_check_port: int | None = settings.HEALTH_CHECK_PORT.default
    health_check_addr: str = settings.HEALTH_CHECK_ADDR.default
    health_check_timeout_s: float = settings.HEALTH_CHECK_TIMEOUT.default
    extra_env: tuple[tuple[str, str], ...] = ()
    base_env: tuple[tuple[str, str], ...] | None = None
    progress: ProgressOptions = field(default_factory=ProgressOptions)
    duplicate_stdout_filters: tuple[str, ...] = settings.DUPLICATE_STDOUT_FILTERS.default
    duplicate_stderr_filters: tuple[str, ...] = settings.DUPLICATE_STDERR_FILTERS.default
    virtual_local_rank: bool = settings.VIRTUAL_LOCAL_RANK.default
    numa_binding: str | None = settings.NUMA_BINDING.default
    warm_start: bool = settings.WARM_START.default
    preload: tuple[str, ...] = settings.PRELOAD.default
    max_node_failures: int = settings.MAX_NODE_FAILURES.default
    node_check: bool = settings.NODE_CHECK.default
    node_check_timeout_s: float = settings.NODE_CHECK_TIMEOUT.default
    node_check_cmd: str | None = settings.NODE_CHECK_CMD.default
    node_devices: DeviceRequest = NOTHING
    link_check: str = settings.LINK_CHECK.default


@dataclass(frozen=True)
class LaunchConfig:
    """Every setting's effective value for one node of a job (one attribute per row of the
    settings table, named by the row's ``attribute``), and what the CLI works out from them.

    No attribute has a default: the CLI builds the whole config from the table at once
    (``cli/options/launch_config.py``), so a default lives in the table alone.

    Attributes (beyond the rows'):
        entrypoint: the SCRIPT argument.
        args: the script's arguments.
        min_nodes: the fewest nodes a round completes with (``--nnodes``, Slurm, --standalone).
        max_nodes: the most nodes a round admits.
        extra_env: variables set in every worker's environment.
        base_env: the environment workers start from (None: the agent's, when they start).
        python_exec: the workers' interpreter (None: ``$PYTHON_EXEC`` or this one).
    """

    entrypoint: str
    args: tuple[str, ...]
    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    rdzv_backend: str
    rdzv_endpoint: str
    run_id: str
    rdzv_configs: tuple[tuple[str, str], ...]
    standalone: bool
    max_restarts: int
    monitor_interval_s: float
    start_method: str
    role: str
    module: bool
    no_python: bool
    run_path: bool
    log_dir: Path | None
    redirects: StdSpec
    tee: StdSpec
    local_ranks_filter: frozenset[int] | None
    node_rank: int
    master_addr: str
    master_port: int
    local_addr: str | None
    signals_to_handle: tuple[signal.Signals, ...]
    shutdown_timeout_s: float
    logs_specs: str | None
    event_log_handler: str
    duplicate_stdout_filters: tuple[str, ...]
    duplicate_stderr_filters: tuple[str, ...]
    numa_binding: str | None
    virtual_local_rank: bool
    watchdog: bool
    warm_start: bool
    preload: tuple[str, ...]
    health_check_port: int | None
    health_check_addr: str
    health_check_timeout_s: float
    live: bool | None
    exit_barrier_timeout_s: float
    hang_timeout: HangRule
    straggler_factor: float
    max_no_progress_restarts: int
    max_node_failures: int
    node_check: bool
    node_check_timeout_s: float
    node_check_cmd: str | None
    link_check: str
    auto_progress: bool
    script_exit_timeout_s: float | None
    timer_file: str | None
    log_line_prefix_template: str | None
    launcher_error_file: str | None
    extra_env: tuple[tuple[str, str], ...] = ()
    rdzv_conf: RendezvousConf | None = None  # rdzv_configs parsed once, by the CLI
    node_devices: DeviceRequest = NOTHING  # what --nproc-per-node asks, for the node check
    base_env: tuple[tuple[str, str], ...] | None = None
    python_exec: str | None = None

    def arguments(self, target: Target) -> dict[str, Any]:
        """The keyword arguments ``target`` takes from this config, by the table's rows.

        Args:
            target: ``WorkerSpec``, ``LocalElasticAgent``, ``AgentOptions`` or
                ``ProgressOptions`` (see :class:`~elastic_run.agent.settings.setting.Target`).

        Returns:
            ``{field or keyword at the target: value}``, one per row that goes there.
        """
        return settings.arguments(target, self)

    def agent_options(self) -> AgentOptions:
        """The agent's options: every row that goes to ``AgentOptions`` or ``ProgressOptions``,
        with the workers' environment."""
        return AgentOptions(
            **self.arguments(Target.AGENT_OPTIONS),
            progress=ProgressOptions(**self.arguments(Target.PROGRESS)),
            extra_env=self.extra_env,
            base_env=self.base_env,
            node_devices=self.node_devices,
        )
