"""The pure decisions of the O(N) rendezvous protocol: (what was read, now) -> action.

No store, no clock, no threads here: the handler (``dynamic/handler.py``) reads, passes the
reading and ``now`` in, and applies what comes back. Times are monotonic seconds of
the reading node; no two nodes' clocks are ever compared.

Liveness (``Heartbeats``): a node is alive while its heartbeat counter keeps moving.
A counter that has not moved for ``stale_after_s`` of the reader's own time *and* over at
least ``min_reads`` reads of the reader since it last moved, or that vanished after being
seen (an expired lease), marks the node as gone. So does a death notice (``with_closed``:
the node's agent process was seen to end, see ``peerwatch.py``); that verdict is final, as
node ids are never reused. The reads rule keeps a reader's own stall (a GC pause, a starved
process, a suspended VM) from convicting the node it reads: after a stall of any length the
reader reads ``min_reads`` more times, one interval apart, before it may judge, which gives
the read node as many intervals to show a beat once the machine runs again.

The barrier (``decide_barrier``), evaluated by the round's coordinator (the lowest
live arrival) and once by the arrival that brings the count to max:

    live >= max                                         -> seal the first max live, "max"
    live >= min and every expected node of the previous
        round has arrived or is gone                    -> seal all live, "reform"
    live >= min and now >= last arrival + last_call     -> seal all live, "last_call"
    live >= min                                         -> wait until last arrival + last_call
    otherwise                                           -> wait for arrivals

The seal (``build_seal``): the admitted arrivals whose records could be read, never fewer than
min (an arrival that took its index but never wrote its record within the stale window is left
out; if that leaves fewer than min, no seal), in the order of the stable-rank rule
(``stable_ranks.py``): survivors of the last round keep their ranks where the new world allows,
newcomers take the free ranks; without claims, arrival order.

Judging members after completion (``judge_ring``, by each member about its ring successor, and
``judge_watched``, by a waiting node about the members it watches):

    the store's round moved past the member's round     -> RoundEnded (someone else ended it)
    the job is closed                                   -> Keep (a finished job loses no one)
    the successor is gone (stale heartbeat or notice)   -> MemberLost(successor)
    otherwise                                           -> Keep

Waiting nodes (``waiting_with_room``): arrivals beyond a round's seal wait at its door; the
members count only as many of them as a next round could admit (MAX minus the round's members).
A round at MAX keeps its nodes, and the nodes beyond wait as spares (torch's redundancy list)
until a member is lost or leaves.

Ranks (``assignment_for``): position in the seal's admitted list; worker rank offsets are the
prefix sums of the members' local world sizes (carried run-length encoded in the seal,
so a member computes its place from the one seal record), per job and per role; each
member watches its successor in rank order (a ring), so any death is seen by someone
alive.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from elastic_run.rendezvous.api import Assignment
from elastic_run.rendezvous.protocol.records import NodeRecord, SealReason, SealRecord, ranges, runs
from elastic_run.rendezvous.protocol.stable_ranks import stable_order

__all__ = [
    "Assignment",
    "BarrierReading",
    "Heartbeats",
    "Keep",
    "MemberLost",
    "RingVerdict",
    "RoundEnded",
    "RoundSettings",
    "Seal",
    "Wait",
    "assignment_for",
    "build_seal",
    "decide_barrier",
    "expected_pending",
    "arrival_is_gone",
    "first_live_predecessor",
    "judge_ring",
    "judge_watched",
    "live_arrivals",
    "waiting_with_room",
    "with_round",
]


@dataclass(frozen=True)
class RoundSettings:
    """The numbers a barrier decision depends on."""

    min_nodes: int
    max_nodes: int
    last_call_timeout_s: float
    stale_after_s: float


@dataclass(frozen=True)
class _Beat:
    value: int | None
    changed_at: float
    ever_seen: bool
    closed: bool = False
    reads: int = 0  # reads that found the value unchanged since changed_at


@dataclass(frozen=True)
class Heartbeats:
    """What one reader has seen of other nodes' heartbeat counters.

    Attributes:
        beats: node id -> what was seen of it.
        min_reads: how many reads must find a counter unchanged before it may be judged stale
            (besides ``stale_after_s`` of time); 0: time alone.
    """

    beats: Mapping[str, _Beat] = field(default_factory=dict)
    min_reads: int = 0

    def observe(self, values: Mapping[str, int | None], now: float) -> Heartbeats:
        """Return the view after reading ``values`` (node id -> counter or None) at ``now``."""
        beats = dict(self.beats)
        for node_id, value in values.items():
            old = beats.get(node_id)
            if old is None:
                beats[node_id] = _Beat(value, now, value is not None)
            elif old.closed:
                continue
            elif value != old.value:
                if value is None:
                    # Seen before and now absent: the backend dropped it (a lease expired).
                    beats[node_id] = _Beat(None, old.changed_at, old.ever_seen)
                else:
                    beats[node_id] = _Beat(value, now, True)
            else:
                beats[node_id] = replace(old, reads=old.reads + 1)
        return Heartbeats(beats, self.min_reads)

    def is_gone(self, node_id: str, now: float, stale_after_s: float) -> bool:
        """Return whether ``node_id`` is judged dead at ``now``.

        A node never read is not judged at all (False).
        """
        beat = self.beats.get(node_id)
        if beat is None:
            return False
        if beat.closed or (beat.value is None and beat.ever_seen):
            return True
        return now - beat.changed_at >= stale_after_s and beat.reads >= self.min_reads

    def with_closed(self, node_ids: Iterable[str], now: float) -> Heartbeats:
        """Return the view where ``node_ids`` are gone for good (their agents were seen to end).

        Returns this view itself when it already knows all of them (the common case: the
        same notices are applied at every reading).
        """
        new = [n for n in node_ids if not (n in self.beats and self.beats[n].closed)]
        if not new:
            return self
        beats = dict(self.beats)
        for node_id in new:
            beats[node_id] = _Beat(None, now, True, closed=True)
        return Heartbeats(beats, self.min_reads)

    def forget(self, node_ids: Iterable[str]) -> Heartbeats:
        """Return the view without ``node_ids``."""
        drop = set(node_ids)
        return Heartbeats({k: v for k, v in self.beats.items() if k not in drop}, self.min_reads)


@dataclass(frozen=True)
class Seal:
    """Complete the round with ``admitted`` (arrival indices in rank order)."""

    admitted: tuple[int, ...]
    reason: SealReason


@dataclass(frozen=True)
class Wait:
    """Nothing to do yet; look again by ``until`` (None: at the next tick)."""

    until: float | None = None


@dataclass(frozen=True)
class BarrierReading:
    """What the coordinator read of the forming round.

    Attributes:
        live: the arrival indices judged alive, ascending.
        last_arrival_at: when (reader's clock) the arrival count last grew.
        expected_pending: nodes of the previous round that neither arrived nor are gone.
        is_reform: whether this round follows a completed one (so there are expected nodes).
    """

    live: tuple[int, ...]
    last_arrival_at: float
    expected_pending: int = 0
    is_reform: bool = False


def decide_barrier(reading: BarrierReading, settings: RoundSettings, now: float) -> Seal | Wait:
    """Decide whether the round completes now. See the module docstring for the table."""
    live = reading.live
    if len(live) >= settings.max_nodes:
        return Seal(tuple(live[: settings.max_nodes]), "max")
    if len(live) < settings.min_nodes:
        return Wait()
    if reading.is_reform and reading.expected_pending == 0:
        return Seal(tuple(live), "reform")
    deadline = reading.last_arrival_at + settings.last_call_timeout_s
    if now >= deadline:
        return Seal(tuple(live), "last_call")
    return Wait(until=deadline)


def live_arrivals(
    records: Mapping[int, NodeRecord],
    arrivals: int,
    heartbeats: Heartbeats,
    now: float,
    stale_after_s: float,
) -> tuple[int, ...]:
    """Return the arrival indices below ``arrivals`` whose node wrote its record and is alive."""
    return tuple(
        i
        for i in range(arrivals)
        if i in records and not heartbeats.is_gone(records[i].node_id, now, stale_after_s)
    )


def expected_pending(
    expected: Iterable[str],
    arrived: Iterable[str],
    heartbeats: Heartbeats,
    now: float,
    stale_after_s: float,
) -> int:
    """Count the previous round's nodes that neither arrived nor are judged gone."""
    here = set(arrived)
    return sum(
        1
        for node_id in expected
        if node_id not in here and not heartbeats.is_gone(node_id, now, stale_after_s)
    )


def _spans(seal: SealRecord) -> list[tuple[tuple[int, int], int, str]]:
    """The seal's worker runs as ((first rank, end rank), local_world_size, role)."""
    spans = []
    node = 0
    for count, lws, role in seal.workers:
        spans.append(((node, node + count), lws, role))
        node += count
    return spans


def assignment_for(seal: SealRecord, index: int) -> Assignment | None:
    """Return the assignment of arrival ``index`` in ``seal``, or None when not admitted.

    Global ranks follow node rank; role ranks count only the nodes of the same role.
    """
    found = seal.rank_of(index)
    if found is None:
        return None
    rank = found
    total = offset = role_offset = 0
    role_totals: dict[str, int] = {}
    my_role = next(role for span, _, role in _spans(seal) if span[0] <= rank < span[1])
    for (first, end), lws, role in _spans(seal):
        below = max(0, min(end, rank) - first)
        total += (end - first) * lws
        role_totals[role] = role_totals.get(role, 0) + (end - first) * lws
        offset += below * lws
        if role == my_role:
            role_offset += below * lws
    n = seal.admitted_count()
    return Assignment(
        rank=rank,
        world_size=n,
        rank_offset=offset,
        total_workers=total,
        role_offset=role_offset,
        role_total=role_totals.get(my_role, 0),
        successor_index=seal.index_at((rank + 1) % n) if n > 1 else -1,
        restart_count=seal.restarts,
        links_untimed=seal.links_untimed,
    )


def first_live_predecessor(
    index: int,
    records: Mapping[int, NodeRecord],
    heartbeats: Heartbeats,
    now: float,
    stale_after_s: float,
    missing_since: Mapping[int, float] | None = None,
) -> int | None:
    """Return the highest arrival below ``index`` not judged gone, or None (``index`` coordinates).

    Each arrival is judged by ``arrival_is_gone``.
    """
    for j in range(index - 1, -1, -1):
        if not arrival_is_gone(j, records, heartbeats, now, stale_after_s, missing_since):
            return j
    return None


def arrival_is_gone(
    j: int,
    records: Mapping[int, NodeRecord],
    heartbeats: Heartbeats,
    now: float,
    stale_after_s: float,
    missing_since: Mapping[int, float] | None = None,
) -> bool:
    """Whether arrival ``j`` of a forming round is judged gone.

    With a record: its node's heartbeat stood still past ``stale_after_s``. Without one it
    counts as alive while it may just have taken its index: until ``stale_after_s`` after the
    reader first found it without a record (``missing_since[j]``, the reader's time; absent:
    not looked at yet). Past that it is gone: its node died between its index and its record,
    or the index was taken twice for one node (an add whose answer was lost with an etcd
    member, retried on another), and no record will ever come. ``build_seal`` leaves such an
    arrival out after the same wait.
    """
    rec = records.get(j)
    if rec is not None:
        return heartbeats.is_gone(rec.node_id, now, stale_after_s)
    since = (missing_since or {}).get(j)
    return since is not None and now - since >= stale_after_s


def with_round(record: NodeRecord, prev_round: int) -> NodeRecord:
    """Return ``record`` remembering the last round the node took part in."""
    return replace(record, prev_round=prev_round)


def build_seal(
    r: int,
    admitted: Sequence[int],
    records: Mapping[int, NodeRecord],
    reason: SealReason,
    sealed_arrivals: int,
    min_nodes: int,
    restarts: int = 0,
) -> SealRecord | None:
    """The seal of round ``r`` admitting ``admitted`` (in arrival order), or None below min.

    Arrivals whose record is missing from ``records`` (they took an index and never wrote)
    are left out; when that leaves fewer than ``min_nodes``, there is no seal. The members are
    put in rank order by ``stable_order`` from the ranks their records say they held.
    """
    present = [i for i in admitted if i in records]
    if len(present) < min_nodes:
        return None
    claims = {i: (records[i].rank_round, records[i].prev_rank) for i in present}
    avoid = {i: records[i].avoid_rank for i in present if records[i].avoid_rank >= 0}
    live = list(stable_order(present, claims, avoid))
    workers = runs([(records[i].local_world_size, records[i].role) for i in live])
    untimed = sum(1 for i in live if records[i].links_untimed > 0)
    return SealRecord(
        r, sealed_arrivals, ranges(live), len(live), reason, workers, restarts, untimed
    )


@dataclass(frozen=True)
class Keep:
    """Nothing to do: the round goes on."""


@dataclass(frozen=True)
class RoundEnded:
    """The round ended without this node's doing (the store's round moved on)."""


@dataclass(frozen=True)
class MemberLost:
    """End the round: these members are judged dead."""

    node_ids: tuple[str, ...]


RingVerdict = Keep | RoundEnded | MemberLost


def judge_ring(
    member_round: int,
    store_round: int | None,
    successor: str,
    heartbeats: Heartbeats,
    now: float,
    stale_after_s: float,
    *,
    closed: bool,
) -> RingVerdict:
    """A member's verdict about its round and its ring successor. See the module's table.

    Args:
        member_round: the round this node is a member of.
        store_round: the round the store holds now (None: not written).
        successor: the node id this member watches ("" when alone).
        heartbeats: this node's view of the successor's heartbeat (death notices applied).
        now: this node's monotonic clock.
        stale_after_s: how long a heartbeat may stand still.
        closed: whether the job is closed.
    """
    if store_round is not None and store_round != member_round:
        return RoundEnded()
    if closed or not successor:
        return Keep()
    if heartbeats.is_gone(successor, now, stale_after_s):
        return MemberLost((successor,))
    return Keep()


def judge_watched(
    watched: Iterable[str], heartbeats: Heartbeats, now: float, stale_after_s: float
) -> RingVerdict:
    """A waiting node's verdict about the members it watches: the gone ones, or Keep."""
    gone = tuple(n for n in watched if heartbeats.is_gone(n, now, stale_after_s))
    return MemberLost(gone) if gone else Keep()


def waiting_with_room(arrivals: int, sealed_arrivals: int, members: int, max_nodes: int) -> int:
    """The nodes waiting at a round's door that a next round has room for.

    Args:
        arrivals: the round's arrival count (members, left-outs and waiting nodes).
        sealed_arrivals: the arrivals the seal considered (the ones after it wait).
        members: the round's members.
        max_nodes: the job's MAX.

    Returns:
        ``min(arrivals after the seal, MAX - members)``, never below 0: a full round has no
        room, its waiting nodes are spares.
    """
    return max(0, min(arrivals - sealed_arrivals, max_nodes - members))
