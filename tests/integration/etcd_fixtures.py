"""Pytest fixtures starting real etcd servers, for any test module to import.

    from etcd_fixtures import etcd_cluster3_fixture, etcd_server_fixture  # noqa: F401

The fixtures are named ``etcd_server`` and ``etcd_cluster3``. ``etcd_server`` is one member
shared by a test module; ``etcd_cluster3`` is a fresh 3-member cluster per test. When a test
using them fails, the servers' logs are written to the terminal. Without an etcd binary (PATH or
ELASTIC_RUN_ETCD_BINARY) they fail the test in one ``missing: etcd`` line, as ``requires_etcd``
(a mark for tests that start an ``EtcdServer`` of their own) does.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from elastic_run.rendezvous.etcd.server import EtcdServer
from tests.helpers import wait_until
from tests.machine import require_etcd

__all__ = ["etcd_cluster3_fixture", "etcd_server_fixture", "requires_etcd", "wait_until"]

# The ``etcd_binary`` fixture (the root conftest) fails the test when etcd is missing.
requires_etcd = pytest.mark.usefixtures("etcd_binary")


def _dump_logs_if_failed(
    request: pytest.FixtureRequest, failed_before: int, server: EtcdServer
) -> None:
    if request.session.testsfailed > failed_before:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        text = server.read_logs(8000)
        if reporter is not None:
            reporter.write_line("")
            reporter.write_line(text)
        else:
            print(text)


@pytest.fixture(scope="module", name="etcd_server")
def etcd_server_fixture(request: pytest.FixtureRequest) -> Iterator[EtcdServer]:
    """A started single-member etcd, shared by the tests of one module."""
    require_etcd()
    failed_before = request.session.testsfailed
    server = EtcdServer(members=1)
    server.start(timeout_s=30)
    try:
        yield server
    finally:
        _dump_logs_if_failed(request, failed_before, server)
        server.stop()


@pytest.fixture(name="etcd_cluster3")
def etcd_cluster3_fixture(request: pytest.FixtureRequest) -> Iterator[EtcdServer]:
    """A fresh, started 3-member etcd cluster."""
    require_etcd()
    failed_before = request.session.testsfailed
    server = EtcdServer(members=3)
    server.start(timeout_s=60)
    try:
        yield server
    finally:
        _dump_logs_if_failed(request, failed_before, server)
        server.stop()
