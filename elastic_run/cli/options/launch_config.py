"""The run command's configuration: parsed once, checked throughout, frozen into a LaunchConfig.

One concept: click's parameter values, the Slurm allocation's defaults and the few environment
variables torchrun reads (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, ``TORCHELASTIC_HEALTH_CHECK_PORT``,
``TORCHELASTIC_ENABLE_FILE_TIMER``, ``TORCHELASTIC_TIMER_FILE``) become one
:class:`~elastic_run.agent.config.LaunchConfig`, plus what ``--print-config`` shows and the
notices to print. Every check of the user's input happens here (through
:mod:`elastic_run.cli.options.values`, :mod:`elastic_run.cli.options.rdzv_conf` and
:mod:`elastic_run.cli.options.entrypoint`), before any process starts or any directory is made: bad
input raises :class:`ConfigurationError`, which the CLI prints as one line and exits 2.

The run id is made safe for a path (:func:`~elastic_run.cli.options.values.safe_run_id`) and the safe
id is the run id everywhere, so every node that passes the same ``--rdzv-id`` agrees.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_run.agent.config import LaunchConfig
from elastic_run.agent.progress.config import ProgressOptions
from elastic_run.cli.options.entrypoint import check_entrypoint
from elastic_run.cli.options.rdzv_conf import parse_rdzv_conf, validate_rdzv_conf
from elastic_run.cli.options.values import (
    MAX_RESTARTS,
    check_count,
    check_endpoint_ports,
    check_port,
    check_seconds,
    parse_int,
    parse_local_ranks,
    parse_nproc,
    parse_seconds,
    parse_signals,
    parse_std,
    safe_run_id,
    shown,
)
from elastic_run.cli.options.warm_default import default_warm_start
from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.settings import MAX_NODES, RendezvousConf, parse_nnodes
from elastic_run.rendezvous.static import TORCHRUN_STATIC_TIMEOUT_S, check_static_nodes

__all__ = [
    "Chosen",
    "ParsedRun",
    "parse_launch_config",
]

_ELASTIC_BACKENDS = ("c10d", "etcd", "etcd-v2", "embedded-etcd")
_SHOWN_IN_PRINT_CONFIG = ("nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id")

Chosen = list[tuple[str, object, str]]


@dataclass(frozen=True)
class ParsedRun:
    """The run command's result of parsing: the config, and what --print-config shows."""

    config: LaunchConfig
    chosen: tuple[tuple[str, object, str], ...]
    notices: tuple[str, ...]


@dataclass(frozen=True)
class _Rendezvous:
    """The rendezvous part of the config, after --standalone, static and the run id."""

    backend: str
    endpoint: str
    run_id: str
    local_addr: str | None
    conf: RendezvousConf
    min_nodes: int
    max_nodes: int


@dataclass(frozen=True)
class _Durations:
    monitor_interval_s: float
    shutdown_timeout_s: float
    health_check_timeout_s: float
    exit_barrier_timeout_s: float


def _apply_slurm_defaults(
    params: dict[str, Any],
    explicit: set[str],
    env: dict[str, str],
    chosen: Chosen,
    notices: list[str],
) -> None:
    """Fill the gaps the user left from the Slurm allocation (explicit flags win)."""
    from elastic_run.cli.slurm.allocation import slurm_defaults

    elastic_min = params.get("elastic_min")
    if elastic_min is not None:
        check_count(elastic_min, "--elastic-min", 1, MAX_NODES)
    names = ("rdzv_id", "rdzv_backend", "rdzv_endpoint", "nproc_per_node", "nnodes")
    given: dict[str, object] = {k: params[k] for k in names if k in explicit}
    for default in slurm_defaults(env, given=given, elastic_min=elastic_min):
        params[default.name] = default.value
        explicit.add(default.name)
        chosen.append((default.name, default.value, default.reason))
        if default.notice:
            notices.append(default.notice)


def _current_directory() -> Path:
    """Where the workers will start (the agent's directory), which must still exist."""
    try:
        return Path.cwd()
    except OSError as exc:
        raise ConfigurationError(
            f"the current directory cannot be read ({exc.strerror}): was it removed?"
        ) from None


def _count_cuda_devices() -> int:
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def _durations(params: dict[str, Any], env: dict[str, str]) -> _Durations:
    """The float flags, each finite and in range; the shutdown timeout may come from env."""
    shutdown = params["shutdown_timeout"]
    if shutdown is None:
        text = env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
        shutdown = parse_seconds(text, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", allow_zero=True)
    return _Durations(
        monitor_interval_s=check_seconds(params["monitor_interval"], "--monitor-interval"),
        shutdown_timeout_s=check_seconds(shutdown, "--shutdown-timeout", allow_zero=True),
        health_check_timeout_s=check_seconds(
            params["health_check_timeout"], "--health-check-timeout"
        ),
        exit_barrier_timeout_s=check_seconds(
            params["exit_barrier_timeout"], "--exit-barrier-timeout", allow_zero=True
        ),
    )


def _health_port(params: dict[str, Any], env: dict[str, str]) -> int | None:
    port: int | None = params["health_check_port"]
    if port is not None:
        return check_port(port, "--health-check-port")
    text = env.get("TORCHELASTIC_HEALTH_CHECK_PORT", "")
    if not text.strip():
        return None
    return check_port(
        parse_int(text, "TORCHELASTIC_HEALTH_CHECK_PORT"), "TORCHELASTIC_HEALTH_CHECK_PORT"
    )


def _log_dir(text: str | None) -> Path | None:
    """``--log-dir`` as a path, or None (a temporary one).

    The nearest ancestor that exists must be a directory this process may write: nothing is
    created here (the agent makes the directory once the job starts).
    """
    if not text:
        return None
    path = Path(text)
    probe = path
    try:
        while not probe.exists() and probe.parent != probe:
            probe = probe.parent
        writable = probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)
    except OSError as exc:
        raise ConfigurationError(
            f"--log-dir {shown(text)} cannot be used: {exc.strerror}"
        ) from None
    if not writable:
        raise ConfigurationError(f"--log-dir {shown(text)} cannot be written")
    return path


def _warm_start(
    params: dict[str, Any], script: str, preload: tuple[str, ...], cwd: Path, chosen: Chosen
) -> bool:
    """--warm-start, and the --print-config row that says why (the default: warm_default.py)."""
    given = params.get("warm_start")
    if given is not None and not params["no_python"]:
        warm, why = bool(given), "given"
    else:
        warm, why = default_warm_start(
            script,
            module=params["module"],
            no_python=params["no_python"],
            preload=preload,
            cwd=cwd,
        )
    chosen.append(("warm_start", warm, why))
    return warm


def _preload(value: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise ConfigurationError(f"--preload: {name!r} is not a module name")
    return names


def _run_id(params: dict[str, Any], chosen: Chosen, notices: list[str]) -> str:
    """The safe run id; a notice (and a --print-config reason) when it differs from the given."""
    given = str(params["rdzv_id"])
    safe = safe_run_id(given)
    if safe != given:
        chosen.append(("rdzv_id", safe, f"{shown(given)} made safe for a path"))
        notices.append(
            f"--rdzv-id {shown(given)} is not safe in a file path; the run id is {safe!r} "
            "(the same on every node given the same id)"
        )
        params["rdzv_id"] = safe
    return safe


def _rendezvous(
    params: dict[str, Any],
    nodes: tuple[int, int],
    master_port: int | None,
    chosen: Chosen,
    notices: list[str],
) -> _Rendezvous:
    """Backend, endpoint, run id and config after --standalone and the static backend."""
    min_nodes, max_nodes = nodes
    pairs = parse_rdzv_conf(params["rdzv_conf"])
    backend, endpoint = params["rdzv_backend"], params["rdzv_endpoint"]
    local_addr = params["local_addr"]
    check_endpoint_ports(endpoint)
    node_rank = check_count(params["node_rank"], "--node-rank", 0, MAX_NODES - 1)
    if params["standalone"]:
        backend, endpoint = "c10d", "localhost:0"
        run_id = str(uuid.uuid4())
        local_addr = local_addr or "localhost"
        if min_nodes != 1 or max_nodes != 1:
            notices.append("--standalone runs a single node: --nnodes is set to 1")
        min_nodes = max_nodes = 1
        chosen.append(("rdzv", "c10d localhost:<free port>", "--standalone"))
    else:
        run_id = _run_id(params, chosen, notices)
    if backend == "static":
        check_static_nodes(min_nodes, max_nodes, node_rank)
        endpoint = f"{params['master_addr']}:{master_port}"
        pairs = (*pairs, ("rank", str(node_rank)))
        if not {"timeout", "join_timeout"} & {key for key, _ in pairs}:
            # torchrun's launcher gives its static rendezvous 900 s, torch's handler alone 600.
            pairs = (*pairs, ("timeout", f"{TORCHRUN_STATIC_TIMEOUT_S:g}"))
    elif backend == "embedded-etcd":
        _embedded_members(endpoint, run_id, local_addr, chosen)
    elif backend in _ELASTIC_BACKENDS and not endpoint:
        raise ConfigurationError(f"--rdzv-backend {backend} needs --rdzv-endpoint host:port")
    # The one parse, before anything starts; the rendezvous gets it (LaunchConfig.rdzv_conf).
    conf = validate_rdzv_conf(pairs, backend)
    return _Rendezvous(backend, endpoint, run_id, local_addr, conf, min_nodes, max_nodes)


def _embedded_members(endpoint: str, run_id: str, local_addr: str | None, chosen: Chosen) -> None:
    """Check the embedded etcd members and say them (and which one is this host) in
    --print-config."""
    from elastic_run.rendezvous.embedded.cluster import (
        find_local_member,
        local_identity,
        parse_cluster,
    )

    cluster = parse_cluster(endpoint, run_id)
    found = find_local_member(cluster, local_identity(local_addr))
    here = f"this host runs {found[0].name}, bound to {found[1]}" if found else "none on this host"
    chosen.append(
        (
            "etcd_members",
            cluster.describe(),
            f"embedded etcd, peer port = client port + 1, {cluster.majority} of "
            f"{cluster.size} needed; {here}",
        )
    )


def _progress(params: dict[str, Any], explicit: set[str], chosen: Chosen) -> ProgressOptions:
    """--hang-timeout, --straggler-factor, --max-no-progress-restarts, --script-exit-timeout,
    --auto-progress (absent: the defaults), and the --print-config row of automatic beats."""
    auto = bool(params.get("auto_progress", True))
    why = "given" if "auto_progress" in explicit else "default"
    if params.get("no_python") and auto:
        auto, why = False, "--no-python: only Python workers beat by themselves"
    chosen.append(("auto_progress", auto, why))
    no_progress = check_count(
        params.get("max_no_progress_restarts", 0), "--max-no-progress-restarts", 0, MAX_RESTARTS
    )
    try:
        return ProgressOptions.parse(
            str(params.get("hang_timeout", "auto")),
            float(params.get("straggler_factor", 1.5)),
            no_progress,
            str(params.get("script_exit_timeout", "60")),
            auto,
        )
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def _count_xpu_devices() -> int:
    import torch

    xpu = getattr(torch, "xpu", None)
    return int(xpu.device_count()) if xpu is not None and xpu.is_available() else 0


def _torchrun_extras(params: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The LaunchConfig fields of torchrun 2.13's further flags (see cli.torchrun_flags)."""
    from elastic_run.agent.workers.numa import check_numa_binding
    from elastic_run.cli.options.torchrun_flags import load_logs_specs_class, parse_filters

    if params.get("logs_specs"):
        load_logs_specs_class(params["logs_specs"])  # fails here, before anything starts
    check_numa_binding(params.get("numa_binding"))
    return {
        "logs_specs": params.get("logs_specs") or None,
        "event_log_handler": params.get("event_log_handler") or "null",
        "log_line_prefix_template": env.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE") or None,
        "duplicate_stdout_filters": parse_filters(params.get("duplicate_stdout_filters") or ""),
        "duplicate_stderr_filters": parse_filters(params.get("duplicate_stderr_filters") or ""),
        "virtual_local_rank": bool(params.get("virtual_local_rank")),
        "numa_binding": params.get("numa_binding"),
        "launcher_error_file": env.get("TORCHELASTIC_ERROR_FILE") or None,
        # torchrun puts the flag's text in its own environment, which the workers inherit.
        "extra_env": (("TORCHELASTIC_SIGNALS_TO_HANDLE", str(params["signals_to_handle"])),),
    }


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "y", "t", "on")


def parse_launch_config(
    params: dict[str, Any],
    explicit: set[str],
    environ: dict[str, str] | None = None,
) -> ParsedRun:
    """Turn the run command's parameters into a LaunchConfig; every check happens here.

    Args:
        params: click's parameter values (updated in place with the Slurm defaults and the
            safe run id).
        explicit: the names the user set (command line or PET_* variable); the Slurm
            defaults are added.
        environ: the environment (default: os.environ).

    Returns:
        The config, the (name, value, reason) rows of --print-config, and the notices to print
        before the job starts.

    Raises:
        ConfigurationError: anything bad, as one line.
    """
    env = dict(os.environ if environ is None else environ)
    notices: list[str] = []
    chosen: Chosen = []
    _apply_slurm_defaults(params, explicit, env, chosen, notices)
    script = params["script"]
    if script is None:
        raise ConfigurationError("missing SCRIPT: elastic-run [OPTIONS] SCRIPT [ARGS]...")
    cwd = _current_directory()
    check_entrypoint(
        script,
        module=params["module"],
        no_python=params["no_python"],
        cwd=cwd,
        environ=env,
    )
    nodes = parse_nnodes(str(params["nnodes"]))
    nproc = parse_nproc(
        str(params["nproc_per_node"]),
        cpu_count=os.cpu_count() or 1,
        cuda_device_count=_count_cuda_devices,
        xpu_device_count=_count_xpu_devices,
    )
    max_restarts = check_count(params["max_restarts"], "--max-restarts", 0, MAX_RESTARTS)
    durations = _durations(params, env)
    redirects = parse_std(params["redirects"], "--redirects")
    tee = parse_std(params["tee"], "--tee")
    signals = parse_signals(params["signals_to_handle"])
    master_port = check_port(params["master_port"], "--master-port")
    health_port = _health_port(params, env)
    log_dir = _log_dir(params["log_dir"])
    ranks_filter = parse_local_ranks(params["local_ranks_filter"])
    rdzv = _rendezvous(params, nodes, master_port, chosen, notices)
    progress = _progress(params, explicit, chosen)
    preload = _preload(params["preload"])
    warm_start = _warm_start(params, script, preload, cwd, chosen)
    watchdog = params["watchdog"]
    if watchdog is None:
        watchdog = _truthy(env.get("TORCHELASTIC_ENABLE_FILE_TIMER"))
    if nproc > 1 and "OMP_NUM_THREADS" not in env:
        notices.append(
            "OMP_NUM_THREADS is set to 1 for each worker to avoid overloading the system; "
            "tune it for your workload"
        )
    config = LaunchConfig(
        entrypoint=script,
        args=tuple(params["script_args"]),
        min_nodes=rdzv.min_nodes,
        max_nodes=rdzv.max_nodes,
        nproc_per_node=nproc,
        run_id=rdzv.run_id,
        role=params["role"],
        rdzv_backend=rdzv.backend,
        rdzv_endpoint=rdzv.endpoint,
        rdzv_configs=rdzv.conf.given,
        rdzv_conf=rdzv.conf,
        standalone=params["standalone"],
        max_restarts=max_restarts,
        monitor_interval_s=durations.monitor_interval_s,
        module=params["module"],
        no_python=params["no_python"],
        run_path=params["run_path"],
        log_dir=log_dir,
        redirects=redirects,
        tee=tee,
        local_ranks_filter=ranks_filter,
        node_rank=params["node_rank"],
        master_addr=params["master_addr"],
        master_port=master_port or 29500,
        local_addr=rdzv.local_addr,
        signals_to_handle=signals,
        shutdown_timeout_s=durations.shutdown_timeout_s,
        watchdog=bool(watchdog),
        timer_file=env.get("TORCHELASTIC_TIMER_FILE") or None,
        health_check_port=health_port,
        health_check_addr=params["health_check_addr"],
        health_check_timeout_s=durations.health_check_timeout_s,
        live=params["live"],
        exit_barrier_timeout_s=durations.exit_barrier_timeout_s,
        progress=progress,
        warm_start=warm_start,
        preload=preload,
        **_torchrun_extras(params, env),
    )
    for name in _SHOWN_IN_PRINT_CONFIG:
        if not any(row[0] == name for row in chosen):
            chosen.append((name, params[name], "given" if name in explicit else "default"))
    return ParsedRun(config, tuple(chosen), tuple(notices))
