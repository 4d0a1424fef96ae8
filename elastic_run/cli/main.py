"""The ``elastic-run`` command group and its entry point: ``run`` (the default), ``status``,
``close``, ``etcd``, ``report``.

``elastic-run [OPTIONS] SCRIPT [ARGS...]`` is ``elastic-run run ...``: torchrun's flags with
torchrun's spelling and defaults (dashes or underscores), each also read from ``PET_<NAME>``
(the table: :mod:`elastic_run.agent.settings.table`; its click options:
:mod:`elastic_run.cli.options.run_options`). Everything the user typed is checked by
:func:`~elastic_run.cli.options.launch_config.parse_launch_config` before any process starts; here,
:func:`main` turns every expected error into one line ``Error: ...`` on stderr and its exit
code (2 for bad usage). torch is imported only once a job really starts, so ``--help`` answers
at once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from elastic_run import __version__
from elastic_run.cli.options.launch_config import ParsedRun, parse_launch_config
from elastic_run.cli.options.run_options import run_options
from elastic_run.errors import ConfigurationError, ElasticRunError

# parse_launch_config and ParsedRun live in cli.launch_config; named here too for old imports.
__all__ = [
    "ParsedRun",
    "cli",
    "main",
    "parse_launch_config",
    "run_command",
]

_SUBCOMMANDS = ("run", "status", "close", "etcd", "report")

# The environment as the user gave it, taken before main() changes anything in it
# (GRPC_ENABLE_FORK_SUPPORT): the workers start from this one, as under torchrun.
_user_env: tuple[tuple[str, str], ...] | None = None


class _DefaultRunGroup(click.Group):
    """A group whose default command is ``run``: ``elastic-run train.py`` runs it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in _SUBCOMMANDS and args[0] not in ("--help", "-h", "--version"):
            args = ["run", *args]
        elif not args:
            args = ["run"]
        if args[0] == "run":
            args = ["run", *_spelled_out(args[1:])]
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


def _spelled_out(args: list[str]) -> list[str]:
    """The run command's arguments with argparse-style abbreviations spelled out."""
    from elastic_run.cli.options.torchrun_flags import expand_prefixes

    long_flags: list[str] = ["--help"]
    valued: list[str] = []
    for param in run_command.params:
        if not isinstance(param, click.Option):
            continue
        names = [n.strip() for n in (*param.opts, *param.secondary_opts) if n.strip()]
        long_flags.extend(n for n in names if n.startswith("--"))
        if not param.is_flag:
            valued.extend(names)
    return expand_prefixes(args, long_flags, valued)


@click.group(cls=_DefaultRunGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="elastic-run")
def cli() -> None:
    """elastic-run: an elastic launcher for PyTorch (torchrun's flags; faster, safer, visible).

    \b
    elastic-run [OPTIONS] SCRIPT [ARGS]...   run a job (the default command)
    elastic-run status --rdzv-id JOB ...     show a job's rendezvous
    elastic-run close --rdzv-id JOB ...      end a job
    elastic-run etcd                         run a local etcd for jobs
    elastic-run report LOG_DIR...            a page of what happened to a job
    """


@cli.command(
    "run", context_settings={"allow_interspersed_args": False, "ignore_unknown_options": False}
)
@run_options
@click.argument("script", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run_command(ctx: click.Context, /, **params: Any) -> None:
    """Run SCRIPT on this node as part of an elastic job (the default command)."""
    # torch's C++ layer logs each store wait that timed out and each failed connect as an
    # error with a stack (about 20 lines for an unreachable endpoint): noise in the agent,
    # whose errors are one line, so only its fatal lines stay. Set before torch
    # loads; the workers start from the environment as the user gave it (torchrun's keys and
    # values, no TORCH_CPP_LOG_LEVEL added).
    user_env = _user_env if _user_env is not None else tuple(os.environ.items())
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    # gRPC's C core (etcd) logs each failed TLS handshake and connect the same way.
    os.environ["GRPC_VERBOSITY"] = "NONE"
    from elastic_run.cli.slurm.allocation import format_print_config, should_exit_as_extra_task

    notice = should_exit_as_extra_task(os.environ)
    if notice is not None:
        click.echo(notice, err=True)
        sys.exit(0)
    explicit = {
        name
        for name in params
        if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
    }
    parsed = parse_launch_config(params, explicit)
    if parsed.print_config:
        click.echo(format_print_config(parsed.chosen), nl=False)
        sys.exit(0)
    for line in parsed.notices:
        click.echo(f"elastic-run: {line}", err=True)
    import dataclasses

    config = dataclasses.replace(parsed.config, base_env=user_env)
    from elastic_run.cli.run import run_job

    code = run_job(config)
    if isinstance(ctx.obj, _InProcess):  # elastic_run.run.main: the caller's process goes on
        sys.exit(code)
    _exit_now(code)


class _InProcess:
    """``ctx.obj`` of a run from :func:`main` with ``in_process=True``: end by ``SystemExit``."""


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
    from elastic_run.cli.report.command import report_command

    cli.add_command(report_command, "report")
    try:
        from elastic_run.cli.status import close_command, status_command
    except ImportError:
        return
    cli.add_command(status_command, "status")
    cli.add_command(close_command, "close")


_attach_optional_commands()


def _fail(message: str, code: int) -> NoReturn:
    """Print ``Error: message`` as one line (any line break in it becomes a space) and exit."""
    click.echo("Error: " + " ".join(message.split()), err=True)
    sys.exit(code)


def main(argv: Sequence[str] | None = None, *, in_process: bool = False) -> None:
    """The console script: run the CLI, turning every expected error into one line.

    Args:
        argv: the arguments (``sys.argv[1:]`` when None).
        in_process: end a job by ``SystemExit`` with its code, as any other end, so that the
            caller's process goes on (``elastic_run.run.main``); the console script leaves at
            once when the job is over (``_exit_now``).

    Raises:
        SystemExit: always, with the exit code.
    """
    from elastic_run.rendezvous.etcd.grpc_fork import disable_grpc_fork_handlers
    from elastic_run.rendezvous.owned_dir import reclaim_every_orphan

    global _user_env
    _user_env = tuple(os.environ.items())
    disable_grpc_fork_handlers()  # before anything imports grpc (see grpc_fork.py)
    # etcd data folders (123 MB each) and function workers' folders whose owners were SIGKILLed
    # with their whole process tree: the next elastic-run on the host removes them; never one
    # whose owner lives (its lock).
    reclaim_every_orphan()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cli.main(
            args=args,
            prog_name="elastic-run",
            standalone_mode=False,
            obj=_InProcess() if in_process else None,
        )
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
