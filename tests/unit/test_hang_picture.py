"""The job's hang picture (pure): nodes' stuck summaries merged into one line."""

from __future__ import annotations

from typing import Any

from elastic_run.agent.progress.hang_picture import (
    StuckRank,
    merge,
    parse_stuck,
    stuck_record,
)


def _node(host: str, round_: int, *ranks: StuckRank) -> dict[str, Any]:
    return {"v": 1, "host": host, "round": round_, "stuck": stuck_record(round_, ranks)}


def _waiting(rank: int, stuck_s: float = 40.0) -> StuckRank:
    return StuckRank(rank, "all_reduce at train.py:12", "all_reduce", True, stuck_s)


def test_the_stuck_rank_is_named_and_the_waiting_ranks_counted() -> None:
    records = {
        "n0": _node("node-a", 3, _waiting(0), _waiting(1), _waiting(2), _waiting(3)),
        "n1": _node(
            "node-b",
            3,
            StuckRank(5, "__next__ at data.py:88", "__next__", False, 42.4, hung=True),
            _waiting(4),
            _waiting(6),
            _waiting(7),
        ),
    }
    picture = merge(records)
    assert picture is not None and picture.round == 3
    assert picture.sentence() == (
        "rank 5 (node-b) stuck 42 s in __next__ at data.py:88; 7 ranks wait in all_reduce"
    )
    body = picture.as_json()
    assert [r["rank"] for r in body["stuck"]] == [5] and len(body["waiting"]) == 7


def test_only_the_newest_round_counts_and_a_rank_seen_twice_counts_once() -> None:
    old = _node("node-a", 1, StuckRank(0, "f at a.py:1", "f", False, 9.0))
    new_a = _node("node-a", 2, _waiting(0, 10.0), _waiting(1, 10.0))
    new_b = _node("node-b", 2, _waiting(1, 12.0), StuckRank(2, "", "", None, 11.0))
    picture = merge({"x": old, "a": new_a, "b": new_b})
    assert picture is not None and picture.round == 2
    assert picture.sentence() == "2 ranks wait in all_reduce; 1 silent without stacks"
    assert merge({"x": old, "a": new_a}, round_=5) is None


def test_records_without_a_picture_or_of_another_version_are_left_out() -> None:
    assert merge({"a": {"host": "h", "ranks": []}}) is None
    assert parse_stuck({"stuck": {"v": 99, "round": 1, "ranks": []}}) is None
    assert parse_stuck({"stuck": {"v": 1, "round": "x"}}) is None
    parsed = parse_stuck({"host": "h", "stuck": {"v": 1, "round": 1, "ranks": [{"rank": "x"}]}})
    assert parsed == (1, ())
