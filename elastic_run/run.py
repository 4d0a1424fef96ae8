"""torch.distributed.run's public helpers, under torch's names, for code that imports them.

``torch.distributed.run`` -> ``elastic_run.run`` is the switch for a program that calls
torchrun's module: :func:`parse_min_max_nnodes` (``--nnodes``), :func:`determine_local_world_size`
(``--nproc-per-node``) and :func:`main` (the launcher, in this process). Each reads its value as
the ``elastic-run`` command reads the flag, by the CLI's own parsers, so a value the command
refuses is refused here with the same sentence; where torch's helper raises, ours raises an
instance of the same type. torch's argparse layer (``get_args_parser``, ``parse_args``,
``config_from_args``, ``run``) is not kept: the command's options are click's, from one
settings table (docs/python-api.md lists the differences).

May import the CLI (lazily, for :func:`main`) and the settings parsers; nothing imports it.
"""

from __future__ import annotations

from collections.abc import Sequence

from elastic_run.agent.settings.values import (
    count_cuda_devices,
    count_usable_cpus,
    count_xpu_devices,
    parse_nproc,
    shown,
)
from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.settings import parse_nnodes

__all__ = [
    "NnodesFormatError",
    "determine_local_world_size",
    "main",
    "parse_min_max_nnodes",
]


class NnodesFormatError(ConfigurationError, RuntimeError):
    """``--nnodes`` with more than one ``:`` (torch's helper raises ``RuntimeError`` there)."""


def parse_min_max_nnodes(nnodes: str) -> tuple[int, int]:
    """``N`` or ``MIN:MAX`` as ``(min_nodes, max_nodes)`` (torch's ``parse_min_max_nnodes``).

    Args:
        nnodes: the ``--nnodes`` value (``"2"``, ``"2:20"``).

    Returns:
        ``(min, max)``; ``(N, N)`` for one number.

    Raises:
        NnodesFormatError: more than two parts (``"2:20:30"``; a ``RuntimeError``, as torch's).
        ConfigurationError: a part is not a whole number, or the counts are not
            ``1 <= min <= max`` (a ``ValueError``; torch's accepts ``0`` and ``3:2``).
    """
    if nnodes.count(":") > 1:
        raise NnodesFormatError(f"--nnodes {shown(nnodes)} is not N or MIN:MAX")
    return parse_nnodes(nnodes)


def determine_local_world_size(nproc_per_node: str) -> int:
    """The workers per node that ``--nproc-per-node`` asks (torch's ``determine_local_world_size``).

    ``N``; ``cpu``: the CPUs this process may run on; ``gpu``: the CUDA devices; ``xpu``: the
    Intel XPU devices; ``auto``: the CUDA devices, else the XPU devices, else the CPUs.

    Args:
        nproc_per_node: the value.

    Returns:
        The number of workers.

    Raises:
        ConfigurationError: another form, ``gpu``/``xpu`` with no such device, or a number
            below 1 (a ``ValueError``, as torch's, which returns numbers below 1 as given).
    """
    return parse_nproc(
        nproc_per_node,
        cpu_count=count_usable_cpus(),
        cuda_device_count=count_cuda_devices,
        xpu_device_count=count_xpu_devices,
    )


def main(args: Sequence[str] | None = None) -> None:
    """Run ``elastic-run`` with ``args`` (``sys.argv[1:]`` when None) in this process.

    Returns when the job succeeded, as torch's ``main`` does.

    Raises:
        SystemExit: with the command's exit code when it did not succeed (a bad flag: 2, after
            its one ``Error:`` line; a failed job: the code the CLI reference lists), where
            torch's raises ``ChildFailedError`` or argparse's ``SystemExit``.
    """
    from elastic_run.cli.main import main as run_command

    try:
        run_command(None if args is None else list(args), in_process=True)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
