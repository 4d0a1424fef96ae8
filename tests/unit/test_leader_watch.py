"""The leader watch's rule (``etcd/leader_watch.py``) on a status reader the test scripts.

The etcd side (a real frozen leader, a real follower) is in
``tests/integration/test_etcd_leader_watch.py``; here each case of the rule: what the member
answers at each look, what the watch does with the call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyetcd
import pytest

from elastic_run.rendezvous.etcd.leader_watch import LeaderWatch, Released, raft_term_of


@pytest.fixture(name="new_watch")
def new_watch_fixture() -> Iterator[Callable[..., LeaderWatch]]:
    """Make watches (``LeaderWatch`` arguments); each is stopped after the test."""
    made: list[LeaderWatch] = []

    def make(**kwargs: Any) -> LeaderWatch:
        made.append(LeaderWatch(**kwargs))
        return made[-1]

    yield make
    for watch in made:
        watch.stop()


def _in_flight(
    watch: LeaderWatch, conn: Any, raw: str, what: str, term_before: int, until: threading.Event
) -> None:
    """Hold one call in flight on ``watch`` until ``until`` is set (30 s at most)."""
    token = watch.enter(conn, raw, what, term_before=term_before)
    try:
        assert until.wait(30)
    finally:
        watch.leave(token)


class _Conn:
    def __init__(self) -> None:
        self.released: list[tuple[Any, str, bool]] = []
        self.terms: list[int] = []
        self.done = threading.Event()

    def release(self, raw: Any, why: str, *, next_member: bool) -> None:
        self.released.append((raw, why, next_member))
        self.done.set()

    def note_term(self, term: int) -> None:
        self.terms.append(term)


def test_a_slow_call_under_a_steady_leader_is_left_alone(
    new_watch: Callable[..., LeaderWatch],
) -> None:
    # The member answers its status with the same leader and term: the call is slow, not
    # lost, and nothing is released while it waits (the watch looks several times).
    looks: list[Any] = []
    looked = threading.Event()

    def status(raw: Any) -> tuple[int, int]:
        looks.append(raw)
        if len(looks) >= 3:
            looked.set()
        return 7, 5

    conn = _Conn()
    _in_flight(new_watch(status=status), conn, "raw", "put 'k'", 5, looked)
    assert conn.released == []
    assert conn.terms[:3] == [5, 5, 5]  # each look tells the connection the term


@pytest.mark.parametrize(
    ("answers", "term_before", "why", "next_member"),
    [
        # No leader: this member may be the one cut off; the retry goes to the next.
        ([(0, 0)], 5, "has no leader", True),
        # A new leader: the same member forwards the retry to it.
        ([(7, 6)], 5, "raft term 5 -> 6", False),
        # The term moved between two looks (the connection had seen no term before).
        ([(7, 5), (7, 5), (9, 6)], 0, "raft term 5 -> 6", False),
    ],
)
def test_a_call_the_leader_changed_under_is_released(
    answers: list[tuple[int, int]],
    term_before: int,
    why: str,
    next_member: bool,
    new_watch: Callable[..., LeaderWatch],
) -> None:
    remaining = list(answers)

    def status(raw: Any) -> tuple[int, int]:
        return remaining.pop(0) if len(remaining) > 1 else remaining[0]

    released: list[Released] = []
    conn = _Conn()
    watch = new_watch(status=status, on_release=released.append)
    _in_flight(watch, conn, "raw", "put 'k'", term_before, conn.done)
    assert len(conn.released) == 1
    raw, said, to_next = conn.released[0]
    assert raw == "raw" and why in said and to_next is next_member
    assert [r.what for r in released] == ["put 'k'"]


def test_one_leader_change_releases_the_calls_it_caught_once(
    new_watch: Callable[..., LeaderWatch],
) -> None:
    # The connection last saw term 5; the member is at 6 (an election it had not heard of).
    # The first slow call is released, and its look tells the connection of term 6: the next
    # slow call, entered with that term, is left alone (it is slow, not caught by a change).
    looked = threading.Event()
    looks: list[Any] = []

    def status(raw: Any) -> tuple[int, int]:
        looks.append(raw)
        if looks.count("second") >= 3:
            looked.set()
        return 7, 6

    watch = new_watch(status=status)
    conn = _Conn()
    _in_flight(watch, conn, "first", "put 'a'", 5, conn.done)
    assert [r[0] for r in conn.released] == ["first"]
    _in_flight(watch, conn, "second", "put 'b'", max(conn.terms), looked)
    assert [r[0] for r in conn.released] == ["first"]


def test_the_raft_term_of_a_response() -> None:
    rpc = pyetcd.etcdrpc
    header = rpc.ResponseHeader(raft_term=4)
    assert raft_term_of(rpc.RangeResponse(header=header)) == 4
    assert raft_term_of((True, [rpc.PutResponse(header=header)])) == 0  # nested: not read
    assert raft_term_of([rpc.LeaseKeepAliveResponse(header=header)]) == 4
    assert raft_term_of(None) == 0
    assert raft_term_of(b"value") == 0
