"""The ``slurm_cluster`` pytest fixture: one real two-node Slurm per test module.

Import it into a test module (``from slurm_fixtures import slurm_cluster``) or list this
module in a conftest's ``pytest_plugins``. It skips with the reason when Slurm or munge is
not installed here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slurm_cluster import SlurmCluster, slurm_unavailable_reason

__all__ = ["slurm_cluster"]


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Yield a started two-node Slurm (nodes 127.0.0.1 and 127.0.0.2); stop it after.

    Yields:
        The running cluster; its ``env`` has SLURM_CONF for client commands.
    """
    reason = slurm_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
