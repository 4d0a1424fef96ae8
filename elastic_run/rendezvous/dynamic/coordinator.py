"""The barrier duties of one arrival in a forming round: find the coordinator, seal the round.

Each arrival in round r walks down its predecessors to the first one not judged gone: while
there is one, that one coordinates and this arrival only watches it (O(1) reads a step). An
arrival whose record stays unwritten for the stale window is gone too (its node died between
its index and its record, or one node's index was taken twice: an etcd add whose answer was
lost with a member and retried on another); without that rule its successor would watch
it until the join timeout. The
lowest live arrival coordinates: it reads the arrival count, the arrivals' records and
heartbeats, and the nodes expected back from the previous round, and asks the protocol
(``protocol.decide_barrier``) whether to seal. The arrival that brings the count to max takes
one coordinator step at once, so a full round completes without waiting for a tick, and only
if the max arrivals are alive (the protocol decides, not this module).

A seal is written once, by compare-set from absent (``protocol.build_seal`` decides what it
admits). Every decision is in ``protocol/decisions.py``; this module reads, asks, and writes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

from elastic_run.rendezvous.backend import RendezvousBackend
from elastic_run.rendezvous.protocol import decisions as proto
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import (
    LostRecord,
    NodeRecord,
    SealReason,
    SealRecord,
    decode,
    decode_int,
    encode,
)
from elastic_run.rendezvous.settings import RendezvousSettings

__all__ = ["Coordinator", "read_lost", "round_nodes", "write_seal"]

_WATCH_GAP_TICKS = 4
# A watcher's next look is at least this many times its last look's length away (``pace``).
_LOOK_BACKOFF = 9.0


def read_lost(backend: RendezvousBackend, r: int) -> LostRecord | None:
    """Why round ``r`` ended (one store read), or None while it runs."""
    (raw,) = backend.get_unwaited([keys.lost(r)])  # nobody waits for it
    return decode(LostRecord, keys.lost(r), raw) if raw is not None else None


def round_nodes(backend: RendezvousBackend, r: int) -> set[str]:
    """The node ids of round ``r``'s members and of the nodes at its door (a few reads): every
    arrival with a record that the seal admitted or that came after its count; none while the
    round is unsealed."""
    raw_arrivals, raw_seal = backend.get_many([keys.arrivals(r), keys.seal(r)])
    n = decode_int(keys.arrivals(r), raw_arrivals) if raw_arrivals is not None else 0
    if not n or raw_seal is None:
        return set()
    seal = decode(SealRecord, keys.seal(r), raw_seal)
    admitted = set(seal.admitted_indices())
    node_keys = [keys.node(r, i) for i in range(n)]
    return {
        decode(NodeRecord, k, v).node_id
        for i, k, v in zip(range(n), node_keys, backend.get_many(node_keys), strict=True)
        if v is not None and (i in admitted or i >= seal.sealed_arrivals)
    }


def write_seal(
    backend: RendezvousBackend,
    r: int,
    admitted: tuple[int, ...],
    reason: SealReason,
    sealed_arrivals: int,
    settings: RendezvousSettings,
    min_nodes: int,
    known: Mapping[int, NodeRecord] | None = None,
) -> None:
    """Complete round ``r`` with ``admitted`` if the protocol allows (first sealer wins).

    Args:
        known: the arrivals' records already read (a record is written once per arrival
            index), so only the others are read.
    """
    records = {i: known[i] for i in admitted if known is not None and i in known}
    wanted = [i for i in admitted if i not in records]
    node_keys = [keys.node(r, i) for i in wanted]
    values = backend.get_many(node_keys) if node_keys else []
    missing = [k for k, v in zip(node_keys, values, strict=True) if v is None]
    if missing:
        # An arrival between its add and its set: give it a moment, then leave it out.
        backend.wait_for(missing, settings.stale_after_s)
        values = backend.get_many(node_keys)
    records.update(
        (i, decode(NodeRecord, k, v))
        for i, k, v in zip(wanted, node_keys, values, strict=True)
        if v is not None
    )
    restarts = backend.read_counter(keys.RESTARTS)
    seal = proto.build_seal(r, admitted, records, reason, sealed_arrivals, min_nodes, restarts)
    if seal is not None:
        backend.compare_set(keys.seal(r), None, encode(seal))


class Coordinator:
    """The barrier duties of arrival ``index`` in round ``r``.

    Args:
        backend: the job's backend.
        node_id: this node's id.
        r: the forming round.
        index: this node's arrival index.
        settings: the timing.
        round_settings: min, max, last call and staleness for the barrier.
        beats: what this node already knows of others' heartbeats (its liveness thread's view).
        with_notices: applies this node's death notices to a heartbeat view.
        now: the monotonic time of the arrival.
    """

    def __init__(
        self,
        backend: RendezvousBackend,
        node_id: str,
        r: int,
        index: int,
        settings: RendezvousSettings,
        round_settings: proto.RoundSettings,
        beats: proto.Heartbeats,
        with_notices: Callable[[proto.Heartbeats], proto.Heartbeats],
        now: float,
    ) -> None:
        self._backend = backend
        self._node_id = node_id
        self._r = r
        self._index = index
        self._settings = settings
        self._round = round_settings
        self._beats = beats
        self._with_notices = with_notices
        self._records: dict[int, NodeRecord] = {}
        # When this node first found an arrival below it without a record (its own time).
        self._missing_since: dict[int, float] = {}
        self._arrivals = index + 1
        self._last_arrival_at = now
        self._expected: set[str] | None = None
        self._next_at: float | None = None
        # The first arrival looks at once; a later one first after its watch gap (most
        # arrivals of a round that fills quickly never look at all: the seal comes first).
        self._look_at: float | None = now + self._watch_gap() if index > 0 else None
        self._pending = 0

    def next_wait(self, now: float) -> float:
        """How long to wait for the seal before the next step.

        A tick is drawn between half and all of ``keep_alive_interval``, so thousands of
        arrivals that came together do not step together (a burst on the store, and on the
        interpreter lock of a process holding many nodes).
        """
        tick = self._settings.keep_alive_interval_s * random.uniform(0.5, 1.0)
        if self._pending:
            # A re-forming round waits on nodes of the last one: judge them 4 times a tick, so
            # a dead one is dropped soon after its heartbeat went stale (O(expected) reads).
            tick = tick / 4
        if self._next_at is None:
            return tick
        return max(0.01, min(tick, self._next_at - now))

    def is_due(self, now: float) -> bool:
        """Whether a step is due (a watcher whose predecessor lived looks again later)."""
        return self._look_at is None or now >= self._look_at

    def look_in(self, now: float) -> float:
        """Seconds until the next step is due (0: due now, or every tick)."""
        return 0.0 if self._look_at is None else max(0.0, self._look_at - now)

    def _watch_gap(self) -> float:
        """How long a watcher leaves its live predecessor before it looks again.

        One tick for arrival 1 (it takes over from the first coordinator); then one more tick
        per doubling of the index, at most ``_WATCH_GAP_TICKS``: an arrival far from the
        front takes over only when every arrival before it is gone, and thousands of
        arrivals looking every tick would load the store and their hosts for nothing.
        """
        ticks = min(_WATCH_GAP_TICKS, max(1, self._index).bit_length())
        return ticks * self._settings.keep_alive_interval_s * random.uniform(0.75, 1.0)

    def step(self, now: float, *, coordinate: bool = False) -> None:
        """One look at the round: watch the predecessor, or coordinate (and maybe seal).

        Args:
            coordinate: coordinate whatever the predecessors (the arrival that brought the
                count to max: it seals at once when the protocol finds max arrivals alive).
        """
        stale = self._round.stale_after_s
        self._beats = self._with_notices(self._beats)
        if coordinate:
            self._coordinate(now)
            return
        self._load_predecessors(now, stale)
        pred = proto.first_live_predecessor(
            self._index, self._records, self._beats, now, stale, self._missing_since
        )
        if pred is not None:
            chain = [
                self._records[j].node_id for j in range(pred, self._index) if j in self._records
            ]
            self._observe(chain, now)
            self._next_at = None
            self._look_at = now + self._watch_gap()
            if pred in self._missing_since:  # look again when it may be judged gone
                self._look_at = min(self._look_at, self._missing_since[pred] + stale)
            return
        self._look_at = None
        self._coordinate(now)

    def pace(self, took_s: float, now: float) -> None:
        """Put a watcher's next look at least ``_LOOK_BACKOFF`` times its last look's length off.

        A look's length is the store's queueing delay: it grows with the requests every node
        has outstanding, so watchers that looked again on their usual gap however slow the
        answers came kept the store saturated (16,384 nodes on one starved TCPStore: nine in ten
        node threads queued in looks, the sealing arrival queued behind them; issue 38). Backing
        off in proportion keeps the watchers' share of the store's time bounded whatever its
        speed, and costs nothing where the store answers in milliseconds. The coordinator (no
        look due: it steps every tick) is not paced.

        Args:
            took_s: how long the last step (with its closed check) took.
            now: the monotonic time it ended.
        """
        if self._look_at is not None:
            self._look_at = max(self._look_at, now + _LOOK_BACKOFF * max(0.0, took_s))

    def _coordinate(self, now: float) -> None:
        r, backend, stale = self._r, self._backend, self._round.stale_after_s
        (raw,) = backend.get_unwaited([keys.arrivals(r)])  # it exists: this node arrived
        arrivals = decode_int(keys.arrivals(r), raw) if raw is not None else self._arrivals
        if arrivals > self._arrivals:
            self._arrivals, self._last_arrival_at = arrivals, now
        self._load_records(arrivals)
        ids = [rec.node_id for i, rec in sorted(self._records.items()) if i != self._index]
        expected = self._expected_nodes()
        self._observe(sorted(set(ids) | (expected - {self._node_id})), now)
        live = proto.live_arrivals(self._records, arrivals, self._beats, now, stale)
        self._pending = proto.expected_pending(
            expected, (rec.node_id for rec in self._records.values()), self._beats, now, stale
        )
        reading = proto.BarrierReading(
            live=live,
            last_arrival_at=self._last_arrival_at,
            expected_pending=self._pending,
            is_reform=bool(expected),
        )
        action = proto.decide_barrier(reading, self._round, now)
        if isinstance(action, proto.Seal):
            write_seal(
                backend,
                r,
                action.admitted,
                action.reason,
                arrivals,
                self._settings,
                self._round.min_nodes,
                self._records,
            )
            self._next_at = None
        else:
            self._next_at = action.until

    def _observe(self, node_ids: list[str], now: float) -> None:
        beats = self._backend.read_heartbeats(node_ids)
        self._beats = self._beats.observe(dict(zip(node_ids, beats, strict=True)), now)

    def _load_records(self, upto: int, start: int = 0) -> None:
        want = [i for i in range(start, upto) if i not in self._records]
        if not want:
            return
        node_keys = [keys.node(self._r, i) for i in want]
        for i, k, v in zip(want, node_keys, self._backend.get_many(node_keys), strict=True):
            if v is not None:
                self._records[i] = decode(NodeRecord, k, v)

    def _load_predecessors(self, now: float, stale: float) -> None:
        """Read the records below this arrival down to the first one not judged gone.

        Only that walk decides who coordinates, so a node reads O(1) records per step, not
        every lower arrival's (which would cost the round O(N²) bytes).
        """
        j = self._index - 1
        while j >= 0:
            if j not in self._records:
                # The next one first; past a gone one, a few at once (gone ones come in runs).
                batch = 1 if j == self._index - 1 else 8
                self._load_records(j + 1, start=max(0, j + 1 - batch))
            if j not in self._records:
                self._missing_since.setdefault(j, now)  # taken and not written (yet)
            gone = proto.arrival_is_gone(
                j, self._records, self._beats, now, stale, self._missing_since
            )
            if not gone:
                return
            j -= 1

    def _expected_nodes(self) -> set[str]:
        """The nodes of the previous round (members and waiters) not already known lost."""
        if self._expected is not None:
            return self._expected
        backend, prev = self._backend, self._r - 1
        expected = round_nodes(backend, prev) if prev >= 0 else set()
        if expected:
            lost = read_lost(backend, prev)
            if lost is not None:
                expected -= set(lost.node_ids)
        self._expected = expected
        return expected
