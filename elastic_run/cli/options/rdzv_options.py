"""The rendezvous options of ``status`` and ``close``, spelled as the ``run`` command spells them.

One concept: turn what the user typed (``--rdzv-backend``, ``--rdzv-endpoint``, ``--rdzv-id``,
``--rdzv-conf``, ``--nnodes``, ``--slurm-job``), the ``PET_*`` variables and a Slurm
allocation's variables into one frozen :class:`RendezvousTarget`: which job's rendezvous, on
which backend. Every flag takes its dash and its underscore spelling (``--rdzv-id`` and
``--rdzv_id``), and each also reads ``PET_<NAME>`` (``PET_RDZV_ID``...).

The flags' spellings and ``PET_*`` variables are the settings table's rows
(:mod:`elastic_run.agent.settings.table`), and the values are read by the same parsers as the run
command's (``--nnodes`` by its row's, :func:`parse_rdzv_conf` and :func:`validate_rdzv_conf`);
the run id is made safe for a path the same way (:func:`safe_run_id`), so ``status`` finds the
job an agent started with the same ``--rdzv-id``.

Precedence, highest first: a flag on the command line, its ``PET_*`` variable, ``--slurm-job``
(asks ``scontrol``/``squeue``), the Slurm allocation the command runs in (``SLURM_JOB_ID``...),
the defaults (backend ``c10d``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from elastic_run.agent.settings.table import NNODES, by_name
from elastic_run.agent.settings.values import safe_run_id
from elastic_run.cli.options.rdzv_conf import parse_rdzv_conf, validate_rdzv_conf
from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.settings import RendezvousConf

__all__ = [
    "RDZV_OPTION_NAMES",
    "RendezvousTarget",
    "explicit_options",
    "rdzv_options",
    "resolve_target",
]

F = TypeVar("F", bound=Callable[..., Any])

RDZV_OPTION_NAMES = ("rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "nnodes", "slurm_job")
_READABLE_BACKENDS = ("c10d", "etcd", "etcd-v2", "embedded-etcd")


# `status` and `close` read a running job, which no static rendezvous can serve.
_STATUS_BACKEND = "c10d"


def _option(name: str, **kwargs: Any) -> Callable[[F], F]:
    """The click option of the run command's setting ``name``: its spellings and its ``PET_*``
    variable (from the settings table), with this command's help."""
    setting = by_name(name)
    kwargs.setdefault("envvar", setting.pet_env)
    kwargs.setdefault("show_envvar", True)
    return click.option(*setting.spellings, name, **kwargs)


def rdzv_options(fn: F) -> F:
    """Add the rendezvous options to a click command.

    The command receives ``rdzv_backend``, ``rdzv_endpoint``, ``rdzv_id``, ``rdzv_conf``,
    ``nnodes`` and ``slurm_job`` keyword arguments (strings, or None when not given); pass
    them to :func:`resolve_target`.

    Args:
        fn: the command function.

    Returns:
        The function with the options attached.
    """
    options = [
        _option(
            "rdzv_backend",
            type=click.Choice(_READABLE_BACKENDS),
            default=_STATUS_BACKEND,
            show_default=True,
            help="The job's rendezvous backend.",
        ),
        _option(
            "rdzv_endpoint",
            default=None,
            help="host[:port] of the backend (c10d port 29400, etcd 2379, embedded-etcd 29410; a,b,c).",
        ),
        _option("rdzv_id", default=None, help="The job id (the run command's --rdzv-id)."),
        _option(
            "rdzv_conf",
            default=None,
            help="Backend config k1=v1,k2=v2 (read_timeout, TLS files, keep_alive_interval...).",
        ),
        _option(
            "nnodes",
            default=None,
            help="The job's N or MIN:MAX, for the state label (waiting / last call).",
        ),
        click.option(
            "--slurm-job",
            "--slurm_job",
            "slurm_job",
            default=None,
            metavar="JOBID[.STEP]",
            help="Find the rendezvous of this Slurm job (asks scontrol and squeue).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@dataclass(frozen=True)
class RendezvousTarget:
    """Which job's rendezvous a command reads or closes.

    Attributes:
        backend: ``c10d``, ``etcd``, ``etcd-v2`` or ``embedded-etcd``.
        endpoint: ``host[:port]`` (several, comma-separated, for etcd).
        run_id: the job id.
        conf: the backend configuration (``--rdzv-conf``).
        min_nodes: the job's minimum, or None when not known.
        max_nodes: the job's maximum, or None when not known.
    """

    backend: str
    endpoint: str
    run_id: str
    conf: RendezvousConf = RendezvousConf()
    min_nodes: int | None = None
    max_nodes: int | None = None

    def parameters(self, read_timeout_s: float | None = None) -> RendezvousParameters:
        """Return the RendezvousParameters to build a backend from (nnodes 1:1 when unknown).

        Args:
            read_timeout_s: the read timeout when ``--rdzv-conf`` names none (None: the
                rendezvous's default).

        Raises:
            ConfigurationError: the parameters are inconsistent.
        """
        conf = self.conf
        if read_timeout_s is not None:
            conf = conf.with_default("read_timeout", read_timeout_s)
        return RendezvousParameters.from_conf(
            self.backend,
            self.endpoint,
            self.run_id,
            self.min_nodes or 1,
            self.max_nodes or self.min_nodes or 1,
            None,
            conf,
        )


def explicit_options(ctx: click.Context, names: tuple[str, ...] = RDZV_OPTION_NAMES) -> set[str]:
    """Return which of ``names`` the user set, on the command line or through a PET_* variable.

    Args:
        ctx: the command's click context.
        names: the parameter names to check.

    Returns:
        The names whose value did not come from a default.
    """
    given = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    return {name for name in names if ctx.get_parameter_source(name) in given}


def resolve_target(
    values: Mapping[str, Any],
    explicit: set[str],
    environ: Mapping[str, str],
    *,
    slurm_job_lookup: Callable[[str], tuple[str, str]] | None = None,
) -> RendezvousTarget:
    """Combine the options, ``--slurm-job`` and the Slurm allocation into a target.

    Args:
        values: the option values by parameter name (see :func:`rdzv_options`).
        explicit: the names the user set (see :func:`explicit_options`).
        environ: the environment (for a Slurm allocation's defaults).
        slurm_job_lookup: ``JOBID -> (rdzv_id, endpoint)``; default
            :func:`elastic_run.cli.slurm.allocation.rdzv_from_slurm_job`.

    Returns:
        The target.

    Raises:
        ConfigurationError: no run id or no endpoint could be found, or a value is malformed
            (``--nnodes``, a known ``--rdzv-conf`` key, an empty run id).
    """
    from elastic_run.cli.slurm.allocation import rdzv_from_slurm_job, slurm_defaults

    chosen: dict[str, Any] = {name: values.get(name) for name in RDZV_OPTION_NAMES}
    user = {name for name in explicit if chosen.get(name) is not None}
    slurm_job = chosen.get("slurm_job")
    if slurm_job:
        lookup = slurm_job_lookup or rdzv_from_slurm_job
        run_id, endpoint = lookup(str(slurm_job))
        if "rdzv_id" not in user:
            chosen["rdzv_id"] = run_id
        if "rdzv_endpoint" not in user:
            chosen["rdzv_endpoint"] = endpoint
        user |= {"rdzv_id", "rdzv_endpoint"}
    else:
        given = {name: chosen[name] for name in user if name in chosen}
        for default in slurm_defaults(environ, given=given, elastic_min=None):
            if default.name in chosen:
                chosen[default.name] = default.value
    chosen_id = chosen.get("rdzv_id")
    if not chosen_id:
        raise ConfigurationError("which job? give --rdzv-id (or PET_RDZV_ID, or --slurm-job JOBID)")
    backend = str(chosen.get("rdzv_backend") or _STATUS_BACKEND)
    endpoint = str(chosen.get("rdzv_endpoint") or "")
    if not endpoint:
        raise ConfigurationError(
            f"where is the {backend} store? give --rdzv-endpoint host[:port] "
            "(or PET_RDZV_ENDPOINT, or --slurm-job JOBID)"
        )
    min_nodes: int | None = None
    max_nodes: int | None = None
    nnodes = chosen.get("nnodes")
    if nnodes:
        min_nodes, max_nodes = NNODES.parse(str(nnodes), "--nnodes")
    # The one parse, before any connection; the backend gets it (RendezvousTarget.parameters).
    conf = validate_rdzv_conf(parse_rdzv_conf(str(chosen.get("rdzv_conf") or "")), backend)
    return RendezvousTarget(
        backend=backend,
        endpoint=endpoint,
        run_id=safe_run_id(str(chosen_id)),
        conf=conf,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
    )
