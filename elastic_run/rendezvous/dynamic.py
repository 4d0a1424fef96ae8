"""The dynamic rendezvous handler: the O(N) protocol of ``protocol.py`` applied to a backend.

Keys, relative to the job (the backend adds its prefix and the run id):

    round               the current round r (ASCII digits); advanced by compare-set r -> r+1
    closed              a JSON ClosedRecord once the job is closed (nothing else writes it)
    r<r>/arrivals       atomic counter: each joiner takes arrival index = add(1) - 1
    r<r>/node/<i>       the NodeRecord of arrival i
    r<r>/seal           the SealRecord, written once (compare-set from absent); each member
                        computes its ranks from it alone
    r<r>/lost           why the round ended (LostRecord), written once
    hb/<node id>        each node's heartbeat counter (a lease-bound key on etcd)
    st/<node id>        the agent's published state (JSON, best-effort, for ``status``)
    ev/count, ev/<k>    a ring of the last 64 events: seq = add(ev/count, 1), slot (seq-1) % 64

Per round each node does O(1) operations of O(1) size; the one node that seals reads
the arrivals' records in one batch call.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elastic_run.rendezvous import protocol as proto
from elastic_run.rendezvous.api import (
    MemberSnapshot,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousSnapshot,
)
from elastic_run.rendezvous.backend import RendezvousBackend
from elastic_run.rendezvous.errors import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from elastic_run.rendezvous.peerwatch import AliveListener, PeerWatch
from elastic_run.rendezvous.records import (
    SCHEMA_VERSION,
    LostRecord,
    NodeRecord,
    SealRecord,
    decode,
    decode_heartbeat,
    decode_int,
    encode,
    ranges,
    runs,
)

__all__ = [
    "CLOSED_REASONS",
    "EVENT_RING_SIZE",
    "ClosedRecord",
    "DynamicRendezvousHandler",
    "RendezvousSettings",
    "create_handler",
    "read_snapshot",
]

log = logging.getLogger(__name__)

CLOSED_REASONS = ("closed", "succeeded", "failed")
EVENT_RING_SIZE = 64
SNAPSHOT_EVENTS = 20

_KNOWN_CONF_KEYS = {
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "heartbeat_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
    "read_timeout",
    "is_host",
    "store_type",
    "use_libuv",
    "timeout",
    # etcd
    "protocol",
    "ca_cert",
    "cacert",
    "ssl_cert",
    "cert",
    "ssl_cert_key",
    "key",
    "user",
    "password",
    "key_prefix",
}


@dataclass(frozen=True)
class RendezvousSettings:
    """Timing of the rendezvous, from --rdzv-conf (torch's names, ``_s`` for seconds)."""

    join_timeout_s: float = 600.0
    last_call_timeout_s: float = 30.0
    close_timeout_s: float = 30.0
    heartbeat_timeout_s: float = 5.0
    keep_alive_interval_s: float = 1.0
    keep_alive_max_attempt: int = 3

    @property
    def stale_after_s(self) -> float:
        """How long a heartbeat may stand still before its node is judged gone."""
        return self.keep_alive_interval_s * self.keep_alive_max_attempt

    @classmethod
    def from_params(cls, params: RendezvousParameters) -> RendezvousSettings:
        """Read the timing keys of ``params``; reject keys nobody knows.

        Raises:
            ConfigurationError: an unknown key or a bad value.
        """
        from elastic_run.errors import ConfigurationError

        unknown = sorted(set(params.config) - _KNOWN_CONF_KEYS)
        if unknown:
            raise ConfigurationError(
                f"unknown --rdzv-conf key{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}"
                f" (known: {', '.join(sorted(_KNOWN_CONF_KEYS))})"
            )

        def seconds(key: str, default: float) -> float:
            value = params.get_as_float(key, default)
            assert value is not None
            return value

        attempts = params.get_as_int("keep_alive_max_attempt", 3)
        assert attempts is not None
        if attempts < 1:
            raise ConfigurationError("the rendezvous config 'keep_alive_max_attempt' must be >= 1")
        interval = seconds("keep_alive_interval", 1.0)
        if interval <= 0:
            raise ConfigurationError("the rendezvous config 'keep_alive_interval' must be > 0")
        return cls(
            join_timeout_s=seconds("join_timeout", seconds("timeout", 600.0)),
            last_call_timeout_s=seconds("last_call_timeout", 30.0),
            close_timeout_s=seconds("close_timeout", 30.0),
            heartbeat_timeout_s=seconds("heartbeat_timeout", 5.0),
            keep_alive_interval_s=interval,
            keep_alive_max_attempt=attempts,
        )


@dataclass(frozen=True)
class ClosedRecord:
    """Why the job is closed: ``closed`` (by a user), ``succeeded`` or ``failed``."""

    reason: str
    by: str = ""


@dataclass(frozen=True)
class _Membership:
    round: int
    index: int
    seal: SealRecord
    assign: proto.Assignment
    successor: str


def _round_key(r: int, name: str) -> str:
    return f"r{r}/{name}"


def _json_bytes(body: dict[str, Any]) -> bytes:
    # default=str: a field the caller could not serialise is shown, not lost or raised.
    return json.dumps(body, separators=(",", ":"), default=str).encode()


def _json_record(key: str, raw: bytes) -> dict[str, Any]:
    """Decode a free-form JSON record (state, event) of schema version 1.

    Raises:
        RendezvousStateError: the value is not a JSON object of version 1.
    """
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RendezvousStateError(
            f"the value under rendezvous key '{key}' is not an elastic-run record "
            f"(not JSON: {raw[:40]!r})"
        ) from None
    if not isinstance(body, dict) or body.get("v") != SCHEMA_VERSION:
        raise RendezvousStateError(
            f"the value under rendezvous key '{key}' has an unknown schema version "
            f"(expected v={SCHEMA_VERSION})"
        )
    return body


class DynamicRendezvousHandler(RendezvousHandler):
    """A rendezvous handler running the O(N) protocol on any ``RendezvousBackend``.

    Args:
        run_id: the job id.
        backend: the store the protocol runs on.
        min_nodes: the fewest nodes a round completes with.
        max_nodes: the most nodes a round admits.
        local_addr: the address this node advertises (default: its FQDN).
        settings: the timing.
        clock: the monotonic clock (seconds); injectable for tests.
    """

    def __init__(
        self,
        run_id: str,
        backend: RendezvousBackend,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None = None,
        settings: RendezvousSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
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
        host = socket.gethostname()
        self._host = host
        self._addr = local_addr or socket.getfqdn()
        self.node_id = f"{host}-{os.getpid()}-{secrets.token_hex(4)}"
        self._local_world_size = 1
        self._role = "default"
        self._lock = threading.Lock()
        self._member: _Membership | None = None
        self._last_round = -1
        self._round_over = False
        self._lost = False
        self._stop = threading.Event()
        self._beat_thread: threading.Thread | None = None
        self._heartbeat_error: RendezvousError | None = None
        self._shut_down = False
        # What the heartbeat thread saw of the last round's successor. It keeps watching it
        # between rounds, so the next round's coordinator judges a dead successor from when it
        # died, not from when the re-rendezvous began (one less stale period to wait).
        self._successor_beats = proto.Heartbeats()
        # Death notices (peerwatch.py): this node listens, and watches its ring successor.
        self._alive: AliveListener | None = None
        self._peer_watch: PeerWatch | None = None
        self._closed_peers: frozenset[str] = frozenset()
        self._poke = threading.Event()  # wakes the heartbeat thread before its next tick
        self._on_change: Callable[[], None] | None = None

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
        timeout: Any = None,
        keep_alive_interval: float = 1.0,
        keep_alive_max_attempt: int = 3,
    ) -> DynamicRendezvousHandler:
        """Build a handler as torch's ``from_backend`` does (``store`` is kept for shape only).

        Args:
            timeout: an object with ``join``, ``last_call``, ``close``, ``heartbeat``
                timedeltas (torch's RendezvousTimeout), or None for the defaults.
        """
        settings = RendezvousSettings(
            keep_alive_interval_s=keep_alive_interval,
            keep_alive_max_attempt=keep_alive_max_attempt,
        )
        if timeout is not None:
            settings = RendezvousSettings(
                join_timeout_s=timeout.join.total_seconds(),
                last_call_timeout_s=timeout.last_call.total_seconds(),
                close_timeout_s=timeout.close.total_seconds(),
                heartbeat_timeout_s=timeout.heartbeat.total_seconds(),
                keep_alive_interval_s=keep_alive_interval,
                keep_alive_max_attempt=keep_alive_max_attempt,
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
        than at its next monitor tick. The callback must be quick and must not raise.
        """
        self._on_change = callback

    @property
    def successor_watch(self) -> str:
        """What the death-notice watch on this node's ring successor is doing, for people.

        ``watching <node id>``, ``no verdict <node id>: <why>``, ``dead <node id>``, ``idle``.
        A successor that died before the watch first connected gets no death notice (a refused
        first connect proves nothing); its heartbeat judges it.
        """
        watch = self._peer_watch
        return watch.state if watch is not None else "idle"

    def closed_peers(self) -> frozenset[str]:
        """The node ids whose agents this node saw end (see ``peerwatch.py``). No I/O."""
        return self._closed_peers

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

    @property
    def settings(self) -> RendezvousSettings:
        """The timing in force."""
        return self._settings

    @property
    def backend(self) -> RendezvousBackend:
        """The backend the protocol runs on."""
        return self._backend

    def is_closed(self) -> bool:
        """Return whether the job's rendezvous is closed."""
        return self._backend.get("closed") is not None

    def closed_reason(self) -> ClosedRecord | None:
        """Return why the job is closed, or None while it is open."""
        raw = self._backend.get("closed")
        if raw is None:
            return None
        return decode(ClosedRecord, "closed", raw)

    def set_closed(self, reason: str = "closed") -> None:
        """Close the rendezvous: no round forms any more, every node sees it.

        The first close wins; closing a closed rendezvous again changes nothing.

        Args:
            reason: ``closed`` (by a user), ``succeeded`` or ``failed``.

        Raises:
            ValueError: ``reason`` is none of those.
            RendezvousConnectionError: the backend cannot be reached.
        """
        if reason not in CLOSED_REASONS:
            raise ValueError(
                f"set_closed reason must be one of {', '.join(CLOSED_REASONS)}, not {reason!r}"
            )
        self._backend.compare_set("closed", None, encode(ClosedRecord(reason, self.node_id)))

    def publish_state(self, state: str, restarts: int, message: str = "") -> None:
        """Publish this agent's state for ``elastic-run status``: one O(1) write of ``st/<node id>``.

        Best-effort: a backend error is logged as a warning, never raised.

        Args:
            state: the agent's worker-group state (``HEALTHY``, ``FAILED``...).
            restarts: how many restarts this agent has used.
            message: a short note for people.
        """
        member = self._member
        body = {
            "v": SCHEMA_VERSION,
            "state": state,
            "restarts": restarts,
            "round": member.round if member is not None else self._last_round,
            "message": message,
            "ts": time.time(),
        }
        try:
            self._backend.set(f"st/{self.node_id}", _json_bytes(body))
        except RendezvousError as exc:
            log.warning("rendezvous '%s': could not publish the agent state: %s", self._run_id, exc)

    def publish_event(self, kind: str, message: str, fields: dict[str, Any] | None = None) -> None:
        """Publish an event into the job's ring of the last 64 (two O(1) store operations).

        Best-effort: a backend error is logged as a warning, never raised.

        Args:
            kind: the event kind (``worker_failed``, ``rendezvous_complete``...).
            message: one line for people.
            fields: small JSON-able details.
        """
        try:
            seq = self._backend.add("ev/count", 1)
            body = {
                "v": SCHEMA_VERSION,
                "seq": seq,
                "ts": time.time(),
                "node": self.node_id,
                "host": self._host,
                "kind": kind,
                "message": message,
                "fields": dict(fields or {}),
            }
            self._backend.set(f"ev/{(seq - 1) % EVENT_RING_SIZE}", _json_bytes(body))
        except RendezvousError as exc:
            log.warning("rendezvous '%s': could not publish an event: %s", self._run_id, exc)

    def num_nodes_waiting(self) -> int:
        """Return how many nodes wait at the door of this node's round (one store trip).

        Also notices a round that ended (see ``is_round_over``).
        """
        member = self._member
        if member is None:
            return 0
        r = member.round
        raw_round, raw_arrivals = self._backend.get_many(["round", _round_key(r, "arrivals")])
        if raw_round is not None and decode_int("round", raw_round) != r:
            self._round_over = True
        arrivals = decode_int("arrivals", raw_arrivals) if raw_arrivals is not None else 0
        return max(0, arrivals - member.seal.sealed_arrivals)

    def is_round_over(self) -> bool:
        """Return whether this node's round ended (a member lost, failed or left). No I/O."""
        return self._round_over or self._lost

    def has_lost_member(self) -> bool:
        """Return whether this node saw a member of its round die. No I/O."""
        return self._lost

    def round_end(self) -> LostRecord | None:
        """Why this node's round ended and who ended it (one store read), or None.

        None while the round runs, and outside a round.
        """
        member = self._member
        return self._read_lost(member.round) if member is not None else None

    def report_failure(self, reason: str = "worker_failure") -> bool:
        """End the current round because this node's workers failed.

        Returns:
            True when this node ended the round first (its failure is the cause and
            counts against its restarts), False when the round had already ended.
        """
        member = self._member
        if member is None:
            return True
        first = self._end_round(member.round, LostRecord(member.round, reason, (), self.node_id))
        return first

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and block until it completes. See RendezvousHandler."""
        self._start_heartbeat()
        deadline = self._clock() + self._settings.join_timeout_s
        previous = self._member
        self._member = None
        self._round_over = False
        self._lost = False
        if previous is not None:
            self._last_round = previous.round
            self._end_round(previous.round, LostRecord(previous.round, "rejoin", (), self.node_id))
        while True:
            self._raise_if_closed()
            r = self._current_round()
            seal_raw = self._backend.get(_round_key(r, "seal"))
            if seal_raw is not None:
                # The round is complete without us: wait at the door for the next one.
                self._wait_at_door(r, decode(SealRecord, _round_key(r, "seal"), seal_raw), deadline)
                continue
            member = self._join_round(r, deadline)
            if member is None:
                continue
            self._member = member
            self._last_round = member.round
            store = self._backend.round_store(f"r{member.round}/shared/")
            return RendezvousInfo(
                store=store,
                rank=member.assign.rank,
                world_size=member.assign.world_size,
                bootstrap_store_info=None,
                round=member.round,
            )

    @property
    def assignment(self) -> proto.Assignment | None:
        """This node's place in its current round (worker rank offsets), or None."""
        member = self._member
        return member.assign if member is not None else None

    @property
    def round(self) -> int | None:
        """This node's current round, or None before the first."""
        member = self._member
        return member.round if member is not None else None

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
        self._stop.set()
        self._poke.set()
        thread = self._beat_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._settings.keep_alive_interval_s + 5)
        if self._peer_watch is not None:
            self._peer_watch.close()
        if self._alive is not None:
            self._alive.close()
        try:
            self._backend.forget_node(self.node_id)
        except RendezvousError as exc:
            log.warning("could not drop this node's heartbeat: %s", exc)
            return False
        return True

    # -- the protocol ---------------------------------------------------------------

    def _raise_if_closed(self) -> None:
        record = self.closed_reason()
        if record is not None:
            raise RendezvousClosedError(f"rendezvous '{self._run_id}' is closed ({record.reason})")

    def _current_round(self) -> int:
        raw = self._backend.get("round")
        if raw is None:
            raw, _ = self._backend.compare_set("round", None, b"0")
        return decode_int("round", raw)

    def _read_lost(self, r: int) -> LostRecord | None:
        """Why round r ended (one store read), or None while it runs."""
        key = _round_key(r, "lost")
        raw = self._backend.get(key)
        return decode(LostRecord, key, raw) if raw is not None else None

    def _end_round(self, r: int, why: LostRecord) -> bool:
        """Record why round r ended (first writer wins) and advance the round past it."""
        _, first = self._backend.compare_set(_round_key(r, "lost"), None, encode(why))
        self._backend.compare_set("round", str(r).encode(), str(r + 1).encode())
        return first

    def _my_record(self) -> NodeRecord:
        return NodeRecord(
            node_id=self.node_id,
            addr=self._addr,
            host=self._host,
            pid=os.getpid(),
            local_world_size=self._local_world_size,
            role=self._role,
            prev_round=self._last_round,
            alive_port=self._alive.port if self._alive is not None else 0,
        )

    def _arrivals_of(self, r: int) -> int:
        raw = self._backend.get(_round_key(r, "arrivals"))
        return decode_int(_round_key(r, "arrivals"), raw) if raw is not None else 0

    def _timeout_error(self, present: int) -> RendezvousTimeoutError:
        rs = self._round_settings
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
            index = self._backend.add(_round_key(r, "arrivals"), 1) - 1
            self._backend.set(_round_key(r, f"node/{index}"), encode(self._my_record()))
        self._last_round = r
        # Watch a few members so a job whose members all died does not keep us out.
        members = seal.admitted_indices()
        watch_idx = (
            sorted({members[(index + k) % len(members)] for k in range(2)}) if members else []
        )
        watched: dict[str, int] = {}
        for i, raw in zip(
            watch_idx,
            self._backend.get_many([_round_key(r, f"node/{i}") for i in watch_idx]),
            strict=True,
        ):
            if raw is not None:
                watched[decode(NodeRecord, _round_key(r, f"node/{i}"), raw).node_id] = i
        beats = proto.Heartbeats()
        tick = self._settings.keep_alive_interval_s
        while True:
            if self._backend.wait_for([_round_key(r + 1, "arrivals")], tick):
                return
            self._raise_if_closed()
            if self._current_round() != r:
                return
            now = self._clock()
            if now >= deadline:
                raise self._timeout_error(self._arrivals_of(r) - seal.sealed_arrivals)
            ids = list(watched)
            beats = self._with_closed(
                beats.observe(dict(zip(ids, self._backend.read_heartbeats(ids), strict=True)), now)
            )
            gone = [n for n in ids if beats.is_gone(n, now, self._settings.stale_after_s)]
            if gone:
                self._end_round(r, LostRecord(r, "member_lost", tuple(gone), self.node_id))
                return

    def _join_round(self, r: int, deadline: float) -> _Membership | None:
        """Arrive in the forming round r and block until it is sealed.

        Returns:
            The membership, or None when this node was left out (it then waits at the door).
        """
        index = self._backend.add(_round_key(r, "arrivals"), 1) - 1
        self._backend.set(_round_key(r, f"node/{index}"), encode(self._my_record()))
        seal_key = _round_key(r, "seal")
        if index + 1 == self._round_settings.max_nodes:
            # We brought the round to max: complete it at once.
            self._seal(r, tuple(range(index + 1)), "max", index + 1)
        coordinator = _Coordinator(self, r, index)
        if index == 0:
            # The first arrival coordinates: decide now (a re-forming round whose other
            # nodes are all known lost completes at once), not a tick from now.
            coordinator.step(self._clock())
        while True:
            now = self._clock()
            wait_s = coordinator.next_wait(now)
            if self._backend.wait_for([seal_key], wait_s):
                break
            self._raise_if_closed()
            now = self._clock()
            if now >= deadline:
                raise self._timeout_error(self._arrivals_of(r))
            coordinator.step(now)
        raw = self._backend.get(seal_key)
        if raw is None:
            raise RendezvousStateError(f"rendezvous key '{seal_key}' vanished after it was written")
        seal = decode(SealRecord, seal_key, raw)
        assign = proto.assignment_for(seal, index)
        if assign is None:
            # Too late for this round (or judged gone): wait at the door with this arrival.
            self._wait_at_door(r, seal, deadline, index)
            return None
        successor: NodeRecord | None = None
        if assign.successor_index >= 0:
            succ_key = _round_key(r, f"node/{assign.successor_index}")
            raw_succ = self._backend.get(succ_key)
            if raw_succ is None:
                raise RendezvousStateError(f"rendezvous key '{succ_key}' is missing")
            successor = decode(NodeRecord, succ_key, raw_succ)
        if self._peer_watch is not None:
            if successor is not None:
                self._peer_watch.watch(successor.node_id, successor.addr, successor.alive_port)
            else:
                self._peer_watch.watch("", "", 0)  # alone in the round: nobody to watch
        return _Membership(r, index, seal, assign, successor.node_id if successor else "")

    def _seal(self, r: int, admitted: tuple[int, ...], reason: str, sealed_arrivals: int) -> None:
        """Complete round r with ``admitted`` (first sealer wins; the seal is one record)."""
        keys = [_round_key(r, f"node/{i}") for i in admitted]
        records = self._read_records(r, admitted, keys)
        live = [i for i in admitted if i in records]
        if len(live) < self._round_settings.min_nodes:
            return
        workers = runs([(records[i].local_world_size, records[i].role) for i in live])
        seal = SealRecord(r, sealed_arrivals, ranges(live), len(live), reason, workers)
        self._backend.compare_set(_round_key(r, "seal"), None, encode(seal))

    def _read_records(
        self, r: int, indices: tuple[int, ...], keys: list[str]
    ) -> dict[int, NodeRecord]:
        values = self._backend.get_many(keys)
        missing = [k for k, v in zip(keys, values, strict=True) if v is None]
        if missing:
            # An arrival between its add and its set: give it a moment, then leave it out.
            self._backend.wait_for(missing, self._settings.stale_after_s)
            values = self._backend.get_many(keys)
        return {
            i: decode(NodeRecord, k, v)
            for i, k, v in zip(indices, keys, values, strict=True)
            if v is not None
        }

    # -- heartbeats and the ring --------------------------------------------------------

    def _start_heartbeat(self) -> None:
        if self._beat_thread is not None:
            return
        try:
            self._alive = AliveListener(self.node_id, self._addr)
        except OSError as exc:
            log.info(
                "rendezvous '%s': no death-notice port on %s (%s); heartbeats alone judge this node",
                self._run_id,
                self._addr,
                exc,
            )
        self._peer_watch = PeerWatch(self._peer_closed)
        self._backend.heartbeat(self.node_id)
        self._beat_thread = threading.Thread(
            target=self._beat_loop, name="elastic-run-heartbeat", daemon=True
        )
        self._beat_thread.start()

    def _peer_closed(self, node_id: str) -> None:
        """PeerWatch: ``node_id``'s agent ended. Judge it at once (the heartbeat thread acts)."""
        with self._lock:
            self._closed_peers = self._closed_peers | {node_id}
        log.info(
            "rendezvous '%s': the agent of %s ended (its connection closed and its port refuses)",
            self._run_id,
            node_id,
        )
        self._poke.set()

    def _with_closed(self, beats: proto.Heartbeats) -> proto.Heartbeats:
        """``beats`` with this node's death notices applied."""
        closed = self._closed_peers
        return beats.with_closed(closed, self._clock()) if closed else beats

    def _notify_change(self) -> None:
        callback = self._on_change
        if callback is not None:
            callback()

    def _beat_loop(self) -> None:
        successor = ""
        while True:
            self._poke.wait(self._settings.keep_alive_interval_s)
            self._poke.clear()
            if self._stop.is_set():
                return
            try:
                self._backend.heartbeat(self.node_id)
                member = self._member
                if member is not None and member.successor != successor:
                    successor = member.successor
                    self._successor_beats = proto.Heartbeats()
                if not successor:
                    continue
                raw_round, beat = self._backend.get_many(["round", f"hb/{successor}"])
                now = self._clock()
                beats = self._successor_beats.observe({successor: decode_heartbeat(beat)}, now)
                beats = self._with_closed(beats)
                self._successor_beats = beats
                if member is None:
                    continue  # between rounds: only watch
                if raw_round is not None and decode_int("round", raw_round) != member.round:
                    if not self._round_over:
                        self._note_round_end(member.round)
                        self._notify_change()
                    continue
                if (
                    beats.is_gone(successor, now, self._settings.stale_after_s)
                    and not self._lost
                    and self._backend.get("closed") is None  # a finished job loses no one
                ):
                    log.warning(
                        "rendezvous '%s': member %s is gone (%s); ending round %d",
                        self._run_id,
                        successor,
                        "its agent ended"
                        if successor in self._closed_peers
                        else "it stopped heartbeating",
                        member.round,
                    )
                    self._lost = True
                    self._end_round(
                        member.round,
                        LostRecord(member.round, "member_lost", (successor,), self.node_id),
                    )
                    self._notify_change()
            except RendezvousError as exc:
                self._heartbeat_error = exc
                log.warning("rendezvous heartbeat failed: %s", exc)

    def _note_round_end(self, r: int) -> None:
        """Mark round r over; a member lost (by whoever saw it) counts as lost here too."""
        why = self._read_lost(r)
        if why is not None and why.reason == "member_lost":
            self._lost = True
        self._round_over = True

    # -- the status view -------------------------------------------------------------

    def snapshot(self) -> RendezvousSnapshot | None:
        """Return a read-only picture of the rendezvous (see ``read_snapshot``)."""
        return read_snapshot(
            self._backend,
            self._run_id,
            self._round_settings.min_nodes,
            self._round_settings.max_nodes,
        )


class _Coordinator:
    """The barrier duties of one arrival: watch its predecessor; seal when it is the lowest live."""

    def __init__(self, handler: DynamicRendezvousHandler, r: int, index: int) -> None:
        self._h = handler
        self._r = r
        self._index = index
        self._records: dict[int, NodeRecord] = {}
        self._beats = handler._successor_beats
        self._arrivals = index + 1
        self._last_arrival_at = handler._clock()
        self._expected: set[str] | None = None
        self._next_at: float | None = None
        self._pending = 0

    def present(self) -> int:
        return self._arrivals

    def next_wait(self, now: float) -> float:
        tick = self._h._settings.keep_alive_interval_s
        if self._pending:
            # A re-forming round waits on nodes of the last one: judge them 4 times a tick, so
            # a dead one is dropped soon after its heartbeat went stale (O(expected) reads).
            tick = tick / 4
        if self._next_at is None:
            return tick
        return max(0.01, min(tick, self._next_at - now))

    def _load_records(self, upto: int, start: int = 0) -> None:
        want = [i for i in range(start, upto) if i not in self._records]
        if not want:
            return
        keys = [_round_key(self._r, f"node/{i}") for i in want]
        for i, k, v in zip(want, keys, self._h._backend.get_many(keys), strict=True):
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
            rec = self._records.get(j)
            if rec is None or not self._beats.is_gone(rec.node_id, now, stale):
                return
            j -= 1

    def step(self, now: float) -> None:
        h, r, backend = self._h, self._r, self._h._backend
        stale = h._settings.stale_after_s
        self._beats = h._with_closed(self._beats)
        # Am I the lowest live arrival? Walk down my predecessors (usually one read).
        self._load_predecessors(now, stale)
        pred = proto.first_live_predecessor(self._index, self._records, self._beats, now, stale)
        chain = [
            self._records[j].node_id
            for j in range(pred if pred is not None else 0, self._index)
            if j in self._records
        ]
        if pred is not None:
            self._beats = self._beats.observe(
                dict(zip(chain, backend.read_heartbeats(chain), strict=True)), now
            )
            self._next_at = None
            return
        # Coordinator: read the arrivals and every arrival's heartbeat.
        raw = backend.get(_round_key(r, "arrivals"))
        arrivals = decode_int("arrivals", raw) if raw is not None else self._arrivals
        if arrivals > self._arrivals:
            self._arrivals, self._last_arrival_at = arrivals, now
        self._load_records(arrivals)
        ids = [rec.node_id for i, rec in sorted(self._records.items()) if i != self._index]
        expected = self._expected_nodes()
        watch = sorted(set(ids) | (expected - {h.node_id}))
        self._beats = self._beats.observe(
            dict(zip(watch, backend.read_heartbeats(watch), strict=True)), now
        )
        live = proto.live_arrivals(self._records, arrivals, self._beats, now, stale)
        pending = proto.expected_pending(
            expected, (rec.node_id for rec in self._records.values()), self._beats, now, stale
        )
        self._pending = pending
        reading = proto.BarrierReading(
            live=live,
            last_arrival_at=self._last_arrival_at,
            expected_pending=pending,
            is_reform=bool(expected),
        )
        action = proto.decide_barrier(reading, h._round_settings, now)
        if isinstance(action, proto.Seal):
            h._seal(r, action.admitted, action.reason, arrivals)
            self._next_at = None
        else:
            self._next_at = action.until

    def _expected_nodes(self) -> set[str]:
        """The nodes of the previous round (members and waiters) not already known lost."""
        if self._expected is not None:
            return self._expected
        backend, prev = self._h._backend, self._r - 1
        expected: set[str] = set()
        if prev >= 0:
            raw_arrivals = backend.get(_round_key(prev, "arrivals"))
            n = decode_int("arrivals", raw_arrivals) if raw_arrivals is not None else 0
            raw_seal = backend.get(_round_key(prev, "seal"))
            if n and raw_seal is not None:
                seal = decode(SealRecord, _round_key(prev, "seal"), raw_seal)
                admitted = set(seal.admitted_indices())
                keys = [_round_key(prev, f"node/{i}") for i in range(n)]
                for i, k, v in zip(range(n), keys, backend.get_many(keys), strict=True):
                    if v is not None and (i in admitted or i >= seal.sealed_arrivals):
                        expected.add(decode(NodeRecord, k, v).node_id)
                lost = self._h._read_lost(prev)
                if lost is not None:
                    expected -= set(lost.node_ids)
        self._expected = expected
        return expected


def read_snapshot(
    backend: RendezvousBackend, run_id: str, min_nodes: int = 0, max_nodes: int = 0
) -> RendezvousSnapshot | None:
    """Read a picture of a rendezvous without writing anything.

    A handful of batch reads, whatever N: the round, the latest seal, the shown members'
    records, heartbeats and published states, and the last events of the ring.

    Args:
        backend: the job's backend.
        run_id: the job id (for the picture).
        min_nodes: the job's minimum, when the reader knows it (0: unknown).
        max_nodes: the job's maximum, when the reader knows it (0: unknown).

    Returns:
        The snapshot, or None when nothing was ever written for ``run_id``.

    Raises:
        RendezvousStateError: a value under the job's keys is not ours (the key is named).
        RendezvousConnectionError: the backend cannot be reached.
    """
    raw_round, raw_closed = backend.get_many(["round", "closed"])
    if raw_round is None:
        return None
    r = decode_int("round", raw_round)
    closed = decode(ClosedRecord, "closed", raw_closed) if raw_closed is not None else None
    # The latest sealed round is r, or r-1 while r forms.
    candidates = [c for c in (r, r - 1) if c >= 0]
    raw_seals = backend.get_many([_round_key(c, "seal") for c in candidates])
    seal: SealRecord | None = None
    shown = r
    for candidate, raw in zip(candidates, raw_seals, strict=True):
        if raw is not None:
            seal, shown = decode(SealRecord, _round_key(candidate, "seal"), raw), candidate
            break
    raw_arr, raw_shown_arr, raw_lost = backend.get_many(
        [_round_key(r, "arrivals"), _round_key(shown, "arrivals"), _round_key(shown, "lost")]
    )
    arrivals = decode_int(_round_key(r, "arrivals"), raw_arr) if raw_arr is not None else 0
    members: list[MemberSnapshot] = []
    waiting: list[MemberSnapshot] = []
    lost: tuple[str, ...] = ()

    def snaps(rr: int, indices: list[int], ranks: list[int]) -> list[MemberSnapshot]:
        keys = [_round_key(rr, f"node/{i}") for i in indices]
        found = [
            (rank, decode(NodeRecord, k, v))
            for rank, k, v in zip(ranks, keys, backend.get_many(keys), strict=True)
            if v is not None
        ]
        ids = [rec.node_id for _, rec in found]
        beats = backend.read_heartbeats(ids)
        state_keys = [f"st/{node_id}" for node_id in ids]
        states = [
            _json_record(k, v) if v is not None else {}
            for k, v in zip(state_keys, backend.get_many(state_keys), strict=True)
        ]
        return [
            MemberSnapshot(
                rank=rank,
                node_id=rec.node_id,
                addr=rec.addr,
                host=rec.host,
                pid=rec.pid,
                local_world_size=rec.local_world_size,
                heartbeat=beat,
                state=str(state.get("state", "")),
                restarts=state["restarts"] if isinstance(state.get("restarts"), int) else 0,
            )
            for (rank, rec), beat, state in zip(found, beats, states, strict=True)
        ]

    if seal is not None:
        admitted = seal.admitted_indices()
        members = snaps(shown, admitted, list(range(len(admitted))))
        shown_arrivals = (
            decode_int(_round_key(shown, "arrivals"), raw_shown_arr) if raw_shown_arr else 0
        )
        late = list(range(seal.sealed_arrivals, shown_arrivals))
        waiting = snaps(shown, late, [-1] * len(late))
        if raw_lost is not None:
            lost = decode(LostRecord, _round_key(shown, "lost"), raw_lost).node_ids
    if shown != r:
        joining = list(range(arrivals))
        waiting += snaps(r, joining, [-1] * len(joining))
    if closed is not None:
        state = "closed"
    elif seal is not None and shown == r:
        state = "complete"
    elif arrivals >= min_nodes > 0:
        state = "last call"
    else:
        state = "waiting for nodes"
    return RendezvousSnapshot(
        run_id=run_id,
        backend=backend.name,
        endpoint=backend.endpoint,
        round=shown,
        state=state,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        closed=closed is not None,
        members=tuple(members),
        waiting=tuple(waiting),
        arrivals=arrivals,
        lost=lost,
        events=read_events(backend),
    )


def read_events(
    backend: RendezvousBackend, limit: int = SNAPSHOT_EVENTS
) -> tuple[dict[str, Any], ...]:
    """Return the last up to ``limit`` events of the job's ring, oldest first (two reads).

    A slot whose event is being written (counted, not yet set) or was overwritten by a
    newer one is skipped.

    Raises:
        RendezvousStateError: a ring key holds something that is not ours.
    """
    raw_count = backend.get("ev/count")
    if raw_count is None:
        return ()
    count = decode_int("ev/count", raw_count)
    seqs = list(range(max(1, count - min(limit, EVENT_RING_SIZE) + 1), count + 1))
    keys = [f"ev/{(seq - 1) % EVENT_RING_SIZE}" for seq in seqs]
    events: dict[int, dict[str, Any]] = {}
    for seq, key, raw in zip(seqs, keys, backend.get_many(keys), strict=True):
        if raw is None:
            continue
        body = _json_record(key, raw)
        if body.get("seq") == seq:
            events[seq] = body
    return tuple(events[seq] for seq in sorted(events))


def create_handler(
    backend: RendezvousBackend, params: RendezvousParameters
) -> DynamicRendezvousHandler:
    """Build a dynamic handler over ``backend`` from ``params`` (as torch's ``create_handler``).

    Raises:
        ConfigurationError: an unknown or bad --rdzv-conf key.
    """
    return DynamicRendezvousHandler(
        run_id=params.run_id,
        backend=backend,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        local_addr=params.local_addr,
        settings=RendezvousSettings.from_params(params),
    )
