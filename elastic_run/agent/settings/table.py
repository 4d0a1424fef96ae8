"""The one table of the agent's and the launcher's settings: every flag of ``elastic-run run``
(torchrun's and ours) and every variable of torch's that the launcher reads, one row each.

Each row (:class:`~elastic_run.agent.settings.setting.Setting`) holds a setting's flag, its
``PET_`` variable, torch's variable where torch reads one, how its text is read and bounded, its
default, its help and where its value goes. From these rows, and nowhere else, come the run
command's click options (``cli/options/run_options.py``), ``--print-config``
(``cli/options/sources.py``), the docs' flag reference (``cli/options/reference.py`` ->
``docs/cli.md``), the keyword defaults of ``LocalElasticAgent``, ``SimpleElasticAgent``,
``WorkerSpec`` and ``AgentOptions``, and the loop that hands the launch configuration's values to
those objects (:func:`arguments`). A default is written here once (the progress settings' in
``ProgressOptions``, which this table reads); ``tests/unit/test_settings_table.py`` holds that no
default is written twice.

Adding a setting: one row here, in the order ``--help`` lists it, and the field its value goes
to; the CLI, the docs (regenerate ``docs/cli.md``) and the builders follow.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from elastic_run.agent.link_check.mode import parse_link_check_mode
from elastic_run.agent.node_check.options import DEFAULT_TIMEOUT_S as DEFAULT_NODE_CHECK_TIMEOUT_S
from elastic_run.agent.node_check.options import parse_node_check_cmd, parse_node_check_timeout
from elastic_run.agent.progress.config import ProgressOptions, parse_straggler_factor
from elastic_run.agent.rules.progress.beats import DEFAULT_FLOOR_S, HangRule, parse_hang_timeout
from elastic_run.agent.rules.progress.script_end import parse_script_exit_timeout
from elastic_run.agent.settings.setting import (
    Choice,
    Count,
    Kind,
    Place,
    Seconds,
    Setting,
    Switch,
    Target,
    Text,
)
from elastic_run.agent.settings.streams import StdSpec
from elastic_run.agent.settings.values import (
    MAX_NPROC_PER_NODE,
    check_endpoint_ports,
    check_seconds,
    count_cuda_devices,
    count_usable_cpus,
    count_xpu_devices,
    parse_filters,
    parse_local_ranks,
    parse_modules,
    parse_nproc,
    parse_signals,
    parse_std,
    parse_truthy,
    shown,
)
from elastic_run.agent.settings.values import MAX_RESTARTS as _MOST_RESTARTS
from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.settings import MAX_NODES, parse_nnodes

__all__ = [
    "AUTO_PROGRESS",
    "DEFAULT_SIGNALS",
    "DUPLICATE_STDERR_FILTERS",
    "DUPLICATE_STDOUT_FILTERS",
    "ELASTIC_MIN",
    "EVENT_LOG_HANDLER",
    "EXIT_BARRIER_TIMEOUT",
    "HANG_TIMEOUT",
    "HEALTH_CHECK_ADDR",
    "HEALTH_CHECK_PORT",
    "HEALTH_CHECK_TIMEOUT",
    "LAUNCHER_ERROR_FILE",
    "LIVE",
    "LOCAL_ADDR",
    "LOCAL_RANKS_FILTER",
    "LOG_DIR",
    "LOG_LINE_PREFIX_TEMPLATE",
    "LOGS_SPECS",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LINK_CHECK",
    "MAX_NODE_FAILURES",
    "NODE_CHECK",
    "NODE_CHECK_CMD",
    "NODE_CHECK_TIMEOUT",
    "MAX_NO_PROGRESS_RESTARTS",
    "MAX_RESTARTS",
    "MAX_STRAGGLER_FACTOR",
    "MODULE",
    "MONITOR_INTERVAL",
    "NNODES",
    "NODE_RANK",
    "NO_PYTHON",
    "NPROC_PER_NODE",
    "NUMA_BINDING",
    "PRELOAD",
    "PRINT_CONFIG",
    "RDZV_BACKEND",
    "RDZV_CONF",
    "RDZV_ENDPOINT",
    "RDZV_ID",
    "REDIRECTS",
    "ROLE",
    "RUN_PATH",
    "SCRIPT_EXIT_TIMEOUT",
    "SECTIONS",
    "SETTINGS",
    "SHUTDOWN_TIMEOUT",
    "SIGNALS_TO_HANDLE",
    "STANDALONE",
    "START_METHOD",
    "STRAGGLER_FACTOR",
    "TEE",
    "TIMER_FILE",
    "TORCHELASTIC_ENABLE_FILE_TIMER",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_HEALTH_CHECK_PORT",
    "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
    "TORCHELASTIC_TIMER_FILE",
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
    "VIRTUAL_LOCAL_RANK",
    "WARM_START",
    "WATCHDOG",
    "arguments",
    "by_name",
]

# The variables torch's launcher and agent read (torchrun reads its flags from PET_<NAME>).
TORCH_ELASTIC_SHUTDOWN_TIMEOUT = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
TORCHELASTIC_ENABLE_FILE_TIMER = "TORCHELASTIC_ENABLE_FILE_TIMER"
TORCHELASTIC_TIMER_FILE = "TORCHELASTIC_TIMER_FILE"
TORCHELASTIC_HEALTH_CHECK_PORT = "TORCHELASTIC_HEALTH_CHECK_PORT"
TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
TORCHELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"

# The docs' sections, in their order.
_NODES = "Nodes and rendezvous"
_WORKERS = "What the workers run"
_RESTARTS = "Restarts, signals and shutdown"
_LOGS = "Logs and output"
_HEALTH = "Health check and watchdog"
_PROGRESS = "Progress, hangs and stragglers"
_BAD_NODES = "Bad nodes"
_LAUNCHER = "The launcher"
SECTIONS = (_NODES, _WORKERS, _RESTARTS, _LOGS, _HEALTH, _PROGRESS, _BAD_NODES, _LAUNCHER)

# ProgressOptions is the home of the progress settings' defaults (agent/progress/config.py,
# which this table imports for its parsers): the rows read them from one default instance.
_PROGRESS_DEFAULTS = ProgressOptions()


def _spec(name: str) -> Place:
    return Place(Target.WORKER_SPEC, name)


def _agent(name: str) -> Place:
    return Place(Target.AGENT, name)


def _options(name: str) -> Place:
    return Place(Target.AGENT_OPTIONS, name)


def _progress(name: str) -> Place:
    return Place(Target.PROGRESS, name)


def _rendezvous(name: str) -> Place:
    return Place(Target.RENDEZVOUS, name)


def _logs(name: str) -> Place:
    return Place(Target.LOGS, name)


def _cli(words: str) -> Place:
    return Place(Target.CLI, words)


# -- the kinds of value that only one setting takes -------------------------------------------


def _nproc(text: str, what: str) -> int:
    return parse_nproc(
        text,
        cpu_count=count_usable_cpus(),
        cuda_device_count=count_cuda_devices,
        xpu_device_count=count_xpu_devices,
        what=what,
    )


def _endpoint(text: str, what: str) -> str:
    check_endpoint_ports(text, what)
    return text


def _show_std(spec: StdSpec) -> str:
    if not spec.per_rank:
        return str(int(spec.default))
    return ",".join(f"{rank}:{int(std)}" for rank, std in spec.per_rank)


def _hang(text: str, what: str) -> HangRule:
    try:
        rule = parse_hang_timeout(text)
    except ValueError as exc:
        raise ConfigurationError(f"{what} {exc}") from None
    if rule.mode != "off":
        check_seconds(rule.timeout_s, what)  # at most a year, as every duration
    return rule


def _show_hang(rule: HangRule) -> str:
    if rule.mode == "off":
        return "off"
    if rule.mode == "fixed":
        return f"{rule.timeout_s:g}"
    return "auto" if rule.timeout_s == DEFAULT_FLOOR_S else f"auto:{rule.timeout_s:g}"


# A rank this many times slower than the median is not a straggler but stopped, which the hang
# verdict judges; a larger factor is a typo.
MAX_STRAGGLER_FACTOR = 1000.0


def _factor(text: str, what: str) -> float:
    try:
        factor = parse_straggler_factor(float(text.strip()))
    except ValueError:
        raise ConfigurationError(f"{what} {shown(text)} is not a number above 1") from None
    if factor > MAX_STRAGGLER_FACTOR:
        raise ConfigurationError(
            f"{what} {factor:g} is more than {MAX_STRAGGLER_FACTOR:g} (a rank that slow is hung)"
        )
    return factor


def _script_exit(text: str, what: str) -> float | None:
    try:
        seconds = parse_script_exit_timeout(text)
    except ValueError as exc:
        raise ConfigurationError(f"{what} {exc}") from None
    return None if seconds is None else check_seconds(seconds, what)


def _optional(text: str, what: str) -> str | None:
    return text or None


def _log_dir(text: str, what: str) -> Path | None:
    return Path(text) if text else None


_NULL_HANDLER = "null"


def _event_handler(text: str, what: str) -> str:
    return text or _NULL_HANDLER


def _show_nnodes(nodes: tuple[int, int]) -> str:
    return f"{nodes[0]}:{nodes[1]}"


def _show_ranks(ranks: frozenset[int] | None) -> str:
    return ",".join(map(str, sorted(ranks or ())))


def _show_signals(signals: tuple[signal.Signals, ...]) -> str:
    return ",".join(sig.name for sig in signals)


def _show_filters(filters: tuple[str, ...]) -> str:
    return ",".join(item.replace(",", ",,") for item in filters)


def _show_names(names: tuple[str, ...]) -> str:
    return ",".join(names)


_NNODES = Kind(parse_nnodes, f"N or MIN:MAX, 1 <= MIN <= MAX <= {MAX_NODES}", _show_nnodes)
_NPROC = Kind(_nproc, f"N (1..{MAX_NPROC_PER_NODE}), cpu, gpu, xpu or auto")
_ENDPOINT = Kind(_endpoint, "host[:port][,host[:port]...]")
_STD = Kind(parse_std, "0..3, or LOCAL_RANK:0..3,...", _show_std)
_RANKS = Kind(parse_local_ranks, "local ranks: a,b", _show_ranks)
_SIGNALS = Kind(parse_signals, "signal names: a,b", _show_signals)
_FILTERS = Kind(parse_filters, "strings: a,b (,, is a comma)", _show_filters)
_MODULES = Kind(parse_modules, "module names: a,b.c", _show_names)
_PORT = Count(0, 65535)
_OPTIONAL_TEXT = Kind(_optional, "text")
_TRUTHY = Kind(parse_truthy, "1, true, yes, y, t, on: on (anything else: off)")


# -- the rows, in the order --help lists them ---------------------------------------------------

NNODES: Setting[tuple[int, int]] = Setting(
    "nnodes",
    _NODES,
    "--nnodes",
    _NNODES,
    (1, 1),
    "Nodes: N or MIN:MAX (MIN: under SLURM).",
    (_rendezvous("min_nodes, max_nodes"),),
    attr=None,  # the launch configuration's min_nodes and max_nodes
    metavar="N|MIN:MAX",
)
NPROC_PER_NODE: Setting[int] = Setting(
    "nproc_per_node",
    _WORKERS,
    "--nproc-per-node",
    _NPROC,
    1,
    "Workers per node: N, cpu, gpu, xpu or auto.",
    (_spec("local_world_size"),),
    metavar="N|cpu|gpu|xpu|auto",
)
RDZV_BACKEND: Setting[str] = Setting(
    "rdzv_backend",
    _NODES,
    "--rdzv-backend",
    Text("a backend name"),
    "static",
    "static, c10d, etcd, etcd-v2 or embedded-etcd.",
    (_rendezvous("backend"),),
    metavar="NAME",
)
RDZV_ENDPOINT: Setting[str] = Setting(
    "rdzv_endpoint",
    _NODES,
    "--rdzv-endpoint",
    _ENDPOINT,
    "",
    "host[:port] of the rendezvous backend.",
    (_rendezvous("endpoint"),),
    metavar="HOST[:PORT]",
)
RDZV_ID: Setting[str] = Setting(
    "rdzv_id",
    _NODES,
    "--rdzv-id",
    Text("a job id (made safe for a path)"),
    "none",
    "The job id shared by all nodes.",
    (_rendezvous("run_id"),),
    attr="run_id",
    metavar="ID",
)
RDZV_CONF: Setting[str] = Setting(
    "rdzv_conf",
    _NODES,
    "--rdzv-conf",
    Text("k1=v1,k2=v2 (the rendezvous checks the keys it knows)"),
    "",
    "Backend config: k1=v1,k2=v2.",
    (_rendezvous("config"),),
    attr="rdzv_configs",
    metavar="K=V,...",
)
STANDALONE: Setting[bool] = Setting(
    "standalone",
    _NODES,
    "--standalone",
    Switch(),
    False,
    "One node, c10d on localhost, free port, random id.",
    (_cli("the rendezvous: c10d on localhost:0, a random run id, --nnodes 1"),),
    form="flag",
)
MAX_RESTARTS: Setting[int] = Setting(
    "max_restarts",
    _RESTARTS,
    "--max-restarts",
    Count(0, _MOST_RESTARTS),
    0,
    "Failures restarted before giving up.",
    (_spec("max_restarts"),),
    metavar="N",
)
MONITOR_INTERVAL: Setting[float] = Setting(
    "monitor_interval",
    _RESTARTS,
    "--monitor-interval",
    Seconds(),
    0.1,
    "Seconds between worker checks.",
    (_spec("monitor_interval"),),
    metavar="SECONDS",
)
START_METHOD: Setting[str] = Setting(
    "start_method",
    _WORKERS,
    "--start-method",
    Choice("spawn", "fork", "forkserver"),
    "spawn",
    "Accepted for torchrun compatibility (workers are subprocesses).",
    (_agent("start_method"),),
    metavar="[spawn|fork|forkserver]",
)
ROLE: Setting[str] = Setting(
    "role",
    _WORKERS,
    "--role",
    Text("a name"),
    "default",
    "The workers' role name.",
    (_spec("role"),),
    metavar="NAME",
)
MODULE: Setting[bool] = Setting(
    "module",
    _WORKERS,
    "--module",
    Switch(),
    False,
    "Run SCRIPT as a module (python -m).",
    (_cli("the workers' command: python -u -m SCRIPT"),),
    form="flag",
    short="-m",
)
NO_PYTHON: Setting[bool] = Setting(
    "no_python",
    _WORKERS,
    "--no-python",
    Switch(),
    False,
    "Run SCRIPT as a program, without python.",
    (_cli("the workers' command: SCRIPT ARGS"),),
    form="flag",
)
RUN_PATH: Setting[bool] = Setting(
    "run_path",
    _WORKERS,
    "--run-path",
    Switch(),
    False,
    "Accepted for torchrun compatibility.",
    (_cli("accepted, not used (workers are subprocesses)"),),
    form="flag",
)
LOG_DIR: Setting[Path | None] = Setting(
    "log_dir",
    _LOGS,
    "--log-dir",
    Kind(_log_dir, "a directory (made when the job starts)"),
    None,
    "Base directory of the logs.",
    (_logs("log_dir"),),
    unset="a temporary directory",
    metavar="DIR",
)
REDIRECTS: Setting[StdSpec] = Setting(
    "redirects",
    _LOGS,
    "--redirects",
    _STD,
    StdSpec(),
    "Streams to files only: 0-3, or per rank 0:1,1:2.",
    (_logs("redirects"),),
    short="-r",
    metavar="STD",
)
TEE: Setting[StdSpec] = Setting(
    "tee",
    _LOGS,
    "--tee",
    _STD,
    StdSpec(),
    "Streams to files and console: 0-3, or per rank.",
    (_logs("tee"),),
    short="-t",
    metavar="STD",
)
LOCAL_RANKS_FILTER: Setting[frozenset[int] | None] = Setting(
    "local_ranks_filter",
    _LOGS,
    "--local-ranks-filter",
    _RANKS,
    None,
    "Local ranks shown on the console: 0,1.",
    (_logs("local_ranks_filter"),),
    unset="every rank",
    metavar="RANKS",
)
NODE_RANK: Setting[int] = Setting(
    "node_rank",
    _NODES,
    "--node-rank",
    Count(0, MAX_NODES - 1),
    0,
    "This node's rank (static).",
    (_rendezvous("config rank (static)"),),
    metavar="N",
)
MASTER_ADDR: Setting[str] = Setting(
    "master_addr",
    _NODES,
    "--master-addr",
    Text("a host"),
    "127.0.0.1",
    "Master address (static).",
    (_spec("master_addr"), _rendezvous("endpoint (static)")),
    metavar="HOST",
)
MASTER_PORT: Setting[int] = Setting(
    "master_port",
    _NODES,
    "--master-port",
    _PORT,
    29500,
    "Master port (static).",
    (_spec("master_port"), _rendezvous("endpoint (static)")),
    metavar="PORT",
)
LOCAL_ADDR: Setting[str | None] = Setting(
    "local_addr",
    _NODES,
    "--local-addr",
    Text("a host"),
    None,
    "The address this node advertises.",
    (_spec("local_addr"), _rendezvous("local_addr")),
    unset="this host's FQDN",
    metavar="HOST",
)
SIGNALS_TO_HANDLE: Setting[tuple[signal.Signals, ...]] = Setting(
    "signals_to_handle",
    _RESTARTS,
    "--signals-to-handle",
    _SIGNALS,
    (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT),
    "Signals forwarded to the workers.",
    (
        _options("signals"),
        Place(Target.WORKERS, "TORCHELASTIC_SIGNALS_TO_HANDLE"),
    ),
    metavar="SIGNALS",
)
SHUTDOWN_TIMEOUT: Setting[float] = Setting(
    "shutdown_timeout",
    _RESTARTS,
    "--shutdown-timeout",
    Seconds(allow_zero=True),
    30.0,
    "Seconds between the signal and SIGKILL.",
    (_agent("shutdown_timeout"),),
    torch_env=TORCH_ELASTIC_SHUTDOWN_TIMEOUT,
    metavar="SECONDS",
)
LOGS_SPECS: Setting[str | None] = Setting(
    "logs_specs",
    _LOGS,
    "--logs-specs",
    Kind(_optional, "an entry point name"),
    None,
    "A LogsSpecs class from the entry point group torchrun.logs_specs.",
    (_cli("the LogsSpecs class, built with torch's keyword arguments"),),
    unset="DefaultLogsSpecs",
    metavar="NAME",
)
EVENT_LOG_HANDLER: Setting[str] = Setting(
    "event_log_handler",
    _LOGS,
    "--event-log-handler",
    Kind(_event_handler, "a handler of torch's event logging"),
    _NULL_HANDLER,
    "torch's events handler for the agent's events: null, console, ...",
    (_cli("a sink recording the agent's events through torch's event logging"),),
    metavar="NAME",
)
DUPLICATE_STDOUT_FILTERS: Setting[tuple[str, ...]] = Setting(
    "duplicate_stdout_filters",
    _LOGS,
    "--duplicate-stdout-filters",
    _FILTERS,
    (),
    "Teed stdout lines containing one of these (a,b; ',,' is a comma) also go to "
    "attempt_<n>/filtered_stdout.log.",
    (_options("duplicate_stdout_filters"),),
    metavar="STRINGS",
)
DUPLICATE_STDERR_FILTERS: Setting[tuple[str, ...]] = Setting(
    "duplicate_stderr_filters",
    _LOGS,
    "--duplicate-stderr-filters",
    _FILTERS,
    (),
    "The same for stderr (filtered_stderr.log).",
    (_options("duplicate_stderr_filters"),),
    metavar="STRINGS",
)
NUMA_BINDING: Setting[str | None] = Setting(
    "numa_binding",
    _WORKERS,
    "--numa-binding",
    Choice("node", "socket", "exclusive", "core-complex"),
    None,
    "Bind each worker to the CPUs near its GPU (numactl).",
    (_options("numa_binding"),),
    unset="no binding",
    metavar="[node|socket|exclusive|core-complex]",
)
VIRTUAL_LOCAL_RANK: Setting[bool] = Setting(
    "virtual_local_rank",
    _WORKERS,
    "--virtual-local-rank",
    Switch(),
    False,
    "Every worker sees LOCAL_RANK=0 and only its GPU (CUDA_VISIBLE_DEVICES).",
    (_options("virtual_local_rank"),),
    form="flag",
)
WATCHDOG: Setting[bool] = Setting(
    "watchdog",
    _HEALTH,
    "--watchdog",
    Switch(),
    False,
    "File-timer watchdog.",
    (_options("watchdog"),),
    form="switch",
    torch_env=TORCHELASTIC_ENABLE_FILE_TIMER,
    torch_kind=_TRUTHY,
)
WARM_START: Setting[bool] = Setting(
    "warm_start",
    _WORKERS,
    "--warm-start",
    Switch(),
    False,
    "Fork Python workers from a per-node zygote that has torch imported.",
    (_options("warm_start"),),
    form="switch",
    default_text="on unless the script imports only the standard library",
)
PRELOAD: Setting[tuple[str, ...]] = Setting(
    "preload",
    _WORKERS,
    "--preload",
    _MODULES,
    (),
    "Modules the zygote imports after torch: a,b.c.",
    (_options("preload"),),
    metavar="MODULES",
)
HEALTH_CHECK_PORT: Setting[int | None] = Setting(
    "health_check_port",
    _HEALTH,
    "--health-check-port",
    _PORT,
    None,
    "Serve /healthz, /status, /metrics here.",
    (_options("health_check_port"),),
    torch_env=TORCHELASTIC_HEALTH_CHECK_PORT,
    unset="no server",
    metavar="PORT",
)
HEALTH_CHECK_ADDR: Setting[str] = Setting(
    "health_check_addr",
    _HEALTH,
    "--health-check-addr",
    Text("a host"),
    "127.0.0.1",
    "Address of the health server.",
    (_options("health_check_addr"),),
    metavar="HOST",
)
HEALTH_CHECK_TIMEOUT: Setting[float] = Setting(
    "health_check_timeout",
    _HEALTH,
    "--health-check-timeout",
    Seconds(),
    60.0,
    "Seconds without progress before /healthz fails.",
    (_options("health_check_timeout_s"),),
    metavar="SECONDS",
)
LIVE: Setting[bool | None] = Setting(
    "live",
    _LOGS,
    "--live",
    Switch(),
    None,
    "The live panel.",
    (_cli("the view: the live panel or plain lines"),),
    form="switch",
    unset="when stderr is a terminal",
)
EXIT_BARRIER_TIMEOUT: Setting[float] = Setting(
    "exit_barrier_timeout",
    _RESTARTS,
    "--exit-barrier-timeout",
    Seconds(allow_zero=True),
    300.0,
    "Seconds a finished node waits for the others.",
    (_agent("exit_barrier_timeout"),),
    metavar="SECONDS",
)
ELASTIC_MIN: Setting[int | None] = Setting(
    "elastic_min",
    _NODES,
    "--elastic-min",
    Count(1, MAX_NODES),
    None,
    "Under SLURM: MIN for --nnodes MIN:<nodes>.",
    (_cli("--nnodes under Slurm"),),
    attr=None,
    unset="none",
    metavar="N",
)
HANG_TIMEOUT: Setting[HangRule] = Setting(
    "hang_timeout",
    _PROGRESS,
    "--hang-timeout",
    Kind(_hang, "auto, auto:FLOOR, off or seconds > 0 (at most a year)", _show_hang),
    _PROGRESS_DEFAULTS.hang,
    "Silence after a progress beat that makes a worker hung: auto, auto:FLOOR, S, off.",
    (_progress("hang"),),
    metavar="auto|auto:S|S|off",
)
STRAGGLER_FACTOR: Setting[float] = Setting(
    "straggler_factor",
    _PROGRESS,
    "--straggler-factor",
    Kind(_factor, f"a number > 1, at most {MAX_STRAGGLER_FACTOR:g}", lambda v: f"{v:g}"),
    _PROGRESS_DEFAULTS.straggler_factor,
    "A rank this many times slower than the median step is a straggler.",
    (_progress("straggler_factor"),),
    metavar="X",
)
MAX_NO_PROGRESS_RESTARTS: Setting[int] = Setting(
    "max_no_progress_restarts",
    _PROGRESS,
    "--max-no-progress-restarts",
    Count(0, _MOST_RESTARTS),
    _PROGRESS_DEFAULTS.max_no_progress_restarts,
    "Exit 5 after K restarts in a row without a progress beat (0: off).",
    (_progress("max_no_progress_restarts"),),
    metavar="K",
)
AUTO_PROGRESS: Setting[bool] = Setting(
    "auto_progress",
    _PROGRESS,
    "--auto-progress",
    Switch(),
    _PROGRESS_DEFAULTS.auto_progress,
    "Python workers beat once per optimizer step (torch's global optimizer hook).",
    (_progress("auto_progress"),),
    form="switch",
)
SCRIPT_EXIT_TIMEOUT: Setting[float | None] = Setting(
    "script_exit_timeout",
    _PROGRESS,
    "--script-exit-timeout",
    Kind(_script_exit, "seconds > 0 (at most a year), or off", lambda v: f"{v:g}"),
    _PROGRESS_DEFAULTS.script_exit_timeout_s,
    "Kill a worker whose process outlives its script's end by S seconds (off: never).",
    (_progress("script_exit_timeout_s"),),
    attr="script_exit_timeout_s",
    unset="off",
    metavar="S|off",
)
MAX_NODE_FAILURES: Setting[int] = Setting(
    "max_node_failures",
    _BAD_NODES,
    "--max-node-failures",
    Count(2, 1000),
    2,
    "Exclude this node (exit 6) once it was the root cause of K failed rounds with different "
    "ranks (at least 2: one failure never excludes).",
    (_options("max_node_failures"),),
    metavar="K",
)


def _link_mode(text: str, what: str) -> str:
    try:
        return parse_link_check_mode(text).value
    except ValueError as exc:
        raise ConfigurationError(str(exc).replace("--link-check", what, 1)) from None


NODE_CHECK: Setting[bool] = Setting(
    "node_check",
    _BAD_NODES,
    "--node-check",
    Switch(),
    True,
    "Check this node (its devices, the log directory's disk, --node-check-cmd) before it "
    "joins, and before a suspect node rejoins; a node that fails does not join and exits 6.",
    (_options("node_check"),),
    form="switch",
)
NODE_CHECK_TIMEOUT: Setting[float] = Setting(
    "node_check_timeout",
    _BAD_NODES,
    "--node-check-timeout",
    Kind(parse_node_check_timeout, "seconds > 0, at most a year"),
    DEFAULT_NODE_CHECK_TIMEOUT_S,
    "Seconds the whole node check may take, every check together; past it, it fails.",
    (_options("node_check_timeout_s"),),
    metavar="SECONDS",
)
NODE_CHECK_CMD: Setting[str | None] = Setting(
    "node_check_cmd",
    _BAD_NODES,
    "--node-check-cmd",
    Kind(parse_node_check_cmd, "a shell command"),
    None,
    "A command run (by /bin/sh) in the node check: exit 0 is healthy, otherwise its first "
    "output line is the reason; a timeout is unhealthy.",
    (_options("node_check_cmd"),),
    unset="none",
    metavar="CMD",
)
LINK_CHECK: Setting[str] = Setting(
    "link_check",
    _BAD_NODES,
    "--link-check",
    Kind(_link_mode, "off, warn or exclude"),
    "warn",
    "After a round of several nodes forms, time a few MB of collectives between the nodes "
    "over the workers' backend and name a node whose bandwidth is under 1/--straggler-factor "
    "of the median: off, warn, or exclude (a slow node leaves when a spare waits).",
    (_options("link_check"),),
    metavar="MODE",
)
PRINT_CONFIG: Setting[bool] = Setting(
    "print_config",
    _LAUNCHER,
    "--print-config",
    Switch(),
    False,
    "Print the effective options and why, then exit.",
    (_cli("print every setting, its value and where it came from; start nothing"),),
    form="flag",
    attr=None,
)
# torch's variables without a flag.
TIMER_FILE: Setting[str | None] = Setting(
    "timer_file",
    _HEALTH,
    None,
    _OPTIONAL_TEXT,
    None,
    "The watchdog's FIFO (passed on to the workers).",
    (_options("timer_file"),),
    torch_env=TORCHELASTIC_TIMER_FILE,
    unset="in the run's log directory",
)
LOG_LINE_PREFIX_TEMPLATE: Setting[str | None] = Setting(
    "log_line_prefix_template",
    _LOGS,
    None,
    _OPTIONAL_TEXT,
    None,
    "The prefix of teed console lines (${role_name}, ${rank}, ${local_rank}).",
    (_agent("log_line_prefix_template"),),
    torch_env=TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE,
    unset="[<role><local rank>]:",
)
LAUNCHER_ERROR_FILE: Setting[str | None] = Setting(
    "launcher_error_file",
    _LOGS,
    None,
    _OPTIONAL_TEXT,
    None,
    "Where the launcher writes the root-cause failure's error record (torch's @record main).",
    (_cli("the launcher's error file"),),
    torch_env=TORCHELASTIC_ERROR_FILE,
    unset="none",
)

SETTINGS: tuple[Setting[Any], ...] = (
    NNODES,
    NPROC_PER_NODE,
    RDZV_BACKEND,
    RDZV_ENDPOINT,
    RDZV_ID,
    RDZV_CONF,
    STANDALONE,
    MAX_RESTARTS,
    MONITOR_INTERVAL,
    START_METHOD,
    ROLE,
    MODULE,
    NO_PYTHON,
    RUN_PATH,
    LOG_DIR,
    REDIRECTS,
    TEE,
    LOCAL_RANKS_FILTER,
    NODE_RANK,
    MASTER_ADDR,
    MASTER_PORT,
    LOCAL_ADDR,
    SIGNALS_TO_HANDLE,
    SHUTDOWN_TIMEOUT,
    LOGS_SPECS,
    EVENT_LOG_HANDLER,
    DUPLICATE_STDOUT_FILTERS,
    DUPLICATE_STDERR_FILTERS,
    NUMA_BINDING,
    VIRTUAL_LOCAL_RANK,
    WATCHDOG,
    WARM_START,
    PRELOAD,
    HEALTH_CHECK_PORT,
    HEALTH_CHECK_ADDR,
    HEALTH_CHECK_TIMEOUT,
    LIVE,
    EXIT_BARRIER_TIMEOUT,
    ELASTIC_MIN,
    HANG_TIMEOUT,
    STRAGGLER_FACTOR,
    MAX_NO_PROGRESS_RESTARTS,
    AUTO_PROGRESS,
    SCRIPT_EXIT_TIMEOUT,
    MAX_NODE_FAILURES,
    NODE_CHECK,
    NODE_CHECK_TIMEOUT,
    NODE_CHECK_CMD,
    LINK_CHECK,
    PRINT_CONFIG,
    TIMER_FILE,
    LOG_LINE_PREFIX_TEMPLATE,
    LAUNCHER_ERROR_FILE,
)
"""Every setting, in the order ``--help`` and ``--print-config`` list them."""

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = SIGNALS_TO_HANDLE.default
"""The signals the agent handles and forwards unless told otherwise (torchrun's)."""

_BY_NAME: Mapping[str, Setting[Any]] = {setting.name: setting for setting in SETTINGS}


def by_name(name: str) -> Setting[Any]:
    """The setting called ``name`` (``nproc_per_node``).

    Raises:
        KeyError: no such setting.
    """
    return _BY_NAME[name]


def arguments(
    target: Target, config: object, rows: Iterable[Setting[Any]] = SETTINGS
) -> dict[str, Any]:
    """The keyword arguments ``target`` takes from ``config``: one per row that goes there.

    The one hand-over of values from the launch configuration to the objects that use them
    (``WorkerSpec``, ``LocalElasticAgent``, ``AgentOptions``, ``ProgressOptions``): a loop over
    the rows, never a field copied by hand.

    Args:
        target: the object the arguments are for.
        config: what holds the values, as attributes named by each row's ``attribute``.
        rows: the settings (default: every one).

    Returns:
        ``{field at the target: value}``.
    """
    out: dict[str, Any] = {}
    for row in rows:
        attribute = row.attribute
        for place in row.places:
            if place.target is target and attribute is not None:
                out[place.field] = getattr(config, attribute)
    return out
