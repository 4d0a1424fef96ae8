"""The node verdict (``agent/rules/nodes/excluded.py``) and the fault history it reads
(``agent/rules/nodes/history.py``): a node is excluded when K of its counted failures, with
different ranks, follow the node; never for one failure, for failures that followed their
rank, or for a forged record."""

from __future__ import annotations

from dataclasses import replace

import pytest

from elastic_run.agent.rules.actions import Exclude
from elastic_run.agent.rules.nodes import excluded
from elastic_run.agent.rules.nodes.history import (
    KEPT,
    Fault,
    FaultHistory,
    follows_rank,
    from_json,
)
from elastic_run.agent.rules.observation import NodeView, Observation, WorkersStatus
from tests.unit.observations import RUNNING, flat


def _fault(round_: int, rank: int, how: str = "SIGSEGV", step: int = -1) -> Fault:
    return Fault(
        round=round_, rank=rank, group_rank=rank, cause="worker_failed", how=how, step=step
    )


def _obs(own: FaultHistory, *others: FaultHistory, counted: bool = True) -> Observation:
    nodes = NodeView(own=own, others=others, max_failures=2)
    return replace(
        flat(RUNNING, workers=WorkersStatus.FAILED, failure_counted=counted), nodes=nodes
    )


H3 = FaultHistory("h3-1-aa", "h3")


def test_two_failures_with_different_ranks_exclude_the_node() -> None:
    own = H3.charged(_fault(0, 5, step=12)).charged(_fault(1, 2, step=0))
    action = excluded.judge(_obs(own), 0)
    assert isinstance(action, Exclude) and action.exit_code == 6
    assert action.reason == (
        "root cause of 2 failed rounds with different ranks "
        "(rank 5 SIGSEGV at step 12; rank 2 SIGSEGV at step 0)"
    )


def test_a_single_failure_or_one_rank_twice_excludes_nobody() -> None:
    assert excluded.judge(_obs(H3.charged(_fault(0, 5))), 0) is None
    same_rank = H3.charged(_fault(0, 5)).charged(_fault(1, 5))
    assert excluded.judge(_obs(same_rank), 0) is None  # no other ranks seen: cannot tell


def test_a_failure_that_followed_its_rank_is_the_scripts() -> None:
    other = FaultHistory("h1-1-bb", "h1").charged(_fault(0, 0))
    own = H3.charged(_fault(1, 0)).charged(_fault(2, 4))
    assert follows_rank(own.faults[0], [other]) is other
    assert follows_rank(own.faults[1], [other]) is None
    assert excluded.judge(_obs(own, other), 0) is None  # one of its two failures is rank 0's


def test_only_a_counted_failure_of_a_failed_group_is_judged() -> None:
    own = H3.charged(_fault(0, 5)).charged(_fault(1, 2))
    assert excluded.judge(_obs(own, counted=False), 0) is None
    running = replace(_obs(own), group=replace(RUNNING.group, status=WorkersStatus.RUNNING))
    assert excluded.judge(running, 0) is None
    assert excluded.judge(RUNNING, 0) is None  # no history kept


def test_a_history_reads_back_and_stays_bounded() -> None:
    history = H3
    for r in range(KEPT + 5):
        history = history.charged(_fault(r, r % 3))
    assert len(history.faults) == KEPT
    body = history.excluded_for("bad").to_json(2)
    assert body["state"] == "excluded: bad"
    assert from_json(H3.node_id, body) == history.excluded_for("bad")


@pytest.mark.parametrize(
    "body",
    [
        "garbage",
        {"v": 2, "node": "h3-1-aa", "faults": []},
        {"v": 1, "node": "h9-9-zz", "faults": []},  # another node's id under this key
        {"v": 1, "node": "h3-1-aa", "faults": [{}] * (KEPT + 1)},  # a huge count
        {
            "v": 1,
            "node": "h3-1-aa",
            "faults": [
                {"round": 1, "rank": 10**30, "group_rank": 0, "cause": "worker_failed", "how": "x"}
            ],
        },
        {
            "v": 1,
            "node": "h3-1-aa",
            "faults": [{"round": 1, "rank": 1, "group_rank": 0, "cause": "bribe", "how": "x"}],
        },
        {
            "v": 1,
            "node": "h3-1-aa",
            "faults": [{"round": True, "rank": 1, "group_rank": 0, "cause": "hung", "how": "x"}],
        },
        {"v": 1, "node": "h3-1-aa", "faults": [], "excluded": "x" * 10_000},
    ],
)
def test_a_forged_or_garbage_record_is_refused(body: object) -> None:
    with pytest.raises(ValueError):
        from_json("h3-1-aa", body)
