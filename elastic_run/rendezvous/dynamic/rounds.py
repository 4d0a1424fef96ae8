"""Joining rounds on the store: arrive, be admitted or wait at the door, end a round.

One node's blocking side of the protocol. ``join`` loops until this node is a member of a
completed round:

    closed                         -> RendezvousClosedError
    the current round is sealed    -> arrive as a waiting node, block until that round ends
                                      (watching two members, so a job whose members all died
                                      does not keep the door shut), then look again
    the current round is forming   -> arrive, take the barrier duties (coordinator.py) until
                                      the seal is written; admitted: done; too late: wait at
                                      the door of this round

Every blocking wait is sliced; between slices the agent's interrupt check and the join deadline
are looked at. A slice lasts at most ``keep_alive_interval``, or, for an arrival that only
watches and whose next look is further off, up to the next look and at most
``_WATCHER_SLICE_INTERVALS`` intervals: each slice that ends without the seal costs the store
two requests (the wait and its cancel), and one-interval slices of thousands of watchers were
half of a 4,096-node round's traffic; a signal is then seen within two intervals. In a forming
round an arrival that only
watches its predecessor reads the store (the closed record, its predecessor) every 1 to 4
slices by its arrival index (``Coordinator.is_due``), not every slice, and no sooner than nine
times its last look's length (``Coordinator.pace``: a saturated store is not asked faster than
it answers): such an arrival sees a closed job within 4 intervals (more on a saturated store),
and one far down takes over coordination later when every arrival before it died. The closed
check between slices is one read a half interval for a process's nodes of one job
(``shared_reads.py``). Ending a round is two compare-sets (``r<r>/lost`` from absent, then
``round`` r -> r+1) and an epoch bump, so a member's agent notices it at its next poll even
without a liveness verdict.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from elastic_run.clock import SYSTEM_CLOCK, Clock
from elastic_run.rendezvous.api import Assignment
from elastic_run.rendezvous.backend import RendezvousBackend, closed_record
from elastic_run.rendezvous.dynamic.coordinator import Coordinator
from elastic_run.rendezvous.dynamic.shared_reads import read_shared
from elastic_run.rendezvous.errors import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousInterruptedError,
    RendezvousStateError,
    RendezvousTimeoutError,
    RendezvousUnreachableError,
)
from elastic_run.rendezvous.outage import BACKEND_OUTAGE
from elastic_run.rendezvous.protocol import decisions as proto
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import (
    LostRecord,
    NodeRecord,
    SealRecord,
    decode,
    decode_int,
    encode,
    is_counter,
)
from elastic_run.rendezvous.settings import RendezvousSettings

__all__ = ["Membership", "Rounds", "bump_epoch", "end_round"]

log = logging.getLogger(__name__)

# The longest slice of a watcher's wait for the seal, in keep-alive intervals (module docstring).
_WATCHER_SLICE_INTERVALS = 2


@dataclass(frozen=True)
class Membership:
    """This node's place in a completed round.

    Attributes:
        round: the round.
        index: this node's arrival index in it.
        seal: the round's seal.
        assign: this node's ranks (``assign.successor_index``: the arrival index of the
            member it watches, -1 when alone; its record is read by the liveness turns, not
            by the join: a process's nodes read theirs in one request).
    """

    round: int
    index: int
    seal: SealRecord
    assign: Assignment


def bump_epoch(backend: RendezvousBackend) -> str | None:
    """Add one to the job's epoch, so every member's next read sees that something changed.

    A value under ``epoch`` that is not a counter (anything that can write the store could put
    one there; a TCPStore drops the connection of a client that adds to it) is replaced first,
    compare-set from the bytes read, by a number no earlier epoch had (the clock in
    microseconds): members compare epochs for equality only.

    Returns:
        What the replaced value held, or None when it was a counter.
    """
    (raw,) = backend.get_unwaited([keys.EPOCH])
    replaced = None
    if raw is not None and not is_counter(raw):
        backend.compare_set(keys.EPOCH, raw, str(time.time_ns() // 1000).encode())
        replaced = f"{raw[:40]!r} (not a counter)"
    backend.add(keys.EPOCH, 1)
    return replaced


def _bump_epoch_saying(backend: RendezvousBackend) -> None:
    """``bump_epoch``, with a warning when it replaced the value."""
    replaced = bump_epoch(backend)
    if replaced is not None:
        log.warning("rendezvous key '%s' held %s; replaced", keys.EPOCH, replaced)


def end_round(backend: RendezvousBackend, r: int, why: LostRecord) -> bool:
    """Record why round ``r`` ended (first writer wins) and advance the round past it.

    When this node's worker failure ended the round first, the job's restart count is bumped
    before the round advances, so every member of the next round reads the new count.

    Returns:
        Whether this call's record is the one that stands (this node ended the round first).
    """
    _, first = backend.compare_set(keys.lost(r), None, encode(why))
    if first and why.reason == "worker_failure":
        backend.add(keys.RESTARTS, 1)
    backend.compare_set(keys.ROUND, str(r).encode(), str(r + 1).encode())
    _bump_epoch_saying(backend)
    return first


class Rounds:
    """The blocking part of one node's rendezvous.

    Args:
        backend: the job's backend.
        run_id: the job id (for messages).
        node_id: this node's id.
        settings: the timing.
        round_settings: min, max, last call and staleness for the barrier.
        clock: the clock (its time, and the pause between two attempts).
        record: builds this node's arrival record (called at each arrival).
        is_interrupted: the agent's interrupt check.
        seed_beats: what this node's liveness thread has seen (seeds each coordinator).
        with_notices: applies this node's death notices to a heartbeat view.
        slices_needed: whether anything must be looked at between store reads (an interrupt
            check is installed); when not, a watcher waits for the seal until its next look
            (the seal's write ends that wait on torch's default libuv TCPStore server and on
            etcd; the legacy TCPStore server wakes no waiter on a compare-set).
        tell: tells round ``r``'s members (``(r, seal, this node's arrival index, cause)``,
            ``round_tell.py``): a node at the door of a round with room says it waits, and one
            that judged a member lost says so, at once. None: nobody is told (the members'
            epoch reads find both).
    """

    def __init__(
        self,
        backend: RendezvousBackend,
        run_id: str,
        node_id: str,
        settings: RendezvousSettings,
        round_settings: proto.RoundSettings,
        clock: Clock,
        record: Callable[[], NodeRecord],
        is_interrupted: Callable[[], bool],
        seed_beats: Callable[[], proto.Heartbeats],
        with_notices: Callable[[proto.Heartbeats], proto.Heartbeats],
        slices_needed: Callable[[], bool] = lambda: True,
        tell: Callable[[int, SealRecord, int, str], None] | None = None,
    ) -> None:
        self._backend = backend
        self._run_id = run_id
        self._node_id = node_id
        self._settings = settings
        self._round = round_settings
        self._clock = clock
        self._record = record
        self._is_interrupted = is_interrupted
        self._seed_beats = seed_beats
        self._with_notices = with_notices
        self._slices_needed = slices_needed
        self._tell = tell
        self.last_round = -1
        self.last_rank = -1
        self.rank_round = -1
        self._arrived: tuple[int, int] | None = None  # (round, index) of the last arrival

    def join(self, deadline: float) -> Membership:
        """Block until this node is a member of a completed round.

        Raises:
            RendezvousClosedError: the job is closed.
            RendezvousTimeoutError: ``deadline`` (monotonic) passed.
            RendezvousInterruptedError: the agent's interrupt check turned true.
        """
        said = False
        while True:
            try:
                member = self._join_once(deadline)
            except RendezvousUnreachableError as exc:
                # A store that does not answer may come back (a healed partition): try again
                # until the join timeout. One that refuses raises at once (exit 4).
                if self._clock() >= deadline or self._is_interrupted():
                    raise
                if not said:
                    BACKEND_OUTAGE.warn(
                        log, f"rendezvous '{self._run_id}'", exc, "trying until the join timeout"
                    )
                    said = True
                self._clock.sleep(min(0.5, max(0.0, deadline - self._clock())))  # then retry
                continue
            if member is not None:
                self.last_round = member.round
                self.last_rank, self.rank_round = member.assign.rank, member.round
                return member

    def _join_once(self, deadline: float) -> Membership | None:
        """One attempt: join the forming round, or wait at the door of a completed one."""
        self.check_closed()
        r = self.current_round()
        seal_raw = self._backend.get(keys.seal(r))
        if seal_raw is not None:
            # The round is complete without us: wait at the door for the next one.
            self._wait_at_door(r, decode(SealRecord, keys.seal(r), seal_raw), deadline)
            return None
        return self._join_round(r, deadline)

    def check_closed(self, *, shared: bool = False) -> None:
        """Raise when interrupted or when the job is closed (one store read, or none: ``shared``).

        Args:
            shared: take a read of the closed key made by another node of this job in this
                process within half an interval (``shared_reads.py``): the checks between wait
                slices, on the system clock. The first check of a join is this node's own read.
        """
        if self._is_interrupted():
            raise RendezvousInterruptedError(f"rendezvous '{self._run_id}': interrupted")
        backend = self._backend
        # A fake clock is a logic test's: every node reads for itself there (as for the epoch).
        shared = shared and self._clock is SYSTEM_CLOCK
        max_age_s = self._settings.keep_alive_interval_s / 2 if shared else 0.0
        (raw,) = read_shared(
            (backend.name, backend.endpoint, self._run_id, keys.CLOSED),
            lambda: backend.get_unwaited([keys.CLOSED]),
            max_age_s,
            self._clock,
        )
        record = closed_record(raw, f"{self._backend.name} {self._backend.endpoint}")
        if record is not None:
            raise RendezvousClosedError(f"rendezvous '{self._run_id}' is closed ({record.reason})")

    def current_round(self) -> int:
        """The store's current round (created at 0 by the job's first arrival)."""
        (raw,) = self._backend.get_unwaited([keys.ROUND])
        if raw is None:
            raw, _ = self._backend.compare_set(keys.ROUND, None, b"0")
        return decode_int(keys.ROUND, raw)

    def _arrive(self, r: int, *, forming: bool = False) -> int:
        """Take an arrival index in round ``r`` and write this node's record under it.

        In a forming round, once: an attempt retried after the store stopped answering keeps
        the index it took (a second one would put this node twice in the round). At the door of
        a sealed round, always a fresh one: the members count it as a node waiting.
        """
        if forming and self._arrived is not None and self._arrived[0] == r:
            index = self._arrived[1]
        else:
            index = self._backend.add(keys.arrivals(r), 1) - 1
            self._arrived = (r, index)
        self._backend.set(keys.node(r, index), encode(self._record()))
        return index

    def _arrivals_of(self, r: int) -> int:
        raw = self._backend.get(keys.arrivals(r))
        return decode_int(keys.arrivals(r), raw) if raw is not None else 0

    def _timeout_error(self, present: int) -> RendezvousTimeoutError:
        rs = self._round
        needed = rs.min_nodes if rs.min_nodes == rs.max_nodes else f"{rs.min_nodes}..{rs.max_nodes}"
        return RendezvousTimeoutError(
            f"rendezvous '{self._run_id}' timed out after {self._settings.join_timeout_s:g} s "
            f"with {present} of {needed} nodes ({self._backend.name} {self._backend.endpoint})"
        )

    def _wait_at_door(
        self, r: int, seal: SealRecord, deadline: float, index: int | None = None
    ) -> None:
        """Be counted as waiting on round r; return once round r ended (or was ended by us).

        Args:
            index: this node's arrival index in round r when it arrived already (it came
                too late for the seal); None to arrive now.
        """
        if index is None:
            index = self._arrive(r)
            _bump_epoch_saying(self._backend)  # the members' agents notice a node waiting
        self.last_round = r
        # A round at MAX has no room: this node waits as a spare for as long as the job runs
        # (until a member is lost or leaves), the join timeout does not run out on it.
        spare = seal.admitted_count() >= self._round.max_nodes
        if not spare and self._tell is not None:
            self._tell(r, seal, index, "nodes_waiting")  # the members rejoin now, not at a look
        members = seal.admitted_indices()
        watch_idx = (
            sorted({members[(index + k) % len(members)] for k in range(2)}) if members else []
        )
        node_keys = [keys.node(r, i) for i in watch_idx]
        watched = [
            decode(NodeRecord, k, raw).node_id
            for k, raw in zip(node_keys, self._backend.get_unwaited(node_keys), strict=True)
            if raw is not None
        ]
        beats = proto.Heartbeats(min_reads=self._settings.keep_alive_max_attempt)
        tick = self._settings.keep_alive_interval_s
        while True:
            if self._backend.wait_for([keys.arrivals(r + 1)], tick):
                return
            try:
                self.check_closed(shared=True)
            except RendezvousClosedError:
                # Seen: the store's host, which leaves last, need not wait for this node.
                try:
                    self._backend.add(keys.SPARES_SEEN, 1)
                except RendezvousError:
                    pass
                raise
            if self.current_round() != r:
                return
            now = self._clock()
            if now >= deadline and not spare:
                raise self._timeout_error(self._arrivals_of(r) - seal.sealed_arrivals)
            read = self._backend.read_heartbeats(watched)
            beats = self._with_notices(beats.observe(dict(zip(watched, read, strict=True)), now))
            verdict = proto.judge_watched(watched, beats, now, self._settings.stale_after_s)
            if isinstance(verdict, proto.MemberLost):
                why = LostRecord(r, "member_lost", verdict.node_ids, self._node_id)
                if end_round(self._backend, r, why) and self._tell is not None:
                    self._tell(r, seal, index, "member_lost")  # first: the members are told
                return

    def _join_round(self, r: int, deadline: float) -> Membership | None:
        """Arrive in the forming round r and block until it is sealed.

        Returns:
            The membership, or None when this node was left out (it then waits at the door).
        """
        index = self._arrive(r, forming=True)
        coordinator = Coordinator(
            self._backend,
            self._node_id,
            r,
            index,
            self._settings,
            self._round,
            self._seed_beats(),
            self._with_notices,
            self._clock(),
        )
        if index == 0 or index + 1 == self._round.max_nodes:
            # The first arrival decides now (a re-forming round whose other nodes are all known
            # lost completes at once); the arrival that brings the count to max seals at once
            # if the protocol finds the max arrivals alive.
            coordinator.step(self._clock(), coordinate=index + 1 == self._round.max_nodes)
        seal_key = keys.seal(r)
        while True:
            now = self._clock()
            wait_s = coordinator.next_wait(now)
            if not self._slices_needed():  # nothing to look at before the next look
                wait_s = max(wait_s, min(coordinator.look_in(now), deadline - now))
            else:  # a watcher far from its next look waits longer slices (module docstring)
                cap = _WATCHER_SLICE_INTERVALS * self._settings.keep_alive_interval_s
                wait_s = max(wait_s, min(coordinator.look_in(now), cap, deadline - now))
            if self._backend.wait_for([seal_key], wait_s):
                break
            now = self._clock()
            if not coordinator.is_due(now) and now < deadline:
                if self._is_interrupted():
                    self.check_closed()  # raises
                continue  # a watcher between its looks: no store request
            self.check_closed(shared=True)
            if now >= deadline:
                if self._backend.wait_for([seal_key], 0.001):
                    break  # sealed while this node was slow to look: not a timeout
                raise self._timeout_error(self._arrivals_of(r))
            coordinator.step(now)
            ended = self._clock()
            coordinator.pace(ended - now, ended)  # a slow store: look less often (pace)
        (raw,) = self._backend.get_unwaited([seal_key])  # it exists: the wait returned
        if raw is None:
            raise RendezvousStateError(f"rendezvous key '{seal_key}' vanished after it was written")
        seal = decode(SealRecord, seal_key, raw)
        assign = proto.assignment_for(seal, index)
        if assign is None:
            # Not admitted. Came after the seal's count: already a waiting node. Left out of it
            # (judged gone while slow, or its record came too late): arrive again past the
            # count, so the members see one node waiting and admit it in their next round;
            # the round itself goes on (a slow node costs only its own admission).
            self._wait_at_door(r, seal, deadline, index if index >= seal.sealed_arrivals else None)
            return None
        return Membership(r, index, seal, assign)
