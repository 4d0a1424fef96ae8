"""The run command's option table: torchrun's flags, their spellings, defaults and help.

One concept: which options ``elastic-run run`` takes and how click reads them. Every flag is
accepted with dashes and with underscores (``--nproc-per-node``, ``--nproc_per_node``) and
also from its ``PET_<NAME>`` variable (``PET_NPROC_PER_NODE``), as torchrun reads them. Values
arrive as text or click's int/float/bool; they are checked in
:mod:`elastic_run.cli.options.launch_config`, never here, so that every bad value is one ``Error:``
line with the same wording, whatever its source.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

__all__ = ["RUN_OPTIONS", "run_options"]


def _names(flag: str, *short: str) -> list[str]:
    """``--nproc-per-node`` -> the dash and underscore spellings (plus short aliases)."""
    under = "--" + flag[2:].replace("-", "_")
    return [*short, flag] + ([under] if under != flag else [])


def _env(flag: str) -> str:
    return "PET_" + flag[2:].replace("-", "_").upper()


def _opt(
    flag: str, *short: str, **kwargs: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A click option under both spellings and its PET_* variable (``--a/--no-a`` too)."""
    if "/" in flag:
        on, off = flag.split("/")
        kwargs.setdefault("envvar", _env(on))
        names = [f"{on}/{off}"]
        under_on, under_off = ("--" + on[2:].replace("-", "_"), "--" + off[2:].replace("-", "_"))
        if under_on != on:
            names.append(f"{under_on}/ ")
        if under_off != off:
            names.append(f" /{under_off}")
        return click.option(*names, **kwargs)
    kwargs.setdefault("envvar", _env(flag))
    return click.option(*_names(flag, *short), **kwargs)


RUN_OPTIONS: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    _opt(
        "--nnodes", default="1:1", show_default=True, help="Nodes: N or MIN:MAX (MIN: under SLURM)."
    ),
    _opt(
        "--nproc-per-node",
        default="1",
        show_default=True,
        help="Workers per node: N, cpu, gpu, xpu or auto.",
    ),
    _opt(
        "--rdzv-backend",
        default="static",
        show_default=True,
        help="static, c10d, etcd, etcd-v2 or embedded-etcd.",
    ),
    _opt("--rdzv-endpoint", default="", help="host[:port] of the rendezvous backend."),
    _opt("--rdzv-id", default="none", show_default=True, help="The job id shared by all nodes."),
    _opt("--rdzv-conf", default="", help="Backend config: k1=v1,k2=v2."),
    _opt(
        "--standalone",
        is_flag=True,
        default=False,
        help="One node, c10d on localhost, free port, random id.",
    ),
    _opt(
        "--max-restarts",
        type=int,
        default=0,
        show_default=True,
        help="Failures restarted before giving up.",
    ),
    _opt(
        "--monitor-interval",
        type=float,
        default=0.1,
        show_default=True,
        help="Seconds between worker checks.",
    ),
    _opt(
        "--start-method",
        type=click.Choice(["spawn", "fork", "forkserver"]),
        default="spawn",
        help="Accepted for torchrun compatibility (workers are subprocesses).",
    ),
    _opt("--role", default="default", show_default=True, help="The workers' role name."),
    _opt("--module", "-m", is_flag=True, default=False, help="Run SCRIPT as a module (python -m)."),
    _opt(
        "--no-python", is_flag=True, default=False, help="Run SCRIPT as a program, without python."
    ),
    _opt("--run-path", is_flag=True, default=False, help="Accepted for torchrun compatibility."),
    _opt("--log-dir", default=None, help="Base directory of the logs (default: a temporary one)."),
    _opt("--redirects", "-r", default="0", help="Streams to files only: 0-3, or per rank 0:1,1:2."),
    _opt("--tee", "-t", default="0", help="Streams to files and console: 0-3, or per rank."),
    _opt("--local-ranks-filter", default="", help="Local ranks shown on the console: 0,1."),
    _opt("--node-rank", type=int, default=0, show_default=True, help="This node's rank (static)."),
    _opt("--master-addr", default="127.0.0.1", show_default=True, help="Master address (static)."),
    _opt("--master-port", type=int, default=29500, show_default=True, help="Master port (static)."),
    _opt("--local-addr", default=None, help="The address this node advertises (default: FQDN)."),
    _opt(
        "--signals-to-handle",
        default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        show_default=True,
        help="Signals forwarded to the workers.",
    ),
    _opt(
        "--shutdown-timeout",
        type=float,
        default=None,
        help="Seconds between the signal and SIGKILL [30].",
    ),
    _opt(
        "--logs-specs",
        default=None,
        help="A LogsSpecs class from the entry point group torchrun.logs_specs.",
    ),
    _opt(
        "--event-log-handler",
        default="null",
        show_default=True,
        help="torch's events handler for the agent's events: null, console, ...",
    ),
    _opt(
        "--duplicate-stdout-filters",
        default="",
        help="Teed stdout lines containing one of these (a,b; ',,' is a comma) also go to "
        "attempt_<n>/filtered_stdout.log.",
    ),
    _opt(
        "--duplicate-stderr-filters",
        default="",
        help="The same for stderr (filtered_stderr.log).",
    ),
    _opt(
        "--numa-binding",
        type=click.Choice(["node", "socket", "exclusive", "core-complex"]),
        default=None,
        help="Bind each worker to the CPUs near its GPU (numactl).",
    ),
    _opt(
        "--virtual-local-rank",
        is_flag=True,
        default=False,
        help="Every worker sees LOCAL_RANK=0 and only its GPU (CUDA_VISIBLE_DEVICES).",
    ),
    _opt(
        "--watchdog/--no-watchdog",
        default=None,
        help="File-timer watchdog (TORCHELASTIC_ENABLE_FILE_TIMER).",
    ),
    _opt(
        "--warm-start/--no-warm-start",
        default=None,
        help=(
            "Fork Python workers from a per-node zygote that has torch imported [on unless the "
            "script imports only the standard library]."
        ),
    ),
    _opt("--preload", default="", help="Modules the zygote imports after torch: a,b.c."),
    _opt(
        "--health-check-port",
        type=int,
        default=None,
        help="Serve /healthz, /status, /metrics here.",
    ),
    _opt(
        "--health-check-addr",
        default="127.0.0.1",
        show_default=True,
        help="Address of the health server.",
    ),
    _opt(
        "--health-check-timeout",
        type=float,
        default=60.0,
        show_default=True,
        help="Seconds without progress before /healthz fails.",
    ),
    _opt(
        "--live/--no-live",
        default=None,
        help="The live panel (default: when stderr is a terminal).",
    ),
    _opt(
        "--exit-barrier-timeout",
        type=float,
        default=300.0,
        show_default=True,
        help="Seconds a finished node waits for the others.",
    ),
    _opt(
        "--elastic-min", type=int, default=None, help="Under SLURM: MIN for --nnodes MIN:<nodes>."
    ),
    _opt(
        "--hang-timeout",
        default="auto",
        show_default=True,
        help="Silence after a progress beat that makes a worker hung: auto, auto:FLOOR, S, off.",
    ),
    _opt(
        "--straggler-factor",
        type=float,
        default=1.5,
        show_default=True,
        help="A rank this many times slower than the median step is a straggler.",
    ),
    _opt(
        "--max-no-progress-restarts",
        type=int,
        default=0,
        show_default=True,
        help="Exit 5 after K restarts in a row without a progress beat (0: off).",
    ),
    _opt(
        "--auto-progress/--no-auto-progress",
        default=True,
        show_default=True,
        help="Python workers beat once per optimizer step (torch's global optimizer hook).",
    ),
    _opt(
        "--script-exit-timeout",
        default="60",
        show_default=True,
        help="Kill a worker whose process outlives its script's end by S seconds (off: never).",
    ),
    _opt(
        "--print-config",
        is_flag=True,
        default=False,
        help="Print the effective options and why, then exit.",
    ),
]


def run_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Attach every option of :data:`RUN_OPTIONS` to a click command, in table order.

    Args:
        fn: the command function.

    Returns:
        The function with the options attached.
    """
    for option in reversed(RUN_OPTIONS):
        fn = option(fn)
    return fn
