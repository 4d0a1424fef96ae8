"""The no-cascade rules of liveness (``rendezvous/protocol/decisions.py``), pure: no store, no
clock, no thread.

A node is judged gone only when its counter stood still for the budget of the reader's time
*and* over ``min_reads`` of the reader's reads; a death notice judges at once. The defaults
(settings.py) drop a hung host within 10 s and never judge a node whose beats come late.
"""

from __future__ import annotations

from elastic_run.rendezvous.protocol import decisions as proto
from elastic_run.rendezvous.protocol.records import NodeRecord
from elastic_run.rendezvous.settings import RendezvousSettings

DEFAULTS = RendezvousSettings()
STALE = DEFAULTS.stale_after_s
INTERVAL = DEFAULTS.keep_alive_interval_s


def _view() -> proto.Heartbeats:
    return proto.Heartbeats(min_reads=DEFAULTS.keep_alive_max_attempt)


def _record(node_id: str) -> NodeRecord:
    return NodeRecord(node_id=node_id, addr="127.0.0.1", host="h", pid=1, local_world_size=1)


def test_the_default_budget_is_five_beats_of_one_second() -> None:
    assert (INTERVAL, DEFAULTS.keep_alive_max_attempt, STALE) == (1.0, 5, 5.0)


def test_a_hung_node_read_every_interval_is_gone_within_ten_seconds() -> None:
    beats = _view().observe({"a": 7}, now=0.0)
    gone_at = None
    t = 0.0
    while gone_at is None and t < 20:
        t += INTERVAL
        beats = beats.observe({"a": 7}, now=t)
        if beats.is_gone("a", t, STALE):
            gone_at = t
    assert gone_at is not None and STALE <= gone_at < 10.0


def test_a_reader_that_stalled_does_not_convict_the_node_it_reads() -> None:
    # The reader read at 0 s, then its process was starved (or paused) for 30 s.
    beats = _view().observe({"a": 7}, now=0.0).observe({"a": 7}, now=30.0)
    assert not beats.is_gone("a", 30.0, STALE)
    # It reads again, one interval apart: the node beat meanwhile, so it lives.
    beats = beats.observe({"a": 8}, now=31.0)
    assert not beats.is_gone("a", 31.0, STALE)


def test_a_stalled_reader_judges_a_really_dead_node_after_its_reads() -> None:
    beats = _view().observe({"a": 7}, now=0.0)
    for k in range(1, DEFAULTS.keep_alive_max_attempt):
        beats = beats.observe({"a": 7}, now=30.0 + k)
        assert not beats.is_gone("a", 30.0 + k, STALE)
    last = 30.0 + DEFAULTS.keep_alive_max_attempt
    beats = beats.observe({"a": 7}, now=last)
    assert beats.is_gone("a", last, STALE)


def test_beats_that_come_late_but_come_keep_a_node() -> None:
    # A loaded host: its beats come every 4 s instead of every second; read every second.
    beats = _view().observe({"a": 0}, now=0.0)
    for second in range(1, 60):
        beats = beats.observe({"a": second // 4}, now=float(second))
        assert not beats.is_gone("a", float(second), STALE), second


def test_a_death_notice_needs_no_reads() -> None:
    beats = _view().observe({"a": 7}, now=0.0).with_closed(["a"], now=0.1)
    assert beats.is_gone("a", 0.1, STALE)


def test_a_vanished_counter_needs_no_reads() -> None:
    beats = _view().observe({"a": 7}, now=0.0).observe({"a": None}, now=0.5)
    assert beats.is_gone("a", 0.5, STALE)


def test_the_view_keeps_its_reads_rule_through_its_operations() -> None:
    beats = _view().observe({"a": 1, "b": 1}, now=0.0).with_closed(["b"], 0.0).forget(["b"])
    assert beats.min_reads == DEFAULTS.keep_alive_max_attempt


def test_a_member_keeps_a_slow_successor_and_drops_a_hung_one() -> None:
    slow = _view().observe({"b": 1}, now=0.0).observe({"b": 1}, now=4.9)
    assert proto.judge_ring(0, 0, "b", slow, 4.9, STALE, closed=False) == proto.Keep()
    hung = _view().observe({"b": 1}, now=0.0)
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):
        hung = hung.observe({"b": 1}, now=t)
    assert proto.judge_ring(0, 0, "b", hung, 5.0, STALE, closed=False) == proto.MemberLost(("b",))


def test_a_slow_arrival_costs_only_its_own_admission() -> None:
    # Three arrivals, min 2, max 3: n1's beats stopped during formation. The coordinator
    # seals the two live ones at last call; n1 is left out, nobody else is.
    settings = proto.RoundSettings(
        min_nodes=2, max_nodes=3, last_call_timeout_s=1.0, stale_after_s=STALE
    )
    records = {i: _record(f"n{i}") for i in range(3)}
    beats = _view().observe({"n0": 1, "n1": 1, "n2": 1}, now=0.0)
    for t in range(1, 7):
        beats = beats.observe({"n0": 1 + t, "n1": 1, "n2": 1 + t}, now=float(t))
    live = proto.live_arrivals(records, 3, beats, 6.0, STALE)
    assert live == (0, 2)
    action = proto.decide_barrier(
        proto.BarrierReading(live=live, last_arrival_at=0.0), settings, 6.0
    )
    assert action == proto.Seal((0, 2), "last_call")


def test_a_round_waits_for_a_slow_arrival_below_the_budget() -> None:
    # Slow but not past the budget: still live, so a full round seals with it at max.
    settings = proto.RoundSettings(
        min_nodes=2, max_nodes=3, last_call_timeout_s=30.0, stale_after_s=STALE
    )
    records = {i: _record(f"n{i}") for i in range(3)}
    beats = _view().observe({"n0": 1, "n1": 1, "n2": 1}, now=0.0)
    beats = beats.observe({"n0": 2, "n1": 1, "n2": 2}, now=4.0)
    live = proto.live_arrivals(records, 3, beats, 4.0, STALE)
    action = proto.decide_barrier(
        proto.BarrierReading(live=live, last_arrival_at=0.0), settings, 4.0
    )
    assert action == proto.Seal((0, 1, 2), "max")
