"""The ``elastic-run`` command: ``run`` (the default), ``status``, ``close``, ``etcd``.

``elastic-run [OPTIONS] SCRIPT [ARGS...]`` is ``elastic-run run ...``: torchrun's flags with
torchrun's spelling and defaults (dashes or underscores), each also read from ``PET_<NAME>``.
Everything the user typed is checked here, before any process starts: bad input is one line
``Error: ...`` on stderr and exit code 2. torch is imported only once a job really starts, so
``--help`` answers at once.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click

from elastic_run import __version__
from elastic_run.agent.config import LaunchConfig, Std, StdSpec
from elastic_run.errors import ConfigurationError, ElasticRunError

__all__ = ["main", "parse_launch_config"]

_SUBCOMMANDS = ("run", "status", "close", "etcd")


def _names(flag: str, *short: str) -> list[str]:
    """``--nproc-per-node`` -> the dash and underscore spellings (plus short aliases)."""
    under = "--" + flag[2:].replace("-", "_")
    return [*short, flag] + ([under] if under != flag else [])


def _env(flag: str) -> str:
    return "PET_" + flag[2:].replace("-", "_").upper()


class _DefaultRunGroup(click.Group):
    """A group whose default command is ``run``: ``elastic-run train.py`` runs it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in _SUBCOMMANDS and args[0] not in ("--help", "-h", "--version"):
            args = ["run", *args]
        elif not args:
            args = ["run"]
        return super().parse_args(ctx, args)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The group's options and commands, then the run command's options (torchrun's)."""
        super().format_options(ctx, formatter)
        run = self.get_command(ctx, "run")
        if run is None:
            return
        sub = click.Context(run, info_name="run", parent=ctx)
        rows = [r for p in run.get_params(sub) if (r := p.get_help_record(sub)) is not None]
        with formatter.section("Run options (elastic-run [OPTIONS] SCRIPT [ARGS]...)"):
            formatter.write_dl(rows)


@click.group(cls=_DefaultRunGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="elastic-run")
def cli() -> None:
    """elastic-run: an elastic launcher for PyTorch (torchrun's flags; faster, safer, visible).

    \b
    elastic-run [OPTIONS] SCRIPT [ARGS]...   run a job (the default command)
    elastic-run status --rdzv-id JOB ...     show a job's rendezvous
    elastic-run close --rdzv-id JOB ...      end a job
    elastic-run etcd                         run a local etcd for jobs
    """


# -- parsing values ---------------------------------------------------------------------


def parse_nnodes(text: str) -> tuple[int, int]:
    """``N`` or ``MIN:MAX`` -> (min, max), 0 < min <= max."""
    parts = text.split(":")
    try:
        if len(parts) == 1:
            low = high = int(parts[0])
        elif len(parts) == 2:
            low, high = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise ConfigurationError(f"--nnodes '{text}' is not N or MIN:MAX") from None
    if low < 1:
        raise ConfigurationError(f"--nnodes '{text}': the node count must be at least 1")
    if high < low:
        raise ConfigurationError(f"--nnodes '{text}': MAX must not be less than MIN")
    return low, high


def parse_nproc(text: str) -> int:
    """``N``, ``cpu``, ``gpu`` or ``auto`` -> a worker count."""
    value = text.strip().lower()
    if value == "cpu":
        return os.cpu_count() or 1
    if value in ("gpu", "auto"):
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.device_count())
        if value == "gpu":
            raise ConfigurationError("--nproc-per-node gpu: no CUDA device is available")
        return os.cpu_count() or 1
    try:
        count = int(value)
    except ValueError:
        raise ConfigurationError(
            f"--nproc-per-node '{text}' is not a number, cpu, gpu or auto"
        ) from None
    if count < 1:
        raise ConfigurationError(f"--nproc-per-node '{text}' must be at least 1")
    return count


def parse_std(text: str, flag: str) -> StdSpec:
    """``3`` or ``0:1,1:2`` -> a StdSpec."""
    value = text.strip()
    if not value:
        return StdSpec()

    def one(item: str) -> Std:
        if item not in ("0", "1", "2", "3"):
            raise ConfigurationError(
                f"{flag} '{text}': expected 0..3 or LOCAL_RANK:0..3 items separated by commas"
            )
        return Std(int(item))

    if ":" not in value:
        return StdSpec(default=one(value))
    per_rank: list[tuple[int, Std]] = []
    for item in value.split(","):
        rank, sep, std = item.partition(":")
        if not sep or not rank.strip().isdigit():
            raise ConfigurationError(
                f"{flag} '{text}': expected 0..3 or LOCAL_RANK:0..3 items separated by commas"
            )
        per_rank.append((int(rank), one(std.strip())))
    return StdSpec(per_rank=tuple(per_rank))


def parse_rdzv_conf(text: str) -> tuple[tuple[str, str], ...]:
    """``k1=v1,k2=v2`` -> pairs."""
    if not text.strip():
        return ()
    pairs: list[tuple[str, str]] = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(
                f"--rdzv-conf '{text}': expected key=value pairs, got '{item}'"
            )
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


def parse_signals(text: str) -> tuple[signal.Signals, ...]:
    """``SIGTERM,SIGINT`` -> signals."""
    out: list[signal.Signals] = []
    for name in text.split(","):
        name = name.strip().upper()
        if not name:
            continue
        if not name.startswith("SIG"):
            name = "SIG" + name
        try:
            sig = signal.Signals[name]
        except KeyError:
            raise ConfigurationError(f"--signals-to-handle: unknown signal '{name}'") from None
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            raise ConfigurationError(f"--signals-to-handle: {name} cannot be handled")
        out.append(sig)
    return tuple(out)


def _parse_port(value: int | None, flag: str) -> int | None:
    if value is not None and not 0 <= value <= 65535:
        raise ConfigurationError(f"{flag} {value} is out of range (0..65535)")
    return value


def _check_endpoint_port(endpoint: str) -> None:
    for part in endpoint.split(","):
        part = part.strip()
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if sep and host and not host.endswith("]") and ":" in host:
            continue  # a bare IPv6 address
        if sep and host:
            if not port.isdigit() or not 0 <= int(port) <= 65535:
                raise ConfigurationError(
                    f"--rdzv-endpoint '{endpoint}': port '{port}' is not in 0..65535"
                )


def _check_log_dir(path: Path) -> None:
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigurationError(f"--log-dir {path} cannot be written")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "y", "t", "on")


# -- the run command ----------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedRun:
    """The run command's result of parsing: the config, and what --print-config shows."""

    config: LaunchConfig
    chosen: tuple[tuple[str, object, str], ...]
    notices: tuple[str, ...]


def parse_launch_config(
    params: dict[str, Any],
    explicit: set[str],
    environ: dict[str, str] | None = None,
) -> ParsedRun:
    """Turn the run command's parameters into a LaunchConfig; every check happens here.

    Args:
        params: click's parameter values.
        explicit: the names the user set (command line or PET_* variable).
        environ: the environment (default: os.environ).

    Raises:
        ConfigurationError: anything bad, as one line.
    """
    from elastic_run.cli.slurm import slurm_defaults

    env = dict(os.environ if environ is None else environ)
    notices: list[str] = []
    chosen: list[tuple[str, object, str]] = []
    elastic_min = params.get("elastic_min")
    given: dict[str, object] = {
        k: params[k]
        for k in ("rdzv_id", "rdzv_backend", "rdzv_endpoint", "nproc_per_node")
        if k in explicit
    }
    if "nnodes" in explicit:
        given["nnodes"] = params["nnodes"]
    for default in slurm_defaults(env, given=given, elastic_min=elastic_min):
        params[default.name] = default.value
        explicit.add(default.name)
        chosen.append((default.name, default.value, default.reason))

    script = params["script"]
    if script is None:
        raise ConfigurationError("missing SCRIPT: elastic-run [OPTIONS] SCRIPT [ARGS]...")
    if params["module"] and params["no_python"]:
        raise ConfigurationError("-m/--module and --no-python cannot be used together")
    if not params["module"] and not params["no_python"]:
        if not Path(script).is_file():
            raise ConfigurationError(f"the script '{script}' does not exist")
    if params["no_python"] and not Path(script).is_file() and shutil.which(script) is None:
        raise ConfigurationError(f"the program '{script}' does not exist")
    min_nodes, max_nodes = parse_nnodes(str(params["nnodes"]))
    nproc = parse_nproc(str(params["nproc_per_node"]))
    if params["max_restarts"] < 0:
        raise ConfigurationError(f"--max-restarts {params['max_restarts']} must not be negative")
    if params["monitor_interval"] <= 0:
        raise ConfigurationError("--monitor-interval must be positive")
    redirects = parse_std(params["redirects"], "--redirects")
    tee = parse_std(params["tee"], "--tee")
    rdzv_conf = parse_rdzv_conf(params["rdzv_conf"])
    signals = parse_signals(params["signals_to_handle"])
    master_port = _parse_port(params["master_port"], "--master-port")
    health_port = params["health_check_port"]
    if health_port is None and env.get("TORCHELASTIC_HEALTH_CHECK_PORT"):
        try:
            health_port = int(env["TORCHELASTIC_HEALTH_CHECK_PORT"])
        except ValueError:
            raise ConfigurationError(
                "TORCHELASTIC_HEALTH_CHECK_PORT is not a port number"
            ) from None
    _parse_port(health_port, "--health-check-port")
    _check_endpoint_port(params["rdzv_endpoint"])
    log_dir = Path(params["log_dir"]) if params["log_dir"] else None
    if log_dir is not None:
        _check_log_dir(log_dir)
    filter_text = params["local_ranks_filter"].strip()
    ranks_filter: frozenset[int] | None = None
    if filter_text:
        try:
            ranks_filter = frozenset(int(r) for r in filter_text.split(","))
        except ValueError:
            raise ConfigurationError(
                f"--local-ranks-filter '{filter_text}': expected local ranks separated by commas"
            ) from None
    shutdown_timeout = params["shutdown_timeout"]
    if shutdown_timeout is None:
        try:
            shutdown_timeout = float(env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"))
        except ValueError:
            raise ConfigurationError("TORCH_ELASTIC_SHUTDOWN_TIMEOUT is not a number") from None
    if shutdown_timeout < 0:
        raise ConfigurationError("--shutdown-timeout must not be negative")

    backend = params["rdzv_backend"]
    endpoint = params["rdzv_endpoint"]
    run_id = params["rdzv_id"]
    local_addr = params["local_addr"]
    if params["standalone"]:
        backend, endpoint = "c10d", "localhost:0"
        run_id = str(uuid.uuid4())
        local_addr = local_addr or "localhost"
        if min_nodes != 1 or max_nodes != 1:
            notices.append("--standalone runs a single node: --nnodes is set to 1")
        min_nodes = max_nodes = 1
        chosen.append(("rdzv", "c10d localhost:<free port>", "--standalone"))
    if backend == "static":
        if min_nodes != max_nodes:
            raise ConfigurationError(
                "--nnodes MIN:MAX needs an elastic backend (--rdzv-backend c10d or etcd)"
            )
        endpoint = f"{params['master_addr']}:{master_port}"
        rdzv_conf = (*rdzv_conf, ("rank", str(params["node_rank"])))
        if not 0 <= params["node_rank"] < max_nodes:
            raise ConfigurationError(
                f"--node-rank {params['node_rank']} is out of range for --nnodes {max_nodes}"
            )
    elif backend in ("c10d", "etcd", "etcd-v2") and not endpoint:
        raise ConfigurationError(f"--rdzv-backend {backend} needs --rdzv-endpoint host:port")
    watchdog = params["watchdog"]
    if watchdog is None:
        watchdog = _truthy(env.get("TORCHELASTIC_ENABLE_FILE_TIMER"))
    timer_file = env.get("TORCHELASTIC_TIMER_FILE") or None
    if nproc > 1 and "OMP_NUM_THREADS" not in env:
        notices.append(
            "OMP_NUM_THREADS is set to 1 for each worker to avoid overloading the system; "
            "tune it for your workload"
        )
    config = LaunchConfig(
        entrypoint=script,
        args=tuple(params["script_args"]),
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=nproc,
        run_id=run_id,
        role=params["role"],
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_configs=rdzv_conf,
        standalone=params["standalone"],
        max_restarts=params["max_restarts"],
        monitor_interval_s=params["monitor_interval"],
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
        local_addr=local_addr,
        signals_to_handle=signals,
        shutdown_timeout_s=shutdown_timeout,
        watchdog=bool(watchdog),
        timer_file=timer_file,
        health_check_port=health_port,
        health_check_addr=params["health_check_addr"],
        health_check_timeout_s=params["health_check_timeout"],
        live=params["live"],
        exit_barrier_timeout_s=params["exit_barrier_timeout"],
    )
    for name in ("nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id"):
        if not any(c[0] == name for c in chosen):
            chosen.append((name, params[name], "given" if name in explicit else "default"))
    return ParsedRun(config, tuple(chosen), tuple(notices))


def _opt(
    flag: str, *short: str, **kwargs: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
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


_RUN_OPTIONS = [
    _opt(
        "--nnodes", default="1:1", show_default=True, help="Nodes: N or MIN:MAX (MIN: under SLURM)."
    ),
    _opt(
        "--nproc-per-node",
        default="1",
        show_default=True,
        help="Workers per node: N, cpu, gpu or auto.",
    ),
    _opt(
        "--rdzv-backend", default="static", show_default=True, help="static, c10d, etcd or etcd-v2."
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
        "--watchdog/--no-watchdog",
        default=None,
        help="File-timer watchdog (TORCHELASTIC_ENABLE_FILE_TIMER).",
    ),
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
        "--print-config",
        is_flag=True,
        default=False,
        help="Print the effective options and why, then exit.",
    ),
]


def _run_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_RUN_OPTIONS):
        fn = option(fn)
    return fn


@cli.command(
    "run", context_settings={"allow_interspersed_args": False, "ignore_unknown_options": False}
)
@_run_options
@click.argument("script", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run_command(ctx: click.Context, /, **params: Any) -> None:
    """Run SCRIPT on this node as part of an elastic job (the default command)."""
    # torch's C++ layer logs each store wait that timed out and each failed connect as a
    # warning with a stack: noise in the agent, whose errors are one line. Set before torch
    # loads; the workers keep the user's level (torch's default, WARNING, when none was set).
    user_level = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    from elastic_run.cli.slurm import format_print_config, should_exit_as_extra_task

    notice = should_exit_as_extra_task(os.environ)
    if notice is not None:
        click.echo(notice, err=True)
        sys.exit(0)
    explicit = {
        name
        for name in params
        if ctx.get_parameter_source(name)
        in (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    }
    if params["print_config"] and params["script"] is None:
        params["script"] = sys.executable  # a placeholder: --print-config starts nothing
        params["no_python"] = True
    parsed = parse_launch_config(params, explicit)
    if params["print_config"]:
        click.echo(format_print_config(parsed.chosen), nl=False)
        sys.exit(0)
    for line in parsed.notices:
        click.echo(f"elastic-run: {line}", err=True)
    import dataclasses

    config = dataclasses.replace(
        parsed.config,
        extra_env=(("TORCH_CPP_LOG_LEVEL", user_level or "WARNING"), *parsed.config.extra_env),
    )
    from elastic_run.cli.run import run_job

    _exit_now(run_job(config))


def _exit_now(code: int) -> NoReturn:
    """Leave at once once the job is over: everything is stopped, flushed and closed by now.

    Python's own teardown with torch.distributed loaded takes about 0.3 s and runs nothing
    the agent needs (its workers, logs, stores and guardian are already gone).
    """
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _attach_optional_commands() -> None:
    from elastic_run.cli.etcd_cmd import etcd_command

    cli.add_command(etcd_command, "etcd")
    try:
        from elastic_run.cli.status import close_command, status_command
    except ImportError:
        return
    cli.add_command(status_command, "status")
    cli.add_command(close_command, "close")


_attach_optional_commands()


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> None:
    """The console script: run the CLI, turning every expected error into one line."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cli.main(args=args, prog_name="elastic-run", standalone_mode=False)
    except click.exceptions.Abort:
        _fail("aborted", 130)
    except click.ClickException as exc:
        _fail(exc.format_message().replace("\n", " "), 2)
    except ConfigurationError as exc:
        _fail(str(exc), 2)
    except ElasticRunError as exc:
        _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    sys.exit(0)
