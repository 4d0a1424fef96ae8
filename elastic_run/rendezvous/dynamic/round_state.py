"""What one node knows of the round it is a member of, kept current by its liveness thread.

The agent asks (``RoundState.poll``, no I/O); the liveness thread writes: its ring verdicts
(``apply_verdict``), each tick the safety-net read (``refresh``: the job's epoch counter, one
request, shared by the nodes of one job in one process (``shared_reads.py``); the round, the
closed record, the arrival count and the round's end record only when the epoch moved), and the
look a member's round notice asks for (``look``: the same read of the round's keys at once,
``protocol/round_notice.py``). The poll says how this node learned that its round ended
(``learned_by``): ``notice`` (a member's notice, confirmed by that look), ``look`` (the periodic
read, or a look of its own) or ``verdict`` (this node judged a member lost).

Invariants:
- Every update names the round it is about and is dropped unless that round is the one this
  node is a member of now: an observation about round r never lands on round r+1.
- The state of a round is one frozen record, replaced whole under a lock; flags only ever go
  from unknown to known (over, lost, closed stay set until the next round).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from elastic_run.rendezvous.api import RoundPoll
from elastic_run.rendezvous.backend import RendezvousBackend, closed_record
from elastic_run.rendezvous.dynamic.coordinator import read_lost
from elastic_run.rendezvous.dynamic.rounds import Membership
from elastic_run.rendezvous.dynamic.shared_reads import read_shared
from elastic_run.rendezvous.errors import RendezvousStateError
from elastic_run.rendezvous.protocol import decisions as proto
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import LostRecord, decode, decode_int

__all__ = ["RoundState"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Flags:
    round: int
    sealed_arrivals: int
    members: int
    over: bool = False
    lost: bool = False
    cause: str | None = None
    closed: str | None = None
    waiting: int = 0
    spares: int = 0
    learned_by: str | None = None
    notice_from: str = ""
    notice_at: float | None = None  # epoch seconds
    learned_at: float | None = None  # epoch seconds


class RoundState:
    """One node's view of its current round.

    Args:
        backend: the job's backend.
        run_id: the job id (for messages).
        node_id: this node's id.
        on_change: called (from the liveness thread) when something the agent acts on changed.
        is_notice: whether a node id was seen dead by a death notice (for the log line).
        end_round: ends round ``r`` with the record given (``rounds.end_round`` and the notice
            to the round's members); True when this node's record stands.
        max_nodes: the job's MAX: nodes waiting beyond it are spares, not counted as waiting.
        epoch_max_age_s: the oldest epoch value this node takes from another node of the same
            job in this process instead of reading it (``shared_reads.py``; 0: always read).
        clock: the monotonic clock the age is measured on (None: no sharing).
    """

    def __init__(
        self,
        backend: RendezvousBackend,
        run_id: str,
        node_id: str,
        on_change: Callable[[], None],
        is_notice: Callable[[str], bool],
        end_round: Callable[[int, LostRecord], bool],
        max_nodes: int = 1 << 30,
        *,
        epoch_max_age_s: float = 0.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._backend = backend
        self._epoch_max_age_s = epoch_max_age_s if clock is not None else 0.0
        self._now = clock or (lambda: 0.0)
        self._end_round = end_round
        self._max_nodes = max_nodes
        self._run_id = run_id
        self._node_id = node_id
        self._on_change = on_change
        self._is_notice = is_notice
        self._lock = threading.Lock()
        self._flags: _Flags | None = None
        self._epoch_seen: tuple[int | None, int] = (-1, -1)
        self._epoch_garbled = False

    def begin(self, member: Membership | None) -> None:
        """This node is now a member of ``member.round`` (None: between rounds)."""
        with self._lock:
            self._flags = (
                _Flags(member.round, member.seal.sealed_arrivals, member.seal.admitted_count())
                if member is not None
                else None
            )

    def is_member(self, r: int) -> bool:
        """Whether this node is a member of round ``r`` and has not seen it end."""
        flags = self._flags
        return flags is not None and flags.round == r and not (flags.over or flags.lost)

    def poll(self) -> RoundPoll:
        """What this node knows of its round now (no I/O)."""
        flags = self._flags
        if flags is None:
            return RoundPoll()
        return RoundPoll(
            closed=flags.closed,
            round_over=flags.over or flags.lost,
            member_lost=flags.lost,
            nodes_waiting=flags.waiting,
            end_cause=flags.cause,
            spares=flags.spares,
            learned_by=flags.learned_by,
            notice_from=flags.notice_from,
            notice_at=flags.notice_at,
            learned_at=flags.learned_at,
        )

    def refresh(self) -> None:
        """The safety-net read: the epoch; the round's keys when it moved (liveness thread)."""
        flags = self._flags
        if flags is None:
            return
        r = flags.round
        try:
            backend = self._backend
            epoch: int | None = read_shared(
                (backend.name, backend.endpoint, self._run_id, keys.EPOCH),
                lambda: backend.read_counter(keys.EPOCH),
                self._epoch_max_age_s,
                self._now,
            )
        except RendezvousStateError as exc:
            # Not a counter (forged): read the round's keys on every tick until it is one
            # again (a close or a round's end replaces it), never skip them.
            if not self._epoch_garbled:
                log.warning(
                    "rendezvous '%s': %s; reading the round's keys each tick", self._run_id, exc
                )
            self._epoch_garbled, epoch = True, None
        else:
            self._epoch_garbled = False
        if epoch is not None and (epoch, r) == self._epoch_seen:
            return
        self._read(flags, "look")
        self._epoch_seen = (epoch, r)

    def read_now(self) -> None:
        """Read the round's keys now (one read), whatever the epoch says: the store's host reads
        them before it leaves, since a close it wrote itself and the spares that came since its
        last read are not in its flags until the next tick."""
        flags = self._flags
        if flags is None or flags.over:
            return
        self._read(flags, "look")

    def look(self, notice_from: str, notice_at: float | None = None, cause: str = "") -> None:
        """Read the round's keys now, as a member's notice asks (liveness thread; one read).

        What the read finds is applied as the periodic read would apply it; a round found over
        is marked learned by ``notice`` from ``notice_from`` (which arrived at ``notice_at``,
        epoch seconds). Nothing happens when the round goes on: the notice alone changes nothing.
        A notice of a round's end (any ``cause`` but a close or nodes waiting) reads the round's
        end record and the round first (two requests, not four): when both say it ended, that is
        all the look needs; the periodic read still reads the rest.
        """
        flags = self._flags
        if flags is None or flags.over:
            return
        if cause not in ("closed", "nodes_waiting") and self._ended(flags, notice_from, notice_at):
            return
        if not self._read(flags, "notice", notice_from, notice_at):
            log.debug(
                "rendezvous '%s': looked after a round notice from %s: round %d goes on",
                self._run_id,
                notice_from[:80],
                flags.round,
            )

    def _ended(self, flags: _Flags, notice_from: str, notice_at: float | None) -> bool:
        """Whether round ``flags.round`` has its end record and the job's round moved past it
        (then marked over, learned by ``notice``); False: not known from these two keys."""
        r = flags.round
        # The end record is written before the round advances: read first, it says why.
        raw_lost, raw_round = self._backend.get_unwaited([keys.lost(r), keys.ROUND])
        if raw_lost is None or raw_round is None or decode_int(keys.ROUND, raw_round) == r:
            return False
        why = decode(LostRecord, keys.lost(r), raw_lost)
        self._set_over(
            r,
            lost=why.reason == "member_lost",
            cause=why.reason,
            learned_by="notice",
            notice_from=notice_from,
            notice_at=notice_at,
        )
        self._on_change()
        return True

    def _read(
        self, flags: _Flags, learned_by: str, notice_from: str = "", notice_at: float | None = None
    ) -> bool:
        """One read of round ``flags.round``'s keys (the round, closed, arrivals, its end);
        return whether it found news (the round over, the job closed, more nodes waiting)."""
        r = flags.round
        raw_round, raw_closed, raw_arrivals, raw_lost = self._backend.get_unwaited(
            [keys.ROUND, keys.CLOSED, keys.arrivals(r), keys.lost(r)]
        )
        # Never raises: a value under `closed` that is not a record must not blind this read
        # to the round and the door; it reads as open until a close replaces it.
        closed = closed_record(raw_closed, f"{self._backend.name} {self._backend.endpoint}")
        arrivals = decode_int(keys.arrivals(r), raw_arrivals) if raw_arrivals is not None else 0
        waiting = proto.waiting_with_room(
            arrivals, flags.sealed_arrivals, flags.members, self._max_nodes
        )
        changed = self._update(
            r,
            closed=closed.reason if closed is not None else None,
            waiting=waiting,
            spares=max(0, arrivals - flags.sealed_arrivals - waiting),
            learned_by=learned_by,
            notice_from=notice_from,
            notice_at=notice_at,
        )
        if raw_round is not None and decode_int(keys.ROUND, raw_round) != r:
            # The end record is written before the round advances: read after it, it is there.
            why = decode(LostRecord, keys.lost(r), raw_lost) if raw_lost is not None else None
            self._set_over(
                r,
                lost=why is not None and why.reason == "member_lost",
                cause=why.reason if why is not None else None,
                learned_by=learned_by,
                notice_from=notice_from,
                notice_at=notice_at,
            )
            changed = True
        if changed:
            self._on_change()
        return changed

    def apply_verdict(self, r: int, verdict: proto.RingVerdict) -> None:
        """The liveness thread's verdict about round ``r``; dropped unless ``r`` is current."""
        if not self.is_member(r):
            return
        if isinstance(verdict, proto.MemberLost):
            successor = verdict.node_ids[0] if verdict.node_ids else "?"
            log.warning(
                "rendezvous '%s': member %s is gone (%s); ending round %d",
                self._run_id,
                successor,
                "its agent ended" if self._is_notice(successor) else "it stopped heartbeating",
                r,
            )
            why = LostRecord(r, "member_lost", verdict.node_ids, self._node_id)
            self._end_round(r, why)
            self._set_over(r, lost=True, cause="member_lost", learned_by="verdict")
        elif isinstance(verdict, proto.RoundEnded):
            self.note_round_end(r)
        else:
            return
        self._on_change()

    def note_round_end(self, r: int) -> None:
        """Mark round r over; a member lost (by whoever saw it) counts as lost here too."""
        self.note_end_record(r, read_lost(self._backend, r))

    def note_end_record(self, r: int, why: LostRecord | None) -> None:
        """Mark round r over with its end record ``why``, already read (None: not known)."""
        cause = why.reason if why is not None else None
        self._set_over(r, lost=cause == "member_lost", cause=cause, learned_by="look")

    def _set_over(
        self,
        r: int,
        *,
        lost: bool,
        cause: str | None,
        learned_by: str,
        notice_from: str = "",
        notice_at: float | None = None,
    ) -> None:
        with self._lock:
            flags = self._flags
            if flags is not None and flags.round == r:
                first = flags.learned_by is None
                self._flags = replace(
                    flags,
                    over=True,
                    lost=flags.lost or lost,
                    cause=flags.cause or cause,
                    learned_by=learned_by if first else flags.learned_by,
                    notice_from=notice_from if first else flags.notice_from,
                    notice_at=notice_at if first else flags.notice_at,
                    learned_at=time.time() if first else flags.learned_at,
                )

    def _update(
        self,
        r: int,
        *,
        closed: str | None,
        waiting: int,
        spares: int = 0,
        learned_by: str = "look",
        notice_from: str = "",
        notice_at: float | None = None,
    ) -> bool:
        """Record what a read saw of round ``r``; return whether it is news (the job closed, or
        more nodes wait). News that ends the round is marked with how it was learned."""
        with self._lock:
            flags = self._flags
            if flags is None or flags.round != r:
                return False
            new = replace(flags, closed=flags.closed or closed, waiting=waiting, spares=spares)
            news = new.closed != flags.closed or waiting > flags.waiting
            if news and flags.learned_by is None:
                new = replace(
                    new,
                    learned_by=learned_by,
                    notice_from=notice_from,
                    notice_at=notice_at,
                    learned_at=time.time(),
                )
            self._flags = new
            return news
