"""The turns of one store connection between a blocking wait and the liveness turns
(``c10d/shared_link.py``): real threads, the wait's attempts recorded instead of store calls."""

from __future__ import annotations

import threading
import time

from elastic_run.rendezvous.c10d.shared_link import SharedLink


class Attempts:
    """A wait's slices as they begin: their lengths and when; True once ``ready`` is set."""

    def __init__(self, ready: threading.Event | None = None) -> None:
        self.pieces: list[float] = []
        self.begun: list[float] = []
        self.called = threading.Event()
        self._ready = ready

    def __call__(self, piece_s: float) -> bool:
        self.pieces.append(piece_s)
        self.begun.append(time.monotonic())
        self.called.set()
        return self._ready is None or self._ready.is_set()


def test_a_wait_with_no_turn_announced_takes_slices_of_at_most_the_cap() -> None:
    link = SharedLink(cap_s=0.5)
    attempts = Attempts()
    assert link.wait(attempts, 10.0)
    assert len(attempts.pieces) == 1 and attempts.pieces[0] == 0.5
    short = Attempts()
    assert link.wait(short, 0.2)  # the caller's timeout is shorter than the cap
    assert 0 < short.pieces[0] <= 0.2


def test_a_slice_ends_when_the_next_turn_is_due() -> None:
    link = SharedLink(cap_s=30.0)
    link.expect_turn(time.monotonic() + 0.2)
    attempts = Attempts()
    assert link.wait(attempts, 10.0)
    assert 0 < attempts.pieces[0] <= 0.2


def test_a_turn_that_was_due_long_ago_and_never_came_is_not_waited_for() -> None:
    link = SharedLink(cap_s=0.4)
    link.expect_turn(time.monotonic() - 5.0)  # another link carried it
    attempts = Attempts()
    assert link.wait(attempts, 10.0)
    assert attempts.pieces == [0.4]
    again = Attempts()
    assert link.wait(again, 10.0)
    assert again.pieces == [0.4]  # the stale due time is gone


def test_a_wait_that_never_gets_its_keys_returns_false_at_its_timeout() -> None:
    link = SharedLink(cap_s=0.05)
    never = Attempts(ready=threading.Event())
    started = time.monotonic()
    assert not link.wait(never, 0.2)
    assert time.monotonic() - started >= 0.2
    assert len(never.pieces) >= 2 and all(0 < p <= 0.05 for p in never.pieces)


def test_no_slice_begins_while_a_turn_holds_the_link() -> None:
    link = SharedLink(cap_s=30.0)
    entered, release = threading.Event(), threading.Event()

    def turn() -> None:
        with link.hold():
            entered.set()
            release.wait(30)

    holder = threading.Thread(target=turn)
    holder.start()
    assert entered.wait(10)
    attempts = Attempts()
    out: list[bool] = []
    waiter = threading.Thread(target=lambda: out.append(link.wait(attempts, 60.0)))
    waiter.start()
    try:
        assert not attempts.called.wait(0.3), "a slice began while the link was held"
        assert link.waiting_until() is None
    finally:
        released_at = time.monotonic()
        release.set()
        holder.join(10)
    waiter.join(10)
    assert out == [True] and attempts.begun[0] >= released_at


def test_a_hold_is_reentrant_and_clears_the_due_turn() -> None:
    link = SharedLink(cap_s=0.3)
    link.expect_turn(time.monotonic() + 0.01)
    with link.hold(), link.hold():
        pass
    attempts = Attempts()
    assert link.wait(attempts, 10.0)
    assert attempts.pieces == [0.3]  # the turn came (it held the link): no cut for it


def test_a_turn_stalled_inside_its_hold_stops_the_waits_for_at_most_the_cap() -> None:
    link = SharedLink(cap_s=0.2)
    stuck = link.hold()
    stuck.__enter__()  # a liveness thread stopped half-way through its turn
    try:
        held_at = time.monotonic()
        attempts = Attempts()
        assert link.wait(attempts, 10.0)
        assert attempts.begun[0] - held_at >= 0.2
    finally:
        stuck.__exit__(None, None, None)


def test_waiting_until_says_when_the_slice_in_progress_ends() -> None:
    link = SharedLink(cap_s=5.0)
    seen: list[float | None] = []

    def attempt(piece_s: float) -> bool:
        seen.append(link.waiting_until())
        return True

    before = time.monotonic()
    assert link.wait(attempt, 10.0)
    end = seen[0]
    assert end is not None and before + 5.0 <= end <= time.monotonic() + 5.0
    assert link.waiting_until() is None  # no wait holds it now
