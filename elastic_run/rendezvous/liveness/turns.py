"""One node's liveness turns: bump its own heartbeat, watch its ring successor, report verdicts.

Every ``keep_alive_interval`` (or at once when poked, e.g. by a death notice) one turn, run by
the process's liveness workers (``pool.py``: one thread for an agent's one node, at
most ``MAX_WORKERS`` for a process holding many), does:

1. bumps this node's heartbeat counter (one O(1) write that the store answers: a write sent
   and forgotten would "succeed" while the node is cut off) and records when that last
   succeeded, or the error when it failed. The agent reads that record (``report()``, no
   I/O) and stops its workers once this node's own heartbeat has failed for the budget after which its peers
   judge it gone: a node that cannot heartbeat knows it, whatever its peers decide;
2. reads its ring successor's heartbeat (one read) and asks the protocol for a verdict (in the
   first turn of a round it first reads that successor's record: the join does not, so a
   process's nodes that one seal woke read theirs in one request of their next batch; an
   agent's one node takes that turn at once)
   (``protocol.judge_ring``: the successor is gone; a round that ended elsewhere is seen by
   the epoch read of step 4);
3. hands the verdict to ``on_verdict(round, verdict)``, tagged with the round it is about, so a
   verdict on round r can never be applied to round r+1 (the handler drops stale ones);
4. calls ``refresh()``: the handler's safety-net read (one epoch counter; the round's keys only
   when it moved), so the agent's loop itself never waits on the store.

A member's round notice asks for a look at once (``look_now``): the next turn, run at once, calls
``look()`` (the handler's one read of the round's keys) and, unless a full turn is due by now,
nothing else, and the full turn stays at its time: a flood of notices costs one read per turn
it wakes (notices that come while one runs wake one more, not one each) and never moves the
heartbeat.

Nodes of one job on one store in one process (a benchmark, a test: ``beat_batch_key``) take
their full turns together when they fall within half an interval of each other (``pool.py``):
one ``heartbeat_many`` for all of them, one read of all their successors' beats, then each
node's verdict and read as above. An agent's one node turns alone, as described.

Between rounds it keeps watching the last successor, so the next round's coordinator judges a
successor that died meanwhile from when it died, not from when the next round began.

Invariants: a node's turns never overlap, ``stop()`` is bounded; nothing here decides
(``protocol/decisions.py`` does) or raises into the caller (errors are recorded and reported).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from elastic_run.rendezvous.api import LivenessReport
from elastic_run.rendezvous.backend import RendezvousBackend, closed_record
from elastic_run.rendezvous.errors import RendezvousError
from elastic_run.rendezvous.liveness.pool import Turns, liveness_pool
from elastic_run.rendezvous.outage import BACKEND_OUTAGE
from elastic_run.rendezvous.protocol import decisions as proto
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.settings import RendezvousSettings

__all__ = ["LivenessThread", "RingPosition"]

log = logging.getLogger(__name__)

_JOIN_SLACK_S = 5.0
# A batch's read of its successors' beats: node id -> counter (None: gone), and when it was read.
_Seen = tuple[Mapping[str, int | None], float]


@dataclass(frozen=True)
class RingPosition:
    """Where this node stands: its round, and the member it watches ("" when alone).

    ``pending`` is the store key of that member's record while its id is not known yet (a
    round just formed: the turns read it, ``successor`` is "" until then).
    """

    round: int
    successor: str
    is_member: bool
    pending: str = ""


class LivenessThread:
    """The heartbeat and ring-watch thread of one node.

    Args:
        backend: the job's backend.
        node_id: this node's id.
        settings: the timing.
        clock: the monotonic clock.
        position: returns where this node stands now, or None before its first round.
        with_notices: applies this node's death notices to a heartbeat view.
        on_verdict: receives ``(round, verdict)`` for verdicts other than Keep.
        refresh: the handler's per-tick read of what changed around its round.
        look: the handler's read of its round's keys, when a notice asks (``look_now``).
        on_successor: receives ``(round, key, raw record)`` of the member the position's
            ``pending`` key names, once a turn read it (None: the key was absent).
    """

    def __init__(
        self,
        backend: RendezvousBackend,
        node_id: str,
        settings: RendezvousSettings,
        clock: Callable[[], float],
        position: Callable[[], RingPosition | None],
        with_notices: Callable[[proto.Heartbeats], proto.Heartbeats],
        on_verdict: Callable[[int, proto.RingVerdict], None],
        refresh: Callable[[], None],
        look: Callable[[], None] = lambda: None,
        on_successor: Callable[[int, str, bytes | None], None] = lambda _r, _k, _raw: None,
    ) -> None:
        self._backend = backend
        self._on_successor = on_successor
        self._look = look
        self._look_wanted = False
        self._last_full = float("-inf")
        self._node_id = node_id
        self._settings = settings
        self._clock = clock
        self._position = position
        self._with_notices = with_notices
        self._on_verdict = on_verdict
        self._refresh = refresh
        self._lock = threading.Lock()
        self._beat_lock = threading.Lock()
        self._last_ok = clock()
        self._error: str | None = None
        self._successor = ""
        self._beats = proto.Heartbeats(min_reads=settings.keep_alive_max_attempt)
        self._turns: Turns | None = None

    def start(self) -> None:
        """Write the first heartbeat (raising if the store cannot take it), then start.

        Called before each join: when already running, it beats once more now, so that this
        node's key stands when it arrives. After a partition its etcd lease may have expired
        and its key vanished, or have lapsed and be about to: the members of the round it
        joins would judge it gone at their first read, before its next turn wrote the key
        again. ``heartbeat_before_join`` binds the key to a fresh lease then (a failure here is
        left to the turns to report and to the join to meet).

        Raises:
            RendezvousConnectionError: the store cannot be reached (first start only).
        """
        if self._turns is not None:
            try:
                self._beat()
            except RendezvousError as exc:
                log.info("rendezvous heartbeat of %s before joining: %s", self._node_id, exc)
            return
        self._beat()
        self._turns = Turns(
            self._turn,
            self._settings.keep_alive_interval_s,
            group=self._backend.beat_batch_key(),
            batch=LivenessThread._batch_turn,
            owner=self,
        )
        liveness_pool().start(self._turns)

    def poke(self) -> None:
        """Run a turn now rather than at the next interval (a death notice arrived)."""
        if self._turns is not None:
            liveness_pool().poke(self._turns)

    def hurry(self) -> None:
        """Take a full turn now (a round formed: its successor's record is to be read) when
        this node is alone in its group; else at its time, in a batch (``pool.has_peers``)."""
        turns = self._turns
        if turns is not None and not liveness_pool().has_peers(turns):
            liveness_pool().poke(turns)

    def look_now(self) -> None:
        """Have ``look()`` run at once, on this node's turn (a member's round notice came).

        A look asked for and not yet begun covers the notices that come meanwhile: they cost
        no wake-up of their own.
        """
        if self._look_wanted:
            return
        self._look_wanted = True
        self.poke()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop the turns; return whether a running one ended within ``timeout_s``.

        Args:
            timeout_s: the bound (None: one interval and a few seconds of slack).
        """
        turns = self._turns
        if turns is None:
            return True
        bound = self._settings.keep_alive_interval_s + _JOIN_SLACK_S
        return liveness_pool().stop(turns, bound if timeout_s is None else timeout_s)

    def report(self) -> LivenessReport:
        """This node's heartbeat standing (no I/O)."""
        with self._lock:
            last_ok, error = self._last_ok, self._error
        return LivenessReport(
            since_ok_s=max(0.0, self._clock() - last_ok),
            budget_s=self._settings.stale_after_s,
            error=error,
        )

    def successor_beats(self) -> proto.Heartbeats:
        """What this thread has seen of the last successor's heartbeat (seeds a coordinator)."""
        with self._lock:
            return self._beats

    # -- one turn (on a worker of the pool) --------------------------------------------

    def _beat(self) -> None:
        # One beat at a time: a join's beat and a turn's must not both renew an etcd lease.
        with self._beat_lock:
            self._backend.heartbeat_before_join(self._node_id)
        with self._lock:
            self._last_ok = self._clock()

    def _turn(self) -> float | None:
        delay = self._look_first()
        if delay is not None:
            return delay
        self._last_full = self._clock()
        try:
            with self._beat_lock:
                self._backend.heartbeat(self._node_id)
        except RendezvousError as exc:
            self.beat_done(exc)
        else:
            self.beat_done(None)
        self._read_successor()
        self._after_beat(None)
        return None

    @staticmethod
    def _batch_turn(batch: Sequence[Turns]) -> list[Callable[[], float | None]]:
        """The shared part of several nodes' turns (one group, ``Turns.group``): one heartbeat
        write for all of them and one read of all their successors' beats; returns each node's
        rest (its verdict and read), which the pool runs and releases the node after.

        The nodes' backends share a ``beat_batch_key``, so the first one's writes and reads
        stand for all (their own beat locks are not taken: a batched backend's beats are plain
        writes of rising values, no lease). A node a notice asked to look runs its own turn.
        """
        rests: list[Callable[[], float | None]] = [turns.turn for turns in batch]
        full = [
            (index, thread)
            for index, turns in enumerate(batch)
            if (thread := cast(LivenessThread, turns.owner)).begin_batched_turn()
        ]
        if not full:
            return rests
        lead = full[0][1].backend
        error: RendezvousError | None = None
        try:
            lead.heartbeat_many([thread.node_id for _, thread in full])
        except RendezvousError as exc:
            error = exc
        for _, thread in full:
            thread.beat_done(error)
        # The records of the successors of nodes whose round just formed: one read for all.
        pending = [(thread, p) for _, thread in full if (p := thread.pending_successor())]
        if pending:
            wanted_records = sorted({key for _, (_, key) in pending})
            records: Mapping[str, bytes | None] = {}  # a failed read: each tries next turn
            try:
                records = dict(zip(wanted_records, lead.get_many(wanted_records), strict=True))
            except RendezvousError as exc:
                BACKEND_OUTAGE.warn(
                    log, f"rendezvous ring read of {len(pending)} nodes failed", exc
                )
            for thread, (r, key) in pending:
                if key in records:
                    thread._on_successor(r, key, records[key])
        wanted = sorted({s for _, thread in full if (s := thread.successor_now()[1])})
        seen: _Seen | None = None
        try:
            values = lead.read_heartbeats(wanted) if wanted else []
            # Judged as of this read, not as of each node's part: the parts before a node's
            # must not make its successor look staler than it was when read.
            seen = (dict(zip(wanted, values, strict=True)), full[0][1].clock())
        except RendezvousError as exc:
            BACKEND_OUTAGE.warn(log, f"rendezvous ring watch of {len(full)} nodes failed", exc)
        for index, thread in full:
            rests[index] = functools.partial(thread.batched_rest, seen)
        return rests

    # -- what a batch asks of each of its nodes (``_batch_turn``) -----------------------

    @property
    def node_id(self) -> str:
        """This node's id."""
        return self._node_id

    @property
    def backend(self) -> RendezvousBackend:
        """The job's backend."""
        return self._backend

    def clock(self) -> float:
        """The monotonic clock this thread judges by."""
        return self._clock()

    def begin_batched_turn(self) -> bool:
        """Whether this node takes its full turn in the batch (False: a notice's look is
        wanted, and its own ``turn`` runs instead); marks the full turn as begun."""
        if self._look_wanted:
            return False
        self._last_full = self._clock()
        return True

    def pending_successor(self) -> tuple[int, str] | None:
        """The round and store key of the record of the member this node is to watch, while
        unread (None: known, or nobody to watch)."""
        position = self._position()
        if position is None or not position.pending:
            return None
        return position.round, position.pending

    def _read_successor(self) -> None:
        """A lone turn's read of the pending successor record (one request: the seal names
        it); a failed read is retried next turn."""
        pending = self.pending_successor()
        if pending is None:
            return
        r, key = pending
        try:
            (raw,) = self._backend.get_unwaited([key])
        except RendezvousError as exc:
            BACKEND_OUTAGE.warn(log, f"rendezvous ring read of {self._node_id} failed", exc)
            return
        self._on_successor(r, key, raw)

    def batched_rest(self, seen: _Seen | None) -> float | None:
        """This node's part after the batch's beat and read: its verdict (from ``seen``, the
        successors' beats and when they were read; None: the read failed, no verdict) and
        its epoch read."""
        self._after_beat(seen, watch=seen is not None)
        return None

    def _look_first(self) -> float | None:
        """Run the look a notice asked for; the seconds until the full turn is due, or None
        when it is due now (or no look was asked for)."""
        if not self._look_wanted:
            return None
        self._look_wanted = False
        try:
            self._look()
        except RendezvousError as exc:
            log.warning("rendezvous look of %s failed: %s", self._node_id, exc)
        since = self._clock() - self._last_full
        if since < self._settings.keep_alive_interval_s:
            return self._settings.keep_alive_interval_s - since  # the full turn's time
        return None

    def beat_done(self, exc: RendezvousError | None) -> None:
        """Record how this node's heartbeat went (``report()`` reads it)."""
        if exc is not None:
            with self._lock:
                first = self._error is None
                self._error = str(exc)
            if first:
                BACKEND_OUTAGE.warn(log, f"rendezvous heartbeat of {self._node_id} failed", exc)
            return
        BACKEND_OUTAGE.over()
        with self._lock:
            if self._error is not None:
                log.warning("rendezvous heartbeat of %s works again", self._node_id)
            self._last_ok, self._error = self._clock(), None

    def _after_beat(self, seen: _Seen | None, *, watch: bool = True) -> None:
        """The ring watch (its successor's beat read, unless ``seen`` has it) and the read."""
        steps: list[tuple[str, Callable[[], None]]] = [("read", self._refresh)]
        if watch:
            steps.insert(0, ("ring watch", lambda: self._watch(seen)))
        for what, step in steps:
            try:
                step()
            except RendezvousError as exc:
                BACKEND_OUTAGE.warn(log, f"rendezvous {what} of {self._node_id} failed", exc)

    def successor_now(self) -> tuple[RingPosition | None, str]:
        """Where this node stands and the member it watches now (the last one between rounds)."""
        position = self._position()
        successor = position.successor if position is not None else self._successor
        if successor != self._successor:
            with self._lock:
                self._successor = successor
                self._beats = proto.Heartbeats(min_reads=self._settings.keep_alive_max_attempt)
        return position, successor

    def _watch(self, seen: _Seen | None = None) -> None:
        position, successor = self.successor_now()
        if not successor:
            return
        if seen is not None and successor in seen[0]:
            beat, now = seen[0][successor], seen[1]
        else:
            (beat,) = self._backend.read_heartbeats([successor])
            now = self._clock()
        with self._lock:
            beats = self._with_notices(self._beats.observe({successor: beat}, now))
            self._beats = beats
        if position is None or not position.is_member:
            return  # between rounds: only watch
        store_round = None  # the epoch read (refresh) sees a round that ended elsewhere

        def judge(closed: bool) -> proto.RingVerdict:
            return proto.judge_ring(
                position.round,
                store_round,
                successor,
                beats,
                now,
                self._settings.stale_after_s,
                closed=closed,
            )

        verdict = judge(closed=False)
        if isinstance(verdict, proto.MemberLost):
            # A finished job loses no one: read the closed record only when it matters.
            raw = self._backend.get(keys.CLOSED)
            where = f"{self._backend.name} {self._backend.endpoint}"
            verdict = judge(closed=closed_record(raw, where) is not None)
        if not isinstance(verdict, proto.Keep):
            self._on_verdict(position.round, verdict)
