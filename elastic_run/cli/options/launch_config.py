"""The run command's configuration: read once, checked throughout, frozen into a LaunchConfig.

One concept: the settings' values (read by :func:`~elastic_run.cli.options.sources.read_settings`
from the command line, the ``PET_*`` variables, torch's variables and the Slurm allocation, each
by its row's parser) and the rules that join several of them become one
:class:`~elastic_run.agent.config.LaunchConfig`, plus what ``--print-config`` shows (every row:
its value and where it came from) and the notices to print. The rules:

- ``--standalone``: c10d on ``localhost:0``, a random run id, one node;
- the static backend: the node counts and ``--node-rank`` (its own check), the endpoint from
  ``--master-addr:--master-port``, the rank in the rendezvous config;
- an elastic backend needs ``--rdzv-endpoint``; embedded etcd's members are checked;
- the run id is made safe for a path (:func:`~elastic_run.agent.settings.values.safe_run_id`),
  and the safe id is the run id everywhere, so every node that passes the same ``--rdzv-id``
  agrees;
- what the workers run (:mod:`elastic_run.cli.options.entrypoint`), the log directory, the
  ``--logs-specs`` plugin and ``--numa-binding`` are checked here, before anything starts;
- the warm-start default (:mod:`elastic_run.cli.options.warm_default`) and automatic progress
  beats (off for ``--no-python``).

Every check happens before any process starts or any directory is made: bad input raises
:class:`ConfigurationError`, which the CLI prints as one line and exits 2. The LaunchConfig is
built from the rows by one loop: no field is copied by hand.
"""

from __future__ import annotations

import glob
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_run.agent.config import LaunchConfig
from elastic_run.agent.node_check.device_request import DeviceRequest
from elastic_run.agent.settings import table as settings
from elastic_run.agent.settings.table import SETTINGS
from elastic_run.agent.settings.values import shown
from elastic_run.cli.options.entrypoint import check_entrypoint
from elastic_run.cli.options.rdzv_conf import parse_rdzv_conf, validate_rdzv_conf
from elastic_run.cli.options.sources import Readings, read_settings
from elastic_run.cli.options.warm_default import default_warm_start
from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.settings import RendezvousConf
from elastic_run.rendezvous.static import TORCHRUN_STATIC_TIMEOUT_S, check_static_nodes

__all__ = [
    "Chosen",
    "ParsedRun",
    "parse_launch_config",
]

_ELASTIC_BACKENDS = ("c10d", "etcd", "etcd-v2", "embedded-etcd")

Chosen = list[tuple[str, object, str]]


@dataclass(frozen=True)
class ParsedRun:
    """The run command's result of parsing.

    Attributes:
        config: the launch configuration.
        chosen: what ``--print-config`` shows: (name, value, where it came from), one per
            setting in the table's order, then what the rules worked out beside them.
        notices: lines to print before the job starts.
        print_config: ``--print-config`` was asked for (start nothing).
    """

    config: LaunchConfig
    chosen: tuple[tuple[str, object, str], ...]
    notices: tuple[str, ...]
    print_config: bool


class _Effective:
    """The values while the rules join them: each value, where it came from, how it shows."""

    def __init__(self, readings: Readings) -> None:
        self.values: dict[str, Any] = dict(readings.values)
        self.sources: dict[str, str] = dict(readings.sources)
        self.shown: dict[str, str] = {}
        self.given = readings.given
        self.texts = readings.texts
        self.extra: Chosen = []

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def set(self, name: str, value: Any, source: str, shown_as: str | None = None) -> None:
        """Replace a value by a rule's (``source``: the rule, for --print-config)."""
        self.values[name] = value
        self.sources[name] = source
        if shown_as is not None:
            self.shown[name] = shown_as

    def text(self, name: str) -> str:
        """The text a setting was read from, or its default's text."""
        text = self.texts.get(name)
        return text if text is not None else settings.by_name(name).show(self.values[name])

    def chosen(self) -> tuple[tuple[str, object, str], ...]:
        rows: Chosen = [
            (s.name, self.shown.get(s.name, s.show(self.values[s.name])), self.sources[s.name])
            for s in SETTINGS
        ]
        return tuple(rows + self.extra)


def _current_directory() -> Path:
    """Where the workers will start (the agent's directory), which must still exist."""
    try:
        return Path.cwd()
    except OSError as exc:
        raise ConfigurationError(
            f"the current directory cannot be read ({exc.strerror}): was it removed?"
        ) from None


def _script(params: dict[str, Any], eff: _Effective) -> str:
    """SCRIPT, checked as the workers will start it (a placeholder for a bare --print-config)."""
    script = params.get("script")
    if script is None:
        if not eff["print_config"]:
            raise ConfigurationError("missing SCRIPT: elastic-run [OPTIONS] SCRIPT [ARGS]...")
        eff.set("no_python", True, "--print-config without SCRIPT")
        return sys.executable  # a placeholder: --print-config starts nothing
    return str(script)


def _log_dir(path: Path | None) -> None:
    """The nearest ancestor of ``--log-dir`` that exists must be a directory this process may
    write: nothing is created here (the agent makes the directory once the job starts)."""
    if path is None:
        return
    probe = path
    try:
        while not probe.exists() and probe.parent != probe:
            probe = probe.parent
        writable = probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)
    except OSError as exc:
        raise ConfigurationError(
            f"--log-dir {shown(str(path))} cannot be used: {exc.strerror}"
        ) from None
    if not writable:
        raise ConfigurationError(f"--log-dir {shown(str(path))} cannot be written")


def _warm_start(eff: _Effective, script: str, cwd: Path) -> None:
    """--warm-start, and the --print-config reason (the default: warm_default.py)."""
    if "warm_start" in eff.given and not eff["no_python"]:
        return
    warm, why = default_warm_start(
        script, module=eff["module"], no_python=eff["no_python"], preload=eff["preload"], cwd=cwd
    )
    eff.set("warm_start", warm, why)


def _auto_progress(eff: _Effective) -> None:
    if eff["no_python"] and eff["auto_progress"]:
        eff.set("auto_progress", False, "--no-python: only Python workers beat by themselves")


def _rendezvous(eff: _Effective, notices: list[str]) -> tuple[int, int, RendezvousConf]:
    """Backend, endpoint, run id and config after --standalone and the static backend; return
    the node counts and the rendezvous conf, parsed once (the rendezvous gets that parse)."""
    min_nodes, max_nodes = eff["nnodes"]
    conf = parse_rdzv_conf(eff["rdzv_conf"])
    if eff["standalone"]:
        eff.set("rdzv_backend", "c10d", "--standalone")
        eff.set("rdzv_endpoint", "localhost:0", "--standalone", "localhost:<free port>")
        eff.set("rdzv_id", str(uuid.uuid4()), "--standalone: a random run id")
        if not eff["local_addr"]:
            eff.set("local_addr", "localhost", "--standalone")
        if (min_nodes, max_nodes) != (1, 1):
            notices.append("--standalone runs a single node: --nnodes is set to 1")
        min_nodes = max_nodes = 1
        eff.set("nnodes", (1, 1), "--standalone")
    else:
        _run_id(eff, notices)
    backend = eff["rdzv_backend"]
    if backend == "static":
        check_static_nodes(min_nodes, max_nodes, eff["node_rank"])
        endpoint = f"{eff['master_addr']}:{eff['master_port']}"
        eff.set("rdzv_endpoint", endpoint, "static: --master-addr:--master-port")
        conf = (*conf, ("rank", str(eff["node_rank"])))
        if not {"timeout", "join_timeout"} & {key for key, _ in conf}:
            # torchrun's launcher gives its static rendezvous 900 s, torch's handler alone 600.
            conf = (*conf, ("timeout", f"{TORCHRUN_STATIC_TIMEOUT_S:g}"))
    elif backend == "embedded-etcd":
        _embedded_members(eff)
    elif backend in _ELASTIC_BACKENDS and not eff["rdzv_endpoint"]:
        raise ConfigurationError(f"--rdzv-backend {backend} needs --rdzv-endpoint host:port")
    # The one parse, before anything starts; the rendezvous gets it (LaunchConfig.rdzv_conf).
    parsed = validate_rdzv_conf(conf, backend)
    shown_conf = ",".join(f"{key}={value}" for key, value in conf)
    source = eff.sources["rdzv_conf"]
    if backend == "static":
        source += "; rank from --node-rank (static)"
    eff.set("rdzv_conf", conf, source, shown_conf)
    return min_nodes, max_nodes, parsed


def _run_id(eff: _Effective, notices: list[str]) -> None:
    """The safe run id; a notice (and a --print-config reason) when it differs from the given."""
    from elastic_run.agent.settings.values import safe_run_id

    given = str(eff["rdzv_id"])
    safe = safe_run_id(given)
    if safe != given:
        eff.set("rdzv_id", safe, f"{shown(given)} made safe for a path")
        notices.append(
            f"--rdzv-id {shown(given)} is not safe in a file path; the run id is {safe!r} "
            "(the same on every node given the same id)"
        )


def _embedded_members(eff: _Effective) -> None:
    """Check the embedded etcd members and say them (and which one is this host) in
    --print-config."""
    from elastic_run.rendezvous.embedded.cluster import (
        find_local_member,
        local_identity,
        parse_cluster,
    )

    cluster = parse_cluster(eff["rdzv_endpoint"], eff["rdzv_id"])
    found = find_local_member(cluster, local_identity(eff["local_addr"]))
    here = f"this host runs {found[0].name}, bound to {found[1]}" if found else "none on this host"
    eff.extra.append(
        (
            "etcd_members",
            cluster.describe(),
            f"embedded etcd, peer port = client port + 1, {cluster.majority} of "
            f"{cluster.size} needed; {here}",
        )
    )


def _plugins(eff: _Effective) -> None:
    """--logs-specs and --numa-binding, checked before anything starts."""
    from elastic_run.agent.workers.numa import check_numa_binding
    from elastic_run.cli.options.torchrun_flags import load_logs_specs_class

    if eff["logs_specs"]:
        load_logs_specs_class(eff["logs_specs"])
    check_numa_binding(eff["numa_binding"])


def _node_devices(eff: _Effective, env: dict[str, str]) -> DeviceRequest:
    """The devices ``--nproc-per-node`` asks of this node, for the node check. They are counted
    from the device files (``/dev/nvidia<N>``), never through the driver: a wedged driver
    must hang the check's child, not the agent."""
    from elastic_run.agent.node_check.device_request import device_request

    count = len(glob.glob("/dev/nvidia[0-9]*"))
    # No device file: a CPU-only node (CUDA_VISIBLE_DEVICES alone asks for no GPU there, as a
    # script that never touches CUDA runs the same under torchrun).
    return device_request(
        eff.text("nproc_per_node"),
        cuda_device_count=count,
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES") if count else None,
    )


def parse_launch_config(
    params: dict[str, Any],
    explicit: set[str],
    environ: dict[str, str] | None = None,
) -> ParsedRun:
    """Turn the run command's parameters into a LaunchConfig; every check happens here.

    Args:
        params: click's values by name (each setting's text as given, True/False for a flag,
            None when not given; ``script`` and ``script_args``).
        explicit: the names the user set on the command line.
        environ: the environment (default: os.environ): the ``PET_*`` and torch variables, the
            Slurm allocation, ``OMP_NUM_THREADS``.

    Returns:
        The config, the rows of --print-config, and the notices to print before the job starts.

    Raises:
        ConfigurationError: anything bad, as one line.
    """
    env = dict(os.environ if environ is None else environ)
    readings = read_settings(params, explicit, env)
    eff = _Effective(readings)
    notices = list(readings.notices)
    script = _script(params, eff)
    cwd = _current_directory()
    check_entrypoint(script, module=eff["module"], no_python=eff["no_python"], cwd=cwd, environ=env)
    min_nodes, max_nodes, rdzv_conf = _rendezvous(eff, notices)
    if not eff["master_port"]:  # torchrun's: port 0 means the default port for the workers
        eff.set("master_port", settings.MASTER_PORT.default, eff.sources["master_port"])
    _log_dir(eff["log_dir"])
    _plugins(eff)
    _warm_start(eff, script, cwd)
    _auto_progress(eff)
    if eff["nproc_per_node"] > 1 and "OMP_NUM_THREADS" not in env:
        notices.append(
            "OMP_NUM_THREADS is set to 1 for each worker to avoid overloading the system; "
            "tune it for your workload"
        )
    config = LaunchConfig(
        entrypoint=script,
        args=tuple(params.get("script_args") or ()),
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        # torchrun puts the flag's text in its own environment, which the workers inherit.
        extra_env=(("TORCHELASTIC_SIGNALS_TO_HANDLE", eff.text("signals_to_handle")),),
        rdzv_conf=rdzv_conf,
        node_devices=_node_devices(eff, env),
        **{s.attribute: eff[s.name] for s in SETTINGS if s.attribute is not None},
    )
    return ParsedRun(config, eff.chosen(), tuple(notices), bool(eff["print_config"]))
