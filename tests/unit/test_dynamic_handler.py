"""The dynamic handler's logic on the shipped in-memory backend, driven by a fake clock.

Every node is a ``DynamicRendezvousHandler`` in a thread of this process, on one
``InMemoryStore`` whose waits, like the handler's, are measured on a ``FakeClock``: a 30 s last
call, a 600 s join timeout and a look of 110 s before a failure counts take no real time. The
nodes open no socket (``death_notices=False``: heartbeats alone judge; our agent's change
callback is set, so no workers' store port is agreed on). Heartbeats are kept slow (10 s, 5
of them make a node gone) so that the liveness threads, which tick in real time, never matter:
where a test needs a member to beat, it beats for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from elastic_run.clock.fake import FakeClock
from elastic_run.rendezvous import (
    DynamicRendezvousHandler,
    InMemoryRendezvousBackend,
    InMemoryStore,
    RendezvousClosedError,
    RendezvousTimeoutError,
)
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import LostRecord, SealRecord, decode
from elastic_run.rendezvous.settings import RendezvousSettings
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(60)

RUN_ID = "job"
SETTINGS = RendezvousSettings(
    keep_alive_interval_s=10.0,
    keep_alive_max_attempt=5,
    last_call_timeout_s=30.0,
    join_timeout_s=600.0,
)


class Job:
    """Nodes of one job on one in-memory store, all on one fake clock."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = InMemoryStore(self.clock)
        self.reader = InMemoryRendezvousBackend(self.store, RUN_ID)
        self.handlers: list[DynamicRendezvousHandler] = []

    def node(self, min_nodes: int, max_nodes: int) -> DynamicRendezvousHandler:
        handler = DynamicRendezvousHandler(
            RUN_ID,
            InMemoryRendezvousBackend(self.store, RUN_ID),
            min_nodes,
            max_nodes,
            local_addr="127.0.0.1",
            settings=SETTINGS,
            clock=self.clock,
            death_notices=False,
        )
        handler.set_change_callback(lambda: None)  # our agent's path: no workers' store port
        self.handlers.append(handler)
        return handler

    def seal(self, r: int) -> SealRecord | None:
        raw = self.reader.get(keys.seal(r))
        return decode(SealRecord, keys.seal(r), raw) if raw is not None else None

    def lost(self, r: int) -> LostRecord | None:
        raw = self.reader.get(keys.lost(r))
        return decode(LostRecord, keys.lost(r), raw) if raw is not None else None

    def run_until(
        self, done: Callable[[], bool], waiters: int, step_s: float, limit_s: float
    ) -> float:
        """Advance the clock by ``step_s`` each time ``waiters`` timed waits have settled on
        the current time, until ``done``; return the fake seconds it took."""
        start = self.clock.now()
        while not done():
            wait_until(
                lambda: done() or self.clock.waiting() >= waiters,
                60,  # real seconds: 10 failed at a load average near 390
                message=lambda: f"{self.clock.waiting()} of {waiters} waits settled",
            )
            if done():
                break
            assert self.clock.now() - start < limit_s, "it never happened"
            self.clock.advance(step_s)
        return self.clock.now() - start

    def close(self) -> None:
        for handler in self.handlers:
            handler.shutdown()


class Call:
    """``fn`` on a thread, its result or its exception kept."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.result = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                self.error = exc
            finally:
                self.done.set()

        threading.Thread(target=run, daemon=True).start()

    def get(self) -> Any:
        assert self.done.wait(60), "the call did not return"  # real time: a loaded host
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture
def job() -> Any:
    the_job = Job()
    try:
        yield the_job
    finally:
        the_job.close()


def test_a_round_at_max_completes_without_the_clock_moving(job: Job) -> None:
    handlers = [job.node(2, 3) for _ in range(3)]
    start = job.clock.now()
    calls = [Call(h.next_rendezvous) for h in handlers]
    infos = [c.get() for c in calls]
    assert sorted(info.rank for info in infos) == [0, 1, 2]
    assert {info.world_size for info in infos} == {3}
    assert job.clock.now() == start
    seal = job.seal(0)
    assert seal is not None and seal.reason == "max"
    assert [h.round for h in handlers] == [0, 0, 0]


def test_a_round_at_min_seals_once_the_last_call_has_passed(job: Job) -> None:
    calls = [Call(job.node(2, 3).next_rendezvous) for _ in range(2)]
    wait_until(lambda: job.reader.get(keys.arrivals(0)) == b"2", 10, message="two arrivals")
    took_s = job.run_until(lambda: all(c.done.is_set() for c in calls), 2, 2.0, 90)
    infos = [c.get() for c in calls]
    assert sorted(info.rank for info in infos) == [0, 1]
    seal = job.seal(0)
    assert seal is not None and seal.reason == "last_call"
    # Never before the last call: 30 s after the coordinator saw the second arrival, which it
    # does at its next tick (at most one 10 s interval); then within a tick of it.
    assert 30.0 <= took_s <= 52.0


def test_a_round_below_min_times_out_at_the_join_deadline_with_the_facts(job: Job) -> None:
    call = Call(job.node(2, 3).next_rendezvous)
    took_s = job.run_until(call.done.is_set, 1, 10.0, 700)
    with pytest.raises(RendezvousTimeoutError, match=r"after 600 s with 1 of 2\.\.3 nodes"):
        call.get()
    assert 600.0 <= took_s <= 610.0
    assert job.seal(0) is None


def test_a_latecomer_waits_at_the_door_is_counted_and_sees_the_close(job: Job) -> None:
    # A round of two with room for three: the latecomer is counted as waiting (the members
    # re-form to admit it).
    members = [job.node(2, 3) for _ in range(2)]
    calls = [Call(h.next_rendezvous) for h in members]
    wait_until(lambda: job.reader.get(keys.arrivals(0)) == b"2", 10, message="two arrivals")
    job.run_until(lambda: all(c.done.is_set() for c in calls), 2, 2.0, 90)  # the last call
    for call in calls:
        call.get()
    late = Call(job.node(2, 3).next_rendezvous)
    wait_until(lambda: all(m.num_nodes_waiting() == 1 for m in members), 10, message="not counted")
    assert not late.done.is_set()
    members[0].set_closed()
    job.run_until(late.done.is_set, 1, 10.0, 60)
    with pytest.raises(RendezvousClosedError, match=RUN_ID):
        late.get()


def test_a_latecomer_at_a_full_round_waits_as_a_spare_and_sees_the_close(job: Job) -> None:
    # A round at MAX (2:2) has no room: the latecomer waits as a spare, not counted as waiting
    # (the members keep training), past the join timeout, until the job closes.
    members = [job.node(2, 2) for _ in range(2)]
    for call in [Call(h.next_rendezvous) for h in members]:
        call.get()
    late = Call(job.node(2, 2).next_rendezvous)
    wait_until(lambda: members[0].poll().spares == 1, 10, message="no spare seen")
    assert all(m.num_nodes_waiting() == 0 for m in members)
    job.clock.advance(SETTINGS.join_timeout_s + 1)  # the join timeout does not end a spare
    assert not late.done.is_set()
    members[0].set_closed()
    job.run_until(late.done.is_set, 1, 10.0, 60)
    with pytest.raises(RendezvousClosedError, match=RUN_ID):
        late.get()


def test_the_nodes_alive_count_the_round_before_and_the_door(job: Job) -> None:
    # Round 0: a, b, c (2:3). Round 1 forms with a and d alone (b and c still stop their
    # workers, as on a loaded host): a's count is d, and b and c, whose heartbeats stand. A node
    # that left cleanly (its key dropped) is not counted; a latecomer at the door is.
    a, b, c = (job.node(2, 3) for _ in range(3))
    for call in [Call(h.next_rendezvous) for h in (a, b, c)]:
        call.get()
    assert a.others_alive() == 2
    a.leave_round("node_excluded")
    d = job.node(2, 3)
    calls = [Call(a.next_rendezvous), Call(d.next_rendezvous)]
    wait_until(lambda: job.reader.get(keys.arrivals(1)) == b"2", 10, message="two arrivals")
    job.run_until(lambda: all(call.done.is_set() for call in calls), 2, 2.0, 90)  # last call
    assert [call.get().world_size for call in calls] == [2, 2]
    assert a.others_alive() == 3  # d, and b and c of round 0
    b.shutdown()
    assert a.others_alive() == 2
    late = job.node(2, 3)
    Call(late.next_rendezvous)
    wait_until(lambda: a.num_nodes_waiting() == 1, 10, message="the latecomer at the door")
    # It takes its arrival index before it writes its record under it: wait for the record.
    wait_until(lambda: job.reader.get(keys.node(1, 2)) is not None, 10, message="its record")
    assert a.others_alive() == 3


def _a_round_of_two(job: Job) -> tuple[DynamicRendezvousHandler, DynamicRendezvousHandler]:
    first, second = job.node(2, 2), job.node(2, 2)
    for call in [Call(first.next_rendezvous), Call(second.next_rendezvous)]:
        call.get()
    return first, second


def test_a_failure_behind_a_frozen_member_ends_the_round_for_it_and_does_not_count(
    job: Job,
) -> None:
    failing, frozen = _a_round_of_two(job)
    backend = frozen.backend
    assert isinstance(backend, InMemoryRendezvousBackend)
    backend.cut()  # its heartbeats stop, as a frozen host's do
    look = Call(lambda: failing.report_failure(last_restart=True))
    took_s = job.run_until(look.done.is_set, 1, 10.0, 200)
    assert look.get() is False  # not this node's failure: the round ended for the lost member
    lost = job.lost(0)
    assert lost is not None
    assert (lost.reason, lost.node_ids) == ("member_lost", (frozen.node_id,))
    assert job.reader.read_counter(keys.RESTARTS) == 0
    assert failing.poll().member_lost
    # Judged after the heartbeat budget (5 reads, 50 s), well within the look (110 s).
    assert 50.0 <= took_s <= 110.0


def test_a_failure_while_every_member_beats_counts_after_the_look(job: Job) -> None:
    failing, beating = _a_round_of_two(job)
    look = Call(lambda: failing.report_failure(last_restart=True))
    start = job.clock.now()
    while not look.done.is_set():
        wait_until(lambda: look.done.is_set() or job.clock.waiting() >= 1, 10, message="look")
        beating.backend.heartbeat(beating.node_id)  # it lives: its counter moves
        job.clock.advance(10.0)
    assert look.get() is True  # this node's own failure: it ended the round and counts
    assert job.clock.now() - start >= 110.0  # twice the budget plus an interval: the look
    lost = job.lost(0)
    assert lost is not None and lost.reason == "worker_failure"
    assert job.reader.read_counter(keys.RESTARTS) == 1


def test_a_round_that_ends_elsewhere_ends_the_look_at_once(job: Job) -> None:
    failing, other = _a_round_of_two(job)
    look = Call(lambda: failing.report_failure(last_restart=True))
    wait_until(lambda: job.clock.waiting() >= 1, 10, message="the look never waited")
    other.leave_round("member_lost")  # another node's verdict, as a watcher writes it
    failing.poll()
    job.clock.advance(10.0)  # the look's next read finds the end record
    assert look.get() is False
    lost = job.lost(0)
    assert lost is not None and lost.by == other.node_id
    assert job.reader.read_counter(keys.RESTARTS) == 0
