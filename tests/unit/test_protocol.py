"""The pure rendezvous decisions (``rendezvous/protocol/decisions.py``), on a fake clock (floats).

The first tests pin each row of the barrier table, the liveness rules and the rank
arithmetic. The last one is a hypothesis state machine: a model store (a dict per round,
compare-set seals) and nodes that act only through the protocol's functions, under random
interleavings of joins, deaths, clock ticks, coordinator steps, re-forms and closes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from elastic_run.rendezvous.errors import RendezvousStateError
from elastic_run.rendezvous.protocol import decisions as proto
from elastic_run.rendezvous.protocol.records import (
    HEARTBEAT_GONE,
    NodeRecord,
    SealRecord,
    decode,
    decode_heartbeat,
    encode,
    is_counter,
    ranges,
    read_heartbeat,
    runs,
)

SETTINGS = proto.RoundSettings(
    min_nodes=2, max_nodes=4, last_call_timeout_s=30.0, stale_after_s=3.0
)


def _reading(
    live: tuple[int, ...], last_arrival_at: float = 0.0, **kw: object
) -> proto.BarrierReading:
    return proto.BarrierReading(live=live, last_arrival_at=last_arrival_at, **kw)  # type: ignore[arg-type]


def _record(i: int, lws: int = 1, role: str = "default") -> NodeRecord:
    return NodeRecord(f"n{i}", f"10.0.0.{i}", f"host{i}", 100 + i, lws, role)


def _seal(admitted: list[int], workers: list[tuple[int, str]] | None = None) -> SealRecord:
    items = workers or [(1, "default")] * len(admitted)
    return SealRecord(0, max(admitted) + 1, ranges(admitted), len(admitted), "max", runs(items))


# -- the barrier table ----------------------------------------------------------------


def test_barrier_seals_the_first_max_live_at_once() -> None:
    action = proto.decide_barrier(_reading((0, 2, 3, 5, 7)), SETTINGS, now=0.0)
    assert action == proto.Seal((0, 2, 3, 5), "max")


def test_barrier_below_min_waits_without_deadline() -> None:
    assert proto.decide_barrier(_reading((0,)), SETTINGS, now=1e9) == proto.Wait(until=None)


def test_barrier_at_min_waits_for_last_call_then_seals() -> None:
    reading = _reading((0, 1), last_arrival_at=10.0)
    assert proto.decide_barrier(reading, SETTINGS, now=10.0) == proto.Wait(until=40.0)
    assert proto.decide_barrier(reading, SETTINGS, now=39.999) == proto.Wait(until=40.0)
    assert proto.decide_barrier(reading, SETTINGS, now=40.0) == proto.Seal((0, 1), "last_call")


def test_a_newcomer_restarts_the_last_call() -> None:
    early = proto.decide_barrier(_reading((0, 1), last_arrival_at=0.0), SETTINGS, now=29.0)
    assert early == proto.Wait(until=30.0)
    later = proto.decide_barrier(_reading((0, 1, 2), last_arrival_at=29.0), SETTINGS, now=30.0)
    assert later == proto.Wait(until=59.0)


def test_reform_seals_at_once_when_every_expected_node_is_back() -> None:
    back = _reading((0, 1), is_reform=True, expected_pending=0)
    assert proto.decide_barrier(back, SETTINGS, now=0.0) == proto.Seal((0, 1), "reform")
    missing = _reading((0, 1), is_reform=True, expected_pending=1)
    assert proto.decide_barrier(missing, SETTINGS, now=0.0) == proto.Wait(until=30.0)


def test_reform_never_seals_below_min() -> None:
    reading = _reading((0,), is_reform=True, expected_pending=0)
    assert proto.decide_barrier(reading, SETTINGS, now=100.0) == proto.Wait()


# -- liveness -------------------------------------------------------------------------


def test_a_moving_heartbeat_is_alive_and_a_stopped_one_goes_stale() -> None:
    beats = proto.Heartbeats().observe({"a": 1}, now=0.0)
    beats = beats.observe({"a": 2}, now=2.0)
    assert not beats.is_gone("a", now=4.9, stale_after_s=3.0)
    beats = beats.observe({"a": 2}, now=4.9)  # read again, unchanged: the clock keeps running
    assert beats.is_gone("a", now=5.0, stale_after_s=3.0)
    beats = beats.observe({"a": 3}, now=6.0)  # it moved again: alive
    assert not beats.is_gone("a", now=6.0, stale_after_s=3.0)


def test_a_heartbeat_counter_is_gone_when_absent_or_overwritten_by_a_node_that_left() -> None:
    assert decode_heartbeat(b"7", "hb/n0") == 7
    assert decode_heartbeat(None, "hb/n0") is None
    assert decode_heartbeat(str(HEARTBEAT_GONE).encode(), "hb/n0") is None
    # A heartbeat still in flight when its node left lands on the mark and stays below zero.
    assert decode_heartbeat(str(HEARTBEAT_GONE + 1).encode(), "hb/n0") is None
    with pytest.raises(RendezvousStateError, match="'hb/n0'"):
        decode_heartbeat(b"", "hb/n0")


def test_a_garbage_heartbeat_reads_as_a_counter_judged_like_any_other() -> None:
    assert read_heartbeat(b"7") == (7, False)
    assert read_heartbeat(None) == (None, False)
    assert read_heartbeat(str(HEARTBEAT_GONE).encode()) == (None, False)
    garbage, is_garbage = read_heartbeat(b"\x00garbage")
    assert is_garbage and garbage is not None and garbage > 2**62
    # The node's next beat overwrites the garbage: its counter moved, it is alive.
    beats = proto.Heartbeats().observe({"a": 5}, now=0.0)
    beats = beats.observe({"a": garbage}, now=2.0)
    beats = beats.observe({"a": read_heartbeat(b"6")[0]}, now=4.0)
    assert not beats.is_gone("a", now=5.0, stale_after_s=3.0)
    # Garbage that stays put is a counter that stopped: stale after the budget, as any other.
    beats = beats.observe({"a": garbage}, now=5.0)
    assert not beats.is_gone("a", now=7.0, stale_after_s=3.0)
    assert beats.is_gone("a", now=8.0, stale_after_s=3.0)


def test_a_node_never_read_is_not_judged_and_a_vanished_one_is_gone() -> None:
    beats = proto.Heartbeats()
    assert not beats.is_gone("x", now=1e9, stale_after_s=1.0)
    beats = beats.observe({"x": 5}, now=0.0).observe({"x": None}, now=0.1)
    assert beats.is_gone("x", now=0.1, stale_after_s=100.0)


def test_a_key_never_written_goes_stale_from_the_first_reading() -> None:
    beats = proto.Heartbeats().observe({"y": None}, now=1.0)
    assert not beats.is_gone("y", now=3.9, stale_after_s=3.0)
    assert beats.is_gone("y", now=4.0, stale_after_s=3.0)


def test_forget_drops_the_view() -> None:
    beats = proto.Heartbeats().observe({"a": 1, "b": 1}, now=0.0).forget(["a"])
    assert not beats.is_gone("a", now=100.0, stale_after_s=1.0)
    assert beats.is_gone("b", now=100.0, stale_after_s=1.0)


def test_a_death_notice_is_gone_at_once_and_for_good() -> None:
    beats = proto.Heartbeats().observe({"a": 1, "b": 1}, now=0.0)
    beats = beats.with_closed(["a", "c"], now=0.5)
    assert beats.is_gone("a", now=0.5, stale_after_s=3.0)
    assert beats.is_gone("c", now=0.5, stale_after_s=3.0)  # never read before: still judged
    assert not beats.is_gone("b", now=0.5, stale_after_s=3.0)
    # A counter that still moves does not bring a node back whose agent was seen to end.
    beats = beats.observe({"a": 2, "b": 2}, now=1.0).with_closed([], now=1.0)
    assert beats.is_gone("a", now=1.0, stale_after_s=3.0)
    assert not beats.is_gone("b", now=3.9, stale_after_s=3.0)


def test_observe_returns_a_new_view() -> None:
    empty = proto.Heartbeats()
    empty.observe({"a": 1}, now=0.0)
    assert dict(empty.beats) == {}


def test_live_arrivals_skip_missing_records_and_stale_nodes() -> None:
    records = {0: _record(0), 1: _record(1), 3: _record(3)}
    beats = proto.Heartbeats().observe({"n0": 1, "n1": 1, "n3": 1}, now=0.0)
    beats = beats.observe({"n0": 2, "n3": 2}, now=5.0)
    live = proto.live_arrivals(records, 4, beats, now=5.0, stale_after_s=3.0)
    assert live == (0, 3)  # 1 is stale, 2 wrote no record
    assert proto.live_arrivals(records, 1, beats, now=5.0, stale_after_s=3.0) == (0,)


def test_expected_pending_counts_the_absent_living() -> None:
    beats = proto.Heartbeats().observe({"a": 1, "b": 1, "c": None}, now=0.0)
    beats = beats.observe({"a": 2}, now=10.0)
    # a arrived; b is stale at 10; c never beat and is stale too; d was never read.
    assert proto.expected_pending(["a", "b", "c", "d"], ["a"], beats, 10.0, 3.0) == 1
    assert proto.expected_pending(["a", "b"], ["a"], beats, 1.0, 3.0) == 1
    assert proto.expected_pending(["a", "b"], ["a", "b"], beats, 1.0, 3.0) == 0


def test_first_live_predecessor_walks_down_past_the_dead() -> None:
    records = {0: _record(0), 1: _record(1), 2: _record(2)}
    beats = proto.Heartbeats().observe({"n0": 1, "n1": 1, "n2": 1}, now=0.0)
    assert proto.first_live_predecessor(3, records, beats, 1.0, 3.0) == 2
    beats = beats.observe({"n0": 2}, now=4.0)  # n1 and n2 stopped
    assert proto.first_live_predecessor(3, records, beats, 4.0, 3.0) == 0
    beats = beats.observe({"n0": None}, now=4.0)
    assert proto.first_live_predecessor(3, records, beats, 4.0, 3.0) is None
    assert proto.first_live_predecessor(0, records, beats, 4.0, 3.0) is None


def test_an_arrival_without_a_record_counts_as_a_live_predecessor() -> None:
    records = {0: _record(0)}
    beats = proto.Heartbeats().observe({"n0": None}, now=0.0)
    assert proto.first_live_predecessor(2, records, beats, 100.0, 3.0) == 1
    # Seen without a record since 99: it may just have taken its index.
    assert proto.first_live_predecessor(2, records, beats, 100.0, 3.0, {1: 99.0}) == 1


def test_an_arrival_left_without_a_record_for_the_stale_window_is_gone() -> None:
    # Index 1 was taken and never written (its node died, or an etcd add answered to
    # nobody was retried): after the stale window the walk goes past it.
    records = {0: _record(0), 2: _record(2)}
    beats = proto.Heartbeats().observe({"n0": 1, "n2": 1}, now=0.0)
    assert proto.first_live_predecessor(2, records, beats, 2.9, 3.0, {1: 0.0}) == 1
    beats = beats.observe({"n0": 2}, now=3.0)  # n0 beats on
    assert proto.first_live_predecessor(2, records, beats, 3.0, 3.0, {1: 0.0}) == 0
    # The hole at 0, below the first live arrival: that arrival coordinates.
    assert proto.first_live_predecessor(1, {1: _record(1)}, beats, 5.0, 3.0, {0: 1.0}) is None
    # A record that came after all counts as the record (the heartbeat decides).
    assert proto.first_live_predecessor(1, records, beats, 3.0, 3.0, {0: -10.0}) == 0


# -- ranks ----------------------------------------------------------------------------


def test_assignment_ranks_follow_the_admitted_order_and_form_a_ring() -> None:
    seal = _seal([0, 2, 3, 6])
    got = {i: proto.assignment_for(seal, i) for i in (0, 1, 2, 3, 4, 5, 6)}
    assert got[1] is None and got[4] is None and got[5] is None
    ranks = {i: a.rank for i, a in got.items() if a is not None}
    assert ranks == {0: 0, 2: 1, 3: 2, 6: 3}
    succ = {i: a.successor_index for i, a in got.items() if a is not None}
    assert succ == {0: 2, 2: 3, 3: 6, 6: 0}
    assert all(a.world_size == 4 for a in got.values() if a is not None)


def test_assignment_alone_has_no_successor() -> None:
    only = proto.assignment_for(_seal([5]), 5)
    assert only is not None and (only.rank, only.world_size, only.successor_index) == (0, 1, -1)


def test_assignment_worker_offsets_per_job_and_per_role() -> None:
    workers = [(2, "trainer"), (2, "trainer"), (4, "reader"), (1, "trainer")]
    seal = _seal([0, 1, 2, 3], workers)
    got = [proto.assignment_for(seal, i) for i in range(4)]
    assert [a.rank_offset for a in got if a] == [0, 2, 4, 8]
    assert {a.total_workers for a in got if a} == {9}
    assert [a.role_offset for a in got if a] == [0, 2, 0, 4]
    assert [a.role_total for a in got if a] == [5, 5, 4, 5]


def test_the_seal_counts_the_members_whose_links_were_never_timed() -> None:
    # Arrivals 1 and 3 are new to link checks; 2 never wrote its record (left out, uncounted).
    records = {i: replace(_record(i), links_untimed=int(i in (1, 3))) for i in (0, 1, 3)}
    seal = proto.build_seal(0, [0, 1, 2, 3], records, "max", 4, 2)
    assert seal is not None and seal.world_size == 3 and seal.links_untimed == 2
    assert {proto.assignment_for(seal, i).links_untimed for i in (0, 1, 3)} == {2}  # type: ignore[union-attr]
    # A round of members whose links were all timed (a node lost since) times nothing.
    timed = proto.build_seal(1, [0, 1], {i: _record(i) for i in (0, 1)}, "reform", 2, 2)
    assert timed is not None and timed.links_untimed == 0


@pytest.mark.parametrize("untimed", [-1, 4])
def test_a_seal_that_counts_more_untimed_members_than_it_has_is_refused(untimed: int) -> None:
    raw = encode(replace(_seal([0, 1, 2]), links_untimed=untimed))
    with pytest.raises(RendezvousStateError, match="links_untimed"):
        decode(SealRecord, "seal", raw)


def test_with_round_keeps_everything_else() -> None:
    rec = proto.with_round(_record(1, 8, "r"), 7)
    assert rec.prev_round == 7 and rec.local_world_size == 8 and rec.node_id == "n1"


# -- random interleavings ---------------------------------------------------------------


@dataclass
class _Node:
    node_id: str
    alive: bool = True
    round: int = -1
    index: int = -1
    beats: proto.Heartbeats = field(default_factory=proto.Heartbeats)
    joined_at: float = 0.0
    last_count: int = 0
    last_arrival_at: float = 0.0
    member_of: int = -1  # the round whose seal admitted this node
    rank: int = -1


@dataclass
class _Round:
    arrivals: list[str] = field(default_factory=list)
    seal: SealRecord | None = None
    sealed_at: float = 0.0
    sealed_live: tuple[int, ...] = ()


class RendezvousModel(RuleBasedStateMachine):
    """A model store plus nodes that decide only through ``protocol``'s functions.

    The shell's duties are modelled as the dynamic handler (``rendezvous/dynamic/``) does them:
    check ``closed`` before each step, seal by compare-set from absent, end a round by advancing
    ``round`` once.
    """

    def __init__(self) -> None:
        super().__init__()
        self.settings = proto.RoundSettings(
            min_nodes=2, max_nodes=3, last_call_timeout_s=2.0, stale_after_s=3.0
        )
        self.now = 0.0
        self.current = 0
        self.rounds: dict[int, _Round] = {0: _Round()}
        self.closed = False
        self.closed_at_round: int | None = None
        self.seals_after_close = 0
        self.hb: dict[str, int] = {}
        self.nodes: dict[str, _Node] = {}
        self.counter = 0

    # -- helpers ------------------------------------------------------------------

    def _records(self, r: int) -> dict[int, NodeRecord]:
        return {
            i: NodeRecord(nid, "addr", "host", 1, 1)
            for i, nid in enumerate(self.rounds[r].arrivals)
        }

    def _arrive(self, node: _Node) -> None:
        rnd = self.rounds[self.current]
        node.round, node.index = self.current, len(rnd.arrivals)
        node.beats = proto.Heartbeats()
        node.last_count, node.last_arrival_at = node.index + 1, self.now
        node.member_of, node.rank = -1, -1
        rnd.arrivals.append(node.node_id)
        if node.index + 1 == self.settings.max_nodes and rnd.seal is None:
            self._write_seal(self.current, tuple(range(node.index + 1)), "max")

    def _write_seal(self, r: int, admitted: tuple[int, ...], reason: str) -> None:
        rnd = self.rounds[r]
        if rnd.seal is not None:  # compare-set from absent: the first sealer wins
            return
        if self.closed:
            self.seals_after_close += 1
        workers = runs([(1, "default")] * len(admitted))
        rnd.seal = SealRecord(
            r, len(rnd.arrivals), ranges(list(admitted)), len(admitted), reason, workers
        )
        rnd.sealed_at = self.now

    # -- rules ----------------------------------------------------------------------

    @initialize(min_nodes=st.integers(1, 3), extra=st.integers(0, 3))
    def configure(self, min_nodes: int, extra: int) -> None:
        self.settings = proto.RoundSettings(
            min_nodes=min_nodes,
            max_nodes=min_nodes + extra,
            last_call_timeout_s=2.0,
            stale_after_s=3.0,
        )

    @precondition(lambda self: len(self.nodes) < 8)
    @rule()
    def join(self) -> None:
        if self.closed:
            return  # next_rendezvous raises RendezvousClosedError before arriving
        self.counter += 1
        node = _Node(f"n{self.counter}")
        self.nodes[node.node_id] = node
        self.hb[node.node_id] = 1
        self._arrive(node)

    @rule(data=st.data())
    def kill(self, data: st.DataObject) -> None:
        alive = sorted(n for n, node in self.nodes.items() if node.alive)
        if alive:
            self.nodes[data.draw(st.sampled_from(alive))].alive = False

    def _waiting(self) -> list[str]:
        return sorted(
            n
            for n, node in self.nodes.items()
            if node.alive and node.round >= 0 and node.member_of != node.round
        )

    @rule(dt=st.sampled_from([0.1, 0.5, 1.0, 2.5]), everyone_steps=st.booleans())
    def tick(self, dt: float, everyone_steps: bool) -> None:
        """The clock moves; live nodes beat; maybe every waiting node wakes on its tick."""
        self.now += dt
        for node in self.nodes.values():
            if node.alive:
                self.hb[node.node_id] += 1
        if everyone_steps:
            for n in self._waiting():
                self._step(self.nodes[n])

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """One node, waiting for its round's seal, looks again (a coordinator step)."""
        waiting = self._waiting()
        if waiting:
            self._step(self.nodes[data.draw(st.sampled_from(waiting))])

    def _step(self, node: _Node) -> None:
        rnd = self.rounds[node.round]
        if rnd.seal is not None:
            assign = proto.assignment_for(rnd.seal, node.index)
            if assign is not None:
                node.member_of, node.rank = node.round, assign.rank
            return
        if self.closed:
            return
        stale = self.settings.stale_after_s
        records = self._records(node.round)
        ids = [rec.node_id for i, rec in records.items() if i != node.index]
        node.beats = node.beats.observe({n: self.hb.get(n) for n in ids}, self.now)
        pred = proto.first_live_predecessor(node.index, records, node.beats, self.now, stale)
        if pred is not None:
            return
        count = len(rnd.arrivals)
        if count > node.last_count:
            node.last_count, node.last_arrival_at = count, self.now
        live = proto.live_arrivals(records, count, node.beats, self.now, stale)
        reading = proto.BarrierReading(live=live, last_arrival_at=node.last_arrival_at)
        action = proto.decide_barrier(reading, self.settings, self.now)
        if isinstance(action, proto.Seal):
            assert node.index in action.admitted, "a coordinator sealed itself out"
            if action.reason == "last_call":
                assert self.now >= node.last_arrival_at + self.settings.last_call_timeout_s
            self._write_seal(node.round, action.admitted, action.reason)
            rnd.sealed_live = live

    @rule(data=st.data())
    def reform(self, data: st.DataObject) -> None:
        """A member of the sealed current round saw a loss or waiters: the round ends."""
        rnd = self.rounds[self.current]
        members = sorted(
            n for n, node in self.nodes.items() if node.alive and node.member_of == self.current
        )
        if rnd.seal is None or not members:
            return
        data.draw(st.sampled_from(members))
        self.current += 1  # compare-set round r -> r+1: only once per round
        self.rounds[self.current] = _Round()
        if self.closed:
            return
        survivors = sorted(
            n for n, node in self.nodes.items() if node.alive and node.round == self.current - 1
        )
        for n in data.draw(st.permutations(survivors)):
            self._arrive(self.nodes[n])

    @rule()
    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.closed_at_round = self.current

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def seals_are_well_formed(self) -> None:
        for r, rnd in self.rounds.items():
            seal = rnd.seal
            if seal is None:
                continue
            admitted = seal.admitted_indices()
            assert len(set(admitted)) == len(admitted)
            assert self.settings.min_nodes <= len(admitted) <= self.settings.max_nodes
            assert all(0 <= i < seal.sealed_arrivals <= len(rnd.arrivals) for i in admitted)
            ranks = sorted(
                a.rank for a in (proto.assignment_for(seal, i) for i in admitted) if a is not None
            )
            assert ranks == list(range(len(admitted))), f"round {r}: ranks {ranks}"
            if seal.reason == "max":
                assert len(admitted) == self.settings.max_nodes

    @invariant()
    def members_agree_on_one_group_per_round(self) -> None:
        by_round: dict[int, dict[int, str]] = {}
        for node in self.nodes.values():
            if node.member_of < 0:
                continue
            seal = self.rounds[node.member_of].seal
            assert seal is not None
            group = by_round.setdefault(node.member_of, {})
            assert node.rank not in group, f"rank {node.rank} twice in round {node.member_of}"
            group[node.rank] = node.node_id
            assert node.rank < seal.world_size
            arrivals = self.rounds[node.member_of].arrivals
            assert arrivals[seal.admitted_indices()[node.rank]] == node.node_id

    @invariant()
    def closed_means_no_new_round(self) -> None:
        assert self.seals_after_close == 0
        if self.closed_at_round is not None:
            for r in self.rounds:
                if r > self.closed_at_round:
                    assert self.rounds[r].arrivals == [], f"round {r} formed after close"


RendezvousModel.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_random_interleavings_keep_the_invariants = RendezvousModel.TestCase


@pytest.mark.parametrize("count", [1, 2, 5])
def test_max_seal_of_live_prefix_is_a_valid_group(count: int) -> None:
    settings_ = proto.RoundSettings(1, count, 0.0, 1.0)
    live = tuple(range(0, 3 * count, 3))
    action = proto.decide_barrier(_reading(live), settings_, now=0.0)
    assert isinstance(action, proto.Seal)
    seal = _seal(list(action.admitted))
    ranks = [proto.assignment_for(seal, i) for i in action.admitted]
    assert [a.rank for a in ranks if a] == list(range(count))


@pytest.mark.parametrize(
    ("raw", "ok"),
    [
        (b"0", True),
        (b"17", True),
        (b"-3", True),
        (b"9223372036854775807", True),
        (b"9223372036854775808", False),  # past 64 bits: std::stoll fails on the server
        (b"99999999999999999999999", False),
        (b"", False),
        (b"-", False),
        (b" 1", False),
        (b"1_000", False),
        (b"\x00\xffnot a counter", False),
        ("٣".encode(), False),  # a digit to Python, not to stoll
    ],
)
def test_a_counter_is_what_a_store_can_add_to(raw: bytes, ok: bool) -> None:
    assert is_counter(raw) is ok
