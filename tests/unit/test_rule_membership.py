"""The membership rules (``agent/rules/membership.py``): lost liveness, a round that ended, nodes
waiting with room: each rejoins with its reason."""

from __future__ import annotations

from elastic_run.agent.rules import membership
from elastic_run.agent.rules.actions import Rejoin
from tests.unit.observations import RUNNING, flat


def test_lost_liveness_rejoins() -> None:
    assert membership.liveness_lost(flat(RUNNING, liveness_lost=True), 0) == Rejoin("liveness_lost")
    assert membership.liveness_lost(RUNNING, 0) is None


def test_a_round_that_ended_is_rejoined_with_its_cause() -> None:
    ended = flat(RUNNING, round_over=True)
    assert membership.round_ended(flat(ended, member_lost=True), 0) == Rejoin("member_lost")
    assert membership.round_ended(flat(ended, end_cause="nodes_waiting"), 0) == Rejoin(
        "nodes_waiting"
    )
    assert membership.round_ended(ended, 0) == Rejoin("round_ended")
    assert membership.round_ended(RUNNING, 0) is None


def test_nodes_waiting_with_room_rejoin() -> None:
    assert membership.nodes_waiting(flat(RUNNING, nodes_waiting=2), 0) == Rejoin("nodes_waiting")
    assert membership.nodes_waiting(RUNNING, 0) is None
