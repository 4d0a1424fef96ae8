"""The dynamic rendezvous handler: the O(N) protocol of ``protocol/`` applied to a backend.

The handler owns one node's place in the job: it joins rounds (``next_rendezvous``), waits at
the door of a completed round, ends a round when its workers fail or it re-rendezvouses, and
answers the agent's questions (``AgentRendezvous``). What it delegates, one concept each:

    keys.py           the key schema
    settings.py       --rdzv-conf, parsed once
    decisions.py      every decision (barrier, seal, ring verdicts, ranks), pure
    rounds.py         the blocking joins: arrive, be admitted or wait at the door, end a round
    failure_look.py   before a worker failure counts: is a member lost behind it?
    coordinator.py    the barrier duties of an arrival (reads, asks the protocol, seals)
    turns.py          the heartbeat and ring-watch thread (verdicts tagged with their round)
    peerwatch.py      death notices between agents, in milliseconds
    notice_loop.py    the one select loop (thread) per process serving every death-notice socket
    round_notice.py   a round's end told to its other members at once (checked here, confirmed
                      by one read of the store before anything stops)
    telemetry.py      published agent state and the job's event ring
    status_reader.py  the read-only picture for ``elastic-run status``
    shared_reads.py   the epoch and closed reads shared by a process's nodes of a job

Per round each node does O(1) operations of O(1) size; verdicts apply only to their round.
The node that ends a round (first writer of its end record) also reads the round's member
records once (one O(N) read) to tell each member at once.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast, get_args

from elastic_run.clock import SYSTEM_CLOCK, Clock
from elastic_run.rendezvous.api import (
    AgentRendezvous,
    Assignment,
    LivenessReport,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousSnapshot,
    RendezvousStoreInfo,
    RoundEnd,
    RoundPoll,
)
from elastic_run.rendezvous.backend import RendezvousBackend, closed_record, require_backend
from elastic_run.rendezvous.dynamic.coordinator import read_lost, round_nodes
from elastic_run.rendezvous.dynamic.failure_look import FailureLook
from elastic_run.rendezvous.dynamic.round_state import RoundState
from elastic_run.rendezvous.dynamic.round_tell import tell_round
from elastic_run.rendezvous.dynamic.rounds import Membership, Rounds, bump_epoch, end_round
from elastic_run.rendezvous.dynamic.status_reader import read_snapshot
from elastic_run.rendezvous.dynamic.telemetry import Telemetry
from elastic_run.rendezvous.errors import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousInterruptedError,
    RendezvousStateError,
    RendezvousTimeoutError,
    RendezvousUnreachableError,
)
from elastic_run.rendezvous.liveness.notices import DeathNotices
from elastic_run.rendezvous.liveness.turns import LivenessThread, RingPosition
from elastic_run.rendezvous.outage import BACKEND_OUTAGE
from elastic_run.rendezvous.protocol import decisions as proto
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import (
    ClosedReason,
    ClosedRecord,
    LostReason,
    LostRecord,
    NodeRecord,
    SealRecord,
    decode,
    decode_int,
    encode,
    read_closed,
)
from elastic_run.rendezvous.protocol.round_notice import (
    RoundNotice,
    parse_notice,
    skip_reason,
)
from elastic_run.rendezvous.settings import (
    DEFAULT_KEEP_ALIVE_INTERVAL_S,
    DEFAULT_KEEP_ALIVE_MAX_ATTEMPT,
    RendezvousSettings,
    RendezvousTimeout,
    check_nnodes,
)

if TYPE_CHECKING:
    from torch.distributed import Store

# How long the store's host of a closed job waits for its spares to read the close.
_SPARES_WAIT_S = 10.0

__all__ = [
    "CloseOutcome",
    "DynamicRendezvousHandler",
    "close_job",
    "closed_reason_of",
    "create_handler",
]

log = logging.getLogger(__name__)

_BOOTSTRAP_SLICE_S = 0.5  # with an interrupt check: one wait for rank 0's address between two


class DynamicRendezvousHandler(RendezvousHandler):
    """A rendezvous handler running the O(N) protocol on any ``RendezvousBackend``.

    Args:
        run_id: the job id.
        backend: the store the protocol runs on.
        min_nodes: the fewest nodes a round completes with.
        max_nodes: the most nodes a round admits.
        local_addr: the address this node advertises (default: its FQDN).
        settings: the timing.
        clock: the clock every timed wait and decision is measured on (a test passes a
            ``FakeClock``).
        death_notices: whether this node listens for and watches death notices (sockets; see
            ``liveness/notices.py``). False: heartbeats alone judge, and the node opens no
            socket (a logic test on the in-memory backend).
    """

    def __init__(
        self,
        run_id: str,
        backend: RendezvousBackend,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None = None,
        settings: RendezvousSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
        *,
        death_notices: bool = True,
    ) -> None:
        backend = require_backend(backend)  # a torch-style get_state/set_state one: TypeError
        check_nnodes(min_nodes, max_nodes, "min_nodes:max_nodes")  # ValueError, as torch's
        self._run_id = run_id
        self._backend = backend
        self._settings = settings or RendezvousSettings()
        self._round_settings = proto.RoundSettings(
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            last_call_timeout_s=self._settings.last_call_timeout_s,
            stale_after_s=self._settings.stale_after_s,
        )
        self._clock = clock
        self._host = socket.gethostname()
        self._addr = local_addr or socket.getfqdn()
        self.node_id = f"{self._host}-{os.getpid()}-{secrets.token_hex(4)}"
        self._local_world_size = 1
        self._role = "default"
        self._avoid_rank = -1
        self._links_untimed = 0
        self._lock = threading.Lock()
        self._member: Membership | None = None
        self._successor: _Successor | None = None  # the record of the member this one watches
        self._bad_successor = ""  # the key of a successor record found unreadable (said once)
        self._notices = DeathNotices(
            run_id,
            self.node_id,
            self._addr,
            lambda _: self._liveness.poke(),
            self._on_notice_line,
        )
        self._notice_from = ""  # the sender of the last notice that asked for a look
        self._notice_at: float | None = None  # when it came (epoch seconds)
        self._notice_cause = ""  # what it said (which keys the look reads first)
        self._notices_said: set[str] = set()  # the kinds of dropped notices logged already
        self._state = RoundState(
            backend,
            run_id,
            self.node_id,
            self._notify_change,
            lambda n: n in self._notices.closed_peers,
            self._end_current_round,
            max_nodes,
            # A fake clock is a logic test's: every node reads for itself there.
            epoch_max_age_s=self._settings.keep_alive_interval_s / 2,
            clock=clock if clock is SYSTEM_CLOCK else None,
        )
        self._shut_down = False
        self._death_notices = death_notices
        self._changed = threading.Condition()  # notified on a round state change, at shutdown
        self._telemetry = Telemetry(backend, run_id, self.node_id, self._host)
        self._liveness = LivenessThread(
            backend,
            self.node_id,
            self._settings,
            clock,
            self._ring_position,
            self._with_notices,
            self._state.apply_verdict,
            self._state.refresh,
            lambda: self._state.look(self._notice_from, self._notice_at, self._notice_cause),
            self._on_successor,
        )
        self._on_change: Callable[[], None] | None = None
        self._is_interrupted: Callable[[], bool] | None = None
        self._rounds = Rounds(
            backend,
            run_id,
            self.node_id,
            self._settings,
            self._round_settings,
            clock,
            self._my_record,
            lambda: self._is_interrupted is not None and self._is_interrupted(),
            self._liveness.successor_beats,
            self._with_notices,
            lambda: self._is_interrupted is not None,
            self._tell_round,
        )
        self._look = FailureLook(
            backend,
            run_id,
            self.node_id,
            self._settings,
            clock,
            self._state,
            self._notices.apply,
            lambda: self._is_interrupted is not None and self._is_interrupted(),
            self._changed,
            lambda: self._shut_down,
            self._end_current_round,
        )

    # -- construction, as torch's -------------------------------------------------

    @classmethod
    def from_backend(
        cls,
        run_id: str,
        store: Any,
        backend: RendezvousBackend,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None = None,
        timeout: RendezvousTimeout | None = None,
        keep_alive_interval: float = DEFAULT_KEEP_ALIVE_INTERVAL_S,
        keep_alive_max_attempt: int = DEFAULT_KEEP_ALIVE_MAX_ATTEMPT,
    ) -> DynamicRendezvousHandler:
        """Build a handler as torch's ``from_backend`` does (``store`` is kept for shape only).

        Args:
            timeout: the join, last call, close and heartbeat timeouts (None: the defaults).
            keep_alive_interval: seconds between heartbeats (torch's default is 5; ours 1, as
                on every other path: ``settings.CONF_TABLE``).
            keep_alive_max_attempt: intervals without a heartbeat before a node is gone
                (torch's default is 3; ours 5, as on every other path).

        Raises:
            ConfigurationError: a node count or a keep-alive value is out of its bounds
                (``settings.CONF_TABLE``, ``settings.check_nnodes``; a ``ValueError``).
            ConfigurationTypeError: a keep-alive value of the wrong type (a bool, a str, a
                float for the attempts; also a ``TypeError``).
            TypeError: ``backend`` is not a ``RendezvousBackend`` (e.g. torch-style).
        """
        settings = RendezvousSettings.from_timeout(
            timeout, keep_alive_interval, keep_alive_max_attempt
        )
        return cls(run_id, backend, min_nodes, max_nodes, local_addr, settings)

    # -- what the agent tells us --------------------------------------------------

    def set_local_info(self, local_world_size: int, role: str = "default") -> None:
        """Tell the handler how many workers this node runs and their role (before joining)."""
        self._local_world_size = local_world_size
        self._role = role

    def set_change_callback(self, callback: Callable[[], None] | None) -> None:
        """Have ``callback`` called (from a rendezvous thread) when this node's round ends.

        The agent passes its loop's wake-up, so it reacts to a lost member at once rather
        than at its next poll. The callback must be quick and must not raise.

        Setting one says that our agent follows the rounds: it hosts its workers' store itself
        and says where through the round's store (``agent/loop/ranks.py``), so
        ``next_rendezvous`` then leaves ``bootstrap_store_info`` None instead of agreeing on a
        port that nothing would host.
        """
        self._on_change = callback

    def set_interrupt(self, is_interrupted: Callable[[], bool] | None) -> None:
        """Make ``next_rendezvous`` give up with RendezvousInterruptedError once this is True.

        Checked between the slices of every blocking wait (at most two ``keep_alive_interval``s,
        see ``rounds.py``).
        """
        self._is_interrupted = is_interrupted

    # -- what the agent reads ------------------------------------------------------

    @property
    def settings(self) -> RendezvousSettings:
        """The timing in force."""
        return self._settings

    @property
    def backend(self) -> RendezvousBackend:
        """The backend the protocol runs on."""
        return self._backend

    @property
    def endpoint(self) -> str:
        """Where the backend is, for messages."""
        return self._backend.endpoint

    @property
    def advertised_addr(self) -> str:
        """The address this node advertises (``--local-addr`` or its FQDN)."""
        return self._addr

    @property
    def is_hosting(self) -> bool:
        """Whether this process hosts the store (it must leave the job last)."""
        return self._backend.is_hosting

    @property
    def assignment(self) -> Assignment | None:
        """This node's place in its current round (worker rank offsets), or None."""
        member = self._member
        return member.assign if member is not None else None

    @property
    def round(self) -> int | None:
        """This node's current round, or None before the first."""
        member = self._member
        return member.round if member is not None else None

    @property
    def successor_watch(self) -> str:
        """What the death-notice watch on this node's ring successor is doing, for people.

        ``watching <node id>``, ``no verdict <node id>: <why>``, ``dead <node id>``, ``idle``.
        """
        return self._notices.state

    def closed_peers(self) -> frozenset[str]:
        """The node ids whose agents this node saw end (see ``peerwatch.py``). No I/O."""
        return self._notices.closed_peers

    def liveness(self) -> LivenessReport:
        """This node's own heartbeat standing (no I/O)."""
        return self._liveness.report()

    def poll(self) -> RoundPoll:
        """What this node knows of its round now (no I/O; see ``round_state.py``).

        The liveness thread keeps it current: each tick it reads the job's epoch counter (one
        request) and, when it moved, the round, the closed record and the arrival count; its
        verdicts and the death notices update it at once. A change wakes the agent through the
        change callback.
        """
        return self._state.poll()

    def others_alive(self) -> int:
        """How many other nodes could still form a round with this one's job (a few store reads).

        The nodes of this node's round and of the round before it (members, and those at its
        door), counted when their heartbeat key stands (not dropped by a clean leave, not
        expired): a round may form while some members of the one before still stop their
        workers, and they rejoin. A node that died without dropping its key on c10d counts until
        its key is judged; the others then find out at their join timeout.

        Raises:
            RendezvousError: the store failed.
        """
        member = self._member
        if member is None:
            return 0
        r = member.round
        ids = round_nodes(self._backend, r) | (
            round_nodes(self._backend, r - 1) if r > 0 else set()
        )
        ids.discard(self.node_id)
        beats = self._backend.read_heartbeats(sorted(ids)) if ids else []
        return sum(1 for beat in beats if beat is not None)

    def round_end(self) -> RoundEnd | None:
        """Who ended this node's round and why (one store read), or None while it runs."""
        member = self._member
        if member is None:
            return None
        record = read_lost(self._backend, member.round)
        if record is None:
            return None
        return RoundEnd(cause=record.reason, ended_by=record.by, lost=record.node_ids)

    def report_failure(self, last_restart: bool = False) -> bool:
        """End the current round because this node's workers failed.

        Before the failure counts, the round's members are looked at: when one of them is lost
        (its agent died: its workers' peers fail in their collectives at once, often before
        any watcher has judged it), the round ends for that member instead and the failure
        does not count, neither as a restart nor, on the last one, as the end of the job. A
        failure while every member greets counts at once. See ``failure_look.py``. A store
        error while looking is logged and the failure counts, as before.

        Args:
            last_restart: the failure would end the job if it counted (this node's restarts
                are used up): in a round too large to ask every member, the look then waits
                for a verdict anyway; with restarts left such a failure counts at once.

        Returns:
            True when this node ended the round first (its failure is the cause and
            counts against its restarts), False when the round had already ended.
        """
        member = self._member
        if member is None:
            return True
        try:
            if self._look.member_lost(member, blind=last_restart):
                return False
        except (RendezvousError, OSError, ValueError) as exc:
            log.warning(
                "rendezvous '%s': could not look at round %d's members before counting "
                "a failure: %s",
                self._run_id,
                member.round,
                exc,
            )
        return self._end_round(member, LostRecord(member.round, "worker_failure", (), self.node_id))

    def leave_round(self, reason: str) -> None:
        """End this node's round for ``reason`` (first writer wins), before re-rendezvousing.

        Raises:
            ValueError: ``reason`` is not a LostReason.
        """
        if reason not in get_args(LostReason):
            raise ValueError(f"leave_round: {reason!r} is not one of {get_args(LostReason)}")
        member = self._member
        if member is None:
            return
        why = LostRecord(member.round, cast(LostReason, reason), (), self.node_id)
        self._end_round(member, why)

    def publish_state(self, state: str, restarts: int, message: str = "") -> None:
        """Publish this agent's state for ``elastic-run status`` (best-effort)."""
        member = self._member
        self._telemetry.publish_state(
            state,
            restarts,
            member.round if member is not None else self._rounds.last_round,
            message,
        )

    def publish_event(
        self, kind: str, message: str, fields: Mapping[str, Any] | None = None
    ) -> None:
        """Publish an event into the job's ring of the last 64 (best-effort)."""
        self._telemetry.publish_event(kind, message, fields)

    def telemetry(self) -> Telemetry:
        """This node's telemetry writer and reader on the job's backend."""
        return self._telemetry

    def check_reachable(self, timeout_s: float) -> None:
        """Raise ``RendezvousConnectionError`` unless the backend answers a read in time."""
        self._backend.check_reachable(timeout_s)

    def release(self) -> None:
        """Close the backend's connections (after ``shutdown``; a hosted store goes too)."""
        self._backend.close()

    def snapshot(self) -> RendezvousSnapshot | None:
        """A read-only picture of the rendezvous (see ``status_reader.read_snapshot``)."""
        return read_snapshot(
            self._backend,
            self._run_id,
            self._round_settings.min_nodes,
            self._round_settings.max_nodes,
        )

    # -- RendezvousHandler ----------------------------------------------------------

    def get_backend(self) -> str:
        """Return the backend name."""
        return self._backend.name

    def get_run_id(self) -> str:
        """Return the run id."""
        return self._run_id

    @property
    def use_agent_store(self) -> bool:
        """Workers connect to a store their agents host."""
        return True

    def is_closed(self) -> bool:
        """Return whether the job's rendezvous is closed."""
        return self.closed_reason() is not None

    def closed_reason(self) -> ClosedReason | None:
        """Return why the job is closed, or None while it is open."""
        return closed_reason_of(self._backend)

    def set_closed(self, reason: ClosedReason = "closed") -> None:
        """Close the rendezvous: no round forms any more, every node sees it.

        The first valid close wins; closing a closed rendezvous again changes nothing. A
        value under the ``closed`` key that is not a valid record is replaced (a warning
        says what it was).

        Args:
            reason: ``closed`` (by a user), ``succeeded`` or ``failed``.

        Raises:
            RendezvousStateError: ``reason`` is none of those.
            RendezvousConnectionError: the backend cannot be reached.
        """
        outcome = close_job(
            self._backend, reason, self.node_id, self._settings.close_timeout_s, self._clock
        )
        member = self._member
        if outcome.wrote and member is not None:
            self._tell(member, "closed")
        if outcome.replaced is not None:
            log.warning(
                "rendezvous '%s': closed (%s), replacing what the closed key held: %s",
                self._run_id,
                reason,
                outcome.replaced,
            )
        if outcome.replaced_epoch is not None:
            log.warning(
                "rendezvous '%s': closing, replaced what the epoch key held: %s",
                self._run_id,
                outcome.replaced_epoch,
            )

    def num_nodes_waiting(self) -> int:
        """Return how many nodes wait at the door of this node's round that a next round has
        room for (one store trip): nodes beyond MAX wait as spares and are not counted."""
        member = self._member
        if member is None:
            return 0
        (raw,) = self._backend.get_unwaited([keys.arrivals(member.round)])
        arrivals = decode_int(keys.arrivals(member.round), raw) if raw is not None else 0
        return proto.waiting_with_room(
            arrivals,
            member.seal.sealed_arrivals,
            member.seal.admitted_count(),
            self._round_settings.max_nodes,
        )

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and block until it completes. See RendezvousHandler.

        The info's ``bootstrap_store_info`` is torch's: where the round's workers find their
        store, the same on every node, as rank 0 published it in the round's store under
        ``MASTER_ADDR``/``MASTER_PORT`` (``RendezvousStoreInfo.build``: rank 0's advertised
        address and a free port of its host; nothing is hosted there, as with torch's
        ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``). It is None when our agent follows the round
        (it set a change callback): that agent hosts the workers' store itself and says where
        through the round's store (``agent/loop/ranks.py``), and it would take a non-None
        answer for a store already hosted.

        Raises:
            RendezvousInterruptedError: the agent's interrupt check turned true.
            RendezvousConnectionError: the round's store failed while rank 0's address was
                agreed, or holds no valid port.
        """
        self._start_liveness()
        deadline = self._clock() + self._settings.join_timeout_s
        previous = self._member
        with self._lock:
            self._member = None
        self._state.begin(None)
        if previous is not None:
            self._end_before_rejoin(previous)
        member = self._rounds.join(deadline)
        with self._lock:
            self._member = member
            self._avoid_rank = -1  # the wish was for this round
        if member.assign.successor_index < 0:
            self._notices.watch(None)  # alone: nobody to watch
        else:
            # Its successor's record is read by the liveness turn, not here: an agent's node
            # takes that turn at once (hurried), a process holding many nodes reads all of
            # theirs in one request of their next batch, not one each on the seal's wake.
            self._liveness.hurry()
        self._state.begin(member)
        store = self._backend.round_store(keys.shared_prefix(member.round))
        bootstrap = None
        if self._on_change is None:
            bootstrap = self._bootstrap(member.assign.rank, store, deadline)
        return RendezvousInfo(
            store=store,
            rank=member.assign.rank,
            world_size=member.assign.world_size,
            bootstrap_store_info=bootstrap,
            round=member.round,
        )

    def _bootstrap(self, rank: int, store: Store, deadline: float) -> RendezvousStoreInfo:
        """torch's agreement on the workers' store address (``RendezvousStoreInfo.build``).

        A rank other than 0 blocks on the store's wait for rank 0's keys, so rank 0's write
        wakes it. Without an interrupt check that is one wait, up to the join deadline: nothing
        needs looking at meanwhile. With one, the wait is sliced (``_BOOTSTRAP_SLICE_S``) and the
        check looked at between slices. Each slice that runs out costs the store a wait, its
        cancel and a check: 0.5 s slices of every rank but 0 were most of the store's work at
        4,096 nodes, and held up rank 0's own requests behind them (issue 38).

        Raises:
            RendezvousTimeoutError: rank 0 did not publish before the join deadline.
            RendezvousInterruptedError: the interrupt check turned true.
            RendezvousConnectionError: the round's store failed, or holds no valid port.
        """
        wanted = [RendezvousStoreInfo.MASTER_ADDR_KEY, RendezvousStoreInfo.MASTER_PORT_KEY]
        while rank != 0:
            interrupted = self._is_interrupted
            if interrupted is not None and interrupted():
                raise RendezvousInterruptedError(
                    "interrupted while waiting for rank 0's workers' store address"
                )
            left = deadline - self._clock()
            if left <= 0:
                raise RendezvousTimeoutError(
                    "rank 0 did not publish the workers' store address before the join "
                    f"timeout ({self._settings.join_timeout_s:g} s)"
                )
            if interrupted is not None:
                left = min(_BOOTSTRAP_SLICE_S, left)
            try:
                store.wait(wanted, timedelta(seconds=left))
                break  # woken by rank 0's write (or it had written already)
            except RuntimeError:
                if _holds(store, wanted):  # a store that failed raises here
                    break
        return RendezvousStoreInfo.build(rank, store, self._addr)

    def shutdown(self) -> bool:
        """Leave without closing the job: stop heartbeating and drop this node's liveness key.

        Idempotent: a second call does nothing and returns True.

        Returns:
            True when this node's liveness key was dropped (or already was), False when
            the backend could not be reached (a warning is logged).
        """
        with self._lock:
            if self._shut_down:
                return True
            self._shut_down = True
        self._wait_for_spares()
        with self._changed:
            self._changed.notify_all()
        # torch's close_timeout: the time within which shutdown() completes.
        if not self._liveness.stop(self._settings.close_timeout_s):
            log.warning(
                "the rendezvous liveness turn did not end within close_timeout (%g s)",
                self._settings.close_timeout_s,
            )
        self._notices.close()
        try:
            self._backend.forget_node(self.node_id)
        except RendezvousError as exc:
            BACKEND_OUTAGE.warn(log, "could not drop this node's heartbeat", exc)
            return False
        return True

    def _wait_for_spares(self, timeout_s: float = _SPARES_WAIT_S) -> None:
        """The store's host of a closed job waits (``timeout_s`` at most) until the spares
        waiting at the door have read the close: its leaving would take the store with it,
        and a spare would report an unreachable store instead of the job's end."""
        if not self._backend.is_hosting:
            return
        try:
            # This node's flags lag the store by up to a tick: the close it just wrote itself
            # (a job that succeeded) and the spares that came since its last read are read now.
            self._state.read_now()
        except RendezvousError as exc:
            BACKEND_OUTAGE.warn(log, f"rendezvous '{self._run_id}': looking for spares", exc)
            return
        poll = self._state.poll()
        if poll.closed is None or poll.spares <= 0:
            return
        deadline = self._clock() + timeout_s
        pause = threading.Event()  # never set: a bounded pause between two reads
        try:
            while self._backend.add(keys.SPARES_SEEN, 0) < poll.spares:
                if self._clock() >= deadline:
                    log.warning(
                        "rendezvous '%s': %d spare(s) did not read the job's end in %.0f s",
                        self._run_id,
                        poll.spares,
                        timeout_s,
                    )
                    return
                pause.wait(0.1)
        except RendezvousError as exc:
            BACKEND_OUTAGE.warn(log, f"rendezvous '{self._run_id}': waiting for the spares", exc)

    def _my_record(self) -> NodeRecord:
        return NodeRecord(
            node_id=self.node_id,
            addr=self._addr,
            host=self._host,
            pid=os.getpid(),
            local_world_size=self._local_world_size,
            role=self._role,
            prev_round=self._rounds.last_round,
            alive_port=self._notices.port,
            min_nodes=self._round_settings.min_nodes,
            max_nodes=self._round_settings.max_nodes,
            prev_rank=self._rounds.last_rank,
            rank_round=self._rounds.rank_round,
            avoid_rank=self._avoid_rank,
            links_untimed=self._links_untimed,
        )

    @property
    def min_nodes(self) -> int:
        """The job's MIN: the fewest nodes a round completes with."""
        return self._round_settings.min_nodes

    def avoid_rank(self, rank: int | None) -> None:
        """Ask not to be given group rank ``rank`` in the next round this node joins (None:
        no wish). The wish lasts one round: the round that completes clears it.

        Args:
            rank: the rank to avoid (the one this node held when it was suspected).
        """
        self._avoid_rank = rank if rank is not None and rank >= 0 else -1

    def note_links_untimed(self, untimed: bool) -> None:
        """Say in this node's next arrivals whether its links are still to be timed: the seal
        counts the members that say so, and every member times the round's links when any
        does (``SealRecord.links_untimed``).

        Args:
            untimed: True while this node takes part in link checks and none of its own
                completed; False once one did (or it takes no part).
        """
        self._links_untimed = 1 if untimed else 0

    # -- a round's end, told to its members ---------------------------------------------

    def _end_round(self, member: Membership, why: LostRecord) -> bool:
        """End ``member``'s round in the store (first writer wins, ``rounds.end_round``); the
        first writer tells the round's other members at once. True when this node's record
        stands."""
        first = end_round(self._backend, member.round, why)
        if first:
            self._tell(member, why.reason)
        return first

    def _end_current_round(self, r: int, why: LostRecord) -> bool:
        """``_end_round`` for round ``r`` (a liveness verdict), told when it is this node's."""
        member = self._member
        if member is not None and member.round == r:
            return self._end_round(member, why)
        return end_round(self._backend, r, why)

    def _end_before_rejoin(self, previous: Membership) -> None:
        """End the round this node leaves to rejoin; a store that does not answer is left to
        the join's retries (the others end the round when they see this node gone)."""
        r = previous.round
        try:
            self._end_round(previous, LostRecord(r, "rejoin", (), self.node_id))
        except RendezvousUnreachableError as exc:
            BACKEND_OUTAGE.warn(log, f"rendezvous '{self._run_id}': could not end round {r}", exc)

    def _tell(self, member: Membership, cause: str) -> None:
        """Tell the other members of ``member``'s round that it ended (or the job closed)."""
        self._tell_round(member.round, member.seal, member.index, cause)

    def _tell_round(self, r: int, seal: SealRecord, index: int, cause: str) -> None:
        """Tell round ``r``'s members (but this node, arrival ``index``: a member's, or a waiting
        node's) that it ended or should end, for ``cause`` (``round_tell.py``). Best-effort,
        after the store holds it: a member not told finds it at its next look."""
        if not self._death_notices:
            return
        sent_all = threading.Event()

        def done(sent: int, missed: list[str]) -> None:
            sent_all.set()
            if missed:
                log.info(
                    "rendezvous '%s': told %d member(s) that round %d ended; not told: %s",
                    self._run_id,
                    sent,
                    r,
                    "; ".join(missed[:4])
                    + (f" (and {len(missed) - 4} more)" if missed[4:] else ""),
                )

        notice = RoundNotice(self._run_id, r, self.node_id, index, cause)
        if tell_round(self._backend, notice, seal, self._notices.tell, done):
            # Waited for, bounded, with the interpreter lock released: the notice loop's thread
            # sends at once instead of at this thread's next switch (5 ms each, several a
            # notice) while this thread goes on with the round's bookkeeping.
            sent_all.wait(_TELL_WAIT_S)

    def _on_notice_line(self, line: bytes) -> bool:
        """A line on this node's death-notice port (the notice loop's thread; quick, no I/O).

        A notice about this node's current round that is news asks for one look at the store
        (on the liveness thread); the store, not the notice, decides. Anything else is dropped
        (its kind logged once); a line that is not a notice drops its client.
        """
        try:
            notice = parse_notice(line)
        except RendezvousStateError as exc:
            self._say_dropped("garbage", f"dropped a client of the death-notice port: {exc}")
            return False
        member = self._member
        poll = self._state.poll()
        skip = skip_reason(
            notice,
            self._run_id,
            self.node_id,
            member.round if member is not None else None,
            member.seal if member is not None else None,
            poll.round_over or poll.closed is not None,
        )
        if skip is not None:
            if skip not in ("known", "no round"):  # a member's notice that came late: no news
                self._say_dropped(
                    skip,
                    f"ignored a round notice from {notice.by[:80]} about round {notice.round} "
                    f"({skip})",
                )
            return True
        self._notice_from, self._notice_at = notice.by, time.time()
        self._notice_cause = notice.cause
        self._liveness.look_now()
        return True

    def _say_dropped(self, kind: str, text: str) -> None:
        """Log a dropped notice: the first of each kind as a warning, the rest at debug."""
        first = kind not in self._notices_said
        self._notices_said.add(kind)
        level = logging.WARNING if first else logging.DEBUG
        suffix = " (more like it are logged at debug level)" if first else ""
        log.log(level, "rendezvous '%s': %s%s", self._run_id, text, suffix)

    # -- liveness -------------------------------------------------------------------------

    def _start_liveness(self) -> None:
        if self._death_notices:
            self._notices.start()
        self._liveness.start()

    def _ring_position(self) -> RingPosition | None:
        member = self._member
        if member is None:
            return None
        is_member = self._state.is_member(member.round)
        index = member.assign.successor_index
        if index < 0:
            return RingPosition(member.round, "", is_member)
        known = self._successor
        if known is not None and known.round == member.round:
            return RingPosition(member.round, known.record.node_id, is_member)
        return RingPosition(member.round, "", is_member, pending=keys.node(member.round, index))

    def _on_successor(self, r: int, key: str, raw: bytes | None) -> None:
        """The liveness turn read the record of round ``r``'s member this node watches: watch
        it from now on (its heartbeat, and its death-notice port)."""
        try:
            if raw is None:
                raise RendezvousStateError(f"rendezvous key '{key}' is missing")
            record = decode(NodeRecord, key, raw)
        except RendezvousStateError as exc:
            if self._bad_successor != key:  # once per round; retried at every turn
                self._bad_successor = key
                log.warning(
                    "rendezvous '%s': cannot watch this node's successor: %s", self._run_id, exc
                )
            return
        with self._lock:
            member = self._member
            if member is None or member.round != r:
                return  # a round that is over by now
            self._successor = _Successor(r, record)
        self._notices.watch(record)

    def _with_notices(self, beats: proto.Heartbeats) -> proto.Heartbeats:
        """``beats`` with this node's death notices applied."""
        return self._notices.apply(beats, self._clock())

    def _notify_change(self) -> None:
        with self._changed:
            self._changed.notify_all()
        callback = self._on_change
        if callback is not None:
            callback()


@dataclass(frozen=True)
class _Successor:
    """The record of the member this node watches in round ``round``."""

    round: int
    record: NodeRecord


_TELL_WAIT_S = 0.1  # the longest a node waits for its round notices to go (then: on their own)


def _conforms(handler: DynamicRendezvousHandler) -> AgentRendezvous:
    return handler  # mypy checks the handler against the agent's contract here


def closed_reason_of(backend: RendezvousBackend) -> ClosedReason | None:
    """Why the job on ``backend`` is closed, or None while it is open (one read).

    A value under the ``closed`` key that is not a valid closed record reads as open (with a
    warning, see ``backend.closed_record``): it closes nothing until a close replaces it.

    Raises:
        RendezvousConnectionError: the backend cannot be reached.
    """
    (raw,) = backend.get_unwaited([keys.CLOSED])
    record = closed_record(raw, f"{backend.name} {backend.endpoint}")
    return record.reason if record is not None else None


@dataclass(frozen=True)
class CloseOutcome:
    """What one close did.

    Attributes:
        reason: why the job is closed now: this close's reason, or the first valid close's.
        wrote: whether this close wrote the record (False: the job was closed already).
        replaced: what was wrong with the value this close replaced under the ``closed`` key
            (not a valid closed record), or None when it replaced nothing.
        replaced_epoch: what the ``epoch`` key held when it was not a counter (replaced, so
            that the members' reads see the close), or None.
        told: how many members of the current round got a notice of the close (``elastic-run
            close``; 0 where nobody was told).
    """

    reason: ClosedReason
    wrote: bool
    replaced: str | None = None
    replaced_epoch: str | None = None
    told: int = 0


_CLOSE_ATTEMPTS = 8  # a value that changed under each one: something keeps writing the key


def _holds(store: Store, wanted: list[str]) -> bool:
    """Whether ``store`` holds every key of ``wanted`` (a store that fails: connection error)."""
    try:
        return bool(store.check(wanted))
    except (RuntimeError, OSError) as exc:
        raise RendezvousConnectionError(
            f"the round's store failed while rank 0's address was awaited: {exc}"
        ) from exc


def close_job(
    backend: RendezvousBackend,
    reason: ClosedReason,
    closed_by: str,
    timeout_s: float | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> CloseOutcome:
    """Close the job's rendezvous on ``backend``: no round forms any more, every node sees it.

    What ``set_closed`` and ``elastic-run close`` do; the first valid close wins. Whatever the
    ``closed`` key holds cannot disable a close: a value that is not a valid closed record is
    replaced, compare-set from the exact bytes read (so a valid close that lands meanwhile
    still wins). The epoch is bumped after (replaced first when it is not a counter), so every
    member reads the record within a tick.

    Args:
        backend: the job's backend.
        reason: ``closed`` (by a user), ``succeeded`` or ``failed``.
        closed_by: who closes it (a node id, or ``elastic-run close@host``).
        timeout_s: torch's close_timeout: no compare-and-set is tried after it (None: no
            bound but the attempts').
        clock: what ``timeout_s`` is measured on.

    Returns:
        What the close did.

    Raises:
        RendezvousStateError: ``reason`` is none of those, or the ``closed`` key changed under
            every attempt (something keeps writing it).
        RendezvousConnectionError: the backend cannot be reached.
    """
    encoded = encode(ClosedRecord(reason, closed_by))
    decode(ClosedRecord, keys.CLOSED, encoded)  # checks the reason like any reader would
    (raw,) = backend.get_unwaited([keys.CLOSED])
    deadline = None if timeout_s is None else clock.now() + timeout_s
    for attempt in range(_CLOSE_ATTEMPTS):
        if attempt and deadline is not None and clock.now() >= deadline:
            break
        record, problem = read_closed(raw)
        if record is not None:
            epoch = bump_epoch(backend)  # a member that missed the close reads it now
            return CloseOutcome(record.reason, False, None, epoch)
        # From exactly what was read (absent, or not a record): a close that landed meanwhile
        # fails the compare and is read on the next attempt.
        _, wrote = backend.compare_set(keys.CLOSED, raw, encoded)
        if wrote:
            epoch = bump_epoch(backend)
            return CloseOutcome(reason, True, problem, epoch)
        (raw,) = backend.get_unwaited([keys.CLOSED])
    raise RendezvousStateError(
        f"could not close rendezvous on {backend.name} {backend.endpoint}: the key "
        f"'{keys.CLOSED}' changed under each attempt"
        + (f" within close_timeout ({timeout_s:g} s)" if timeout_s is not None else "")
        + " (something else keeps writing it)"
    )


def create_handler(
    store: Store | None,
    backend: RendezvousBackend,
    params: RendezvousParameters,
) -> DynamicRendezvousHandler:
    """Build a dynamic handler over ``backend`` from ``params`` (torch's ``create_handler``).

    Args:
        store: kept for torch's signature (the backend carries its own store).
        backend: the backend the protocol runs on.
        params: the rendezvous parameters (``--rdzv-conf`` keys included).

    Raises:
        ConfigurationError: a bad --rdzv-conf value (also a ValueError).
        TypeError: ``backend`` is not a ``RendezvousBackend`` (e.g. torch-style).
    """
    return DynamicRendezvousHandler(
        run_id=params.run_id,
        backend=backend,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        local_addr=params.local_addr,
        settings=RendezvousSettings.from_params(params, require_backend(backend).CONF_KEYS),
    )
