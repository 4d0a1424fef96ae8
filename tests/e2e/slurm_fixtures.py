"""The ``slurm_cluster`` pytest fixture: one real two-node Slurm per test module.

Import it into a test module (``from slurm_fixtures import slurm_cluster``) or list this
module in a conftest's ``pytest_plugins``. ``require_slurm`` fails the test in one line when
Slurm or munge is not installed here (``scripts/setup.sh`` installs them); only off Linux, which
no set-up can change, does it skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slurm_cluster import REQUIRED_PROGRAMS, SlurmCluster, slurm_unavailable_reason

from tests.machine import require_linux, require_program

__all__ = ["require_slurm", "slurm_cluster"]


def require_slurm() -> None:
    """Fail the test in one line unless a test Slurm can run here; skip it off Linux.

    Raises:
        pytest.fail.Exception: a Slurm or munge program is missing (``missing: the program
            slurmd ...``), or the loopback addresses of the test nodes cannot be bound.
    """
    require_linux("a test Slurm")
    for name, package in REQUIRED_PROGRAMS.items():
        require_program(name, package)
    reason = slurm_unavailable_reason()
    if reason is not None:
        pytest.fail(reason, pytrace=False)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Yield a started two-node Slurm (nodes 127.0.0.1 and 127.0.0.2); stop it after.

    Yields:
        The running cluster; its ``env`` has SLURM_CONF for client commands.
    """
    require_slurm()
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
