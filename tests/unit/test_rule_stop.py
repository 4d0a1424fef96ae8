"""The stop rule (``agent/rules/stop.py``): a pending signal stops the run, in both phases."""

from __future__ import annotations

from elastic_run.agent.rules import stop
from elastic_run.agent.rules.actions import Stop
from tests.unit.observations import JOINING, RUNNING, flat


def test_a_pending_signal_stops_with_128_plus_n_in_either_phase() -> None:
    for base in (JOINING, RUNNING):
        action = stop.judge(flat(base, signal=15), 0)
        assert action == Stop(15) and action.exit_code == 143


def test_no_signal_no_stop() -> None:
    assert stop.judge(RUNNING, 0) is None
