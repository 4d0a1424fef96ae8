"""A backend outage is said once: the first unreachable call warns, later ones go to debug,
a call that works again ends the outage; other failures are always said."""

from __future__ import annotations

import logging

import pytest

from elastic_run.rendezvous.errors import (
    RendezvousConnectionError,
    RendezvousStateError,
    RendezvousUnreachableError,
)
from elastic_run.rendezvous.outage import Outage

LOG = logging.getLogger("tests.outage")


def _said(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOG.name]


def test_an_outage_is_said_once_until_a_call_works(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    outage = Outage()
    outage.warn(LOG, "heartbeat failed", RendezvousConnectionError("store gone"))
    outage.warn(LOG, "read failed", RendezvousUnreachableError("no answer"), "trying again")
    assert _said(caplog) == [
        (logging.WARNING, "heartbeat failed: store gone"),
        (logging.DEBUG, "read failed: no answer; trying again"),
    ]
    caplog.clear()
    assert outage.over() is True and outage.over() is False
    outage.warn(LOG, "read failed", RendezvousConnectionError("gone again"))
    assert _said(caplog) == [(logging.WARNING, "read failed: gone again")]


def test_other_failures_are_said_every_time(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    outage = Outage()
    outage.warn(LOG, "heartbeat failed", RendezvousConnectionError("store gone"))
    for _ in range(2):
        outage.warn(LOG, "publish failed", RendezvousStateError("not JSON"))
    levels = [level for level, _ in _said(caplog)]
    assert levels == [logging.WARNING] * 3
