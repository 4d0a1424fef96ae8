"""The records the rendezvous keeps in a store: versioned JSON, never pickle.

Every record is a JSON object with ``"v": 1``. Decoding checks the version and the
shape and raises ``RendezvousStateError`` naming the key, so a garbage or foreign
value under the job's keys is reported, not executed or crashed on.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

from elastic_run.rendezvous.errors import RendezvousStateError
from elastic_run.rendezvous.protocol import keys

__all__ = [
    "CLOSED_REASONS",
    "FOREIGN_BEAT_BASE",
    "HEARTBEAT_GONE",
    "SCHEMA_VERSION",
    "ClosedReason",
    "ClosedRecord",
    "LostReason",
    "LostRecord",
    "NodeRecord",
    "SealReason",
    "SealRecord",
    "decode",
    "decode_heartbeat",
    "read_heartbeat",
    "read_closed",
    "decode_int",
    "encode",
    "is_counter",
    "load_versioned",
    "ranges",
    "runs",
]

SealReason = Literal["max", "last_call", "reform"]
"""Why a round completed: max nodes arrived, the last call passed, every expected node is back."""

LostReason = Literal[
    "member_lost", "worker_failure", "nodes_waiting", "rejoin", "liveness_lost", "node_excluded"
]
"""Why a round ended: a member was judged dead, a node's workers failed, nodes wait at the door,
a node re-rendezvoused for another reason, a node lost its own liveness (its heartbeats
failed), or a node left the job as unhealthy (its failures singled it out)."""

ClosedReason = Literal["closed", "succeeded", "failed"]
"""Why a job is closed: by a user (``elastic-run close``), or because it ended."""

CLOSED_REASONS: tuple[ClosedReason, ...] = get_args(ClosedReason)

SCHEMA_VERSION = 1
# What a node that leaves writes over its heartbeat counter where the store cannot delete a key
# safely (TCPStore): far enough below zero that no heartbeat still in flight lifts it.
HEARTBEAT_GONE = -(2**62)

T = TypeVar("T")


@dataclass(frozen=True)
class NodeRecord:
    """One arrival in a round: who the node is and what it brings.

    Attributes:
        node_id: unique per agent process (host, pid and a random part).
        addr: the address other nodes and workers reach this node at.
        host: the host name, for people.
        pid: the agent's pid.
        local_world_size: how many workers this node runs.
        role: the workers' role name.
        prev_round: the last round this node completed as a member or waited in (-1: none).
        alive_port: the TCP port at ``addr`` whose connection closes when this node's agent
            ends (see ``peerwatch.py``); 0: none, heartbeats alone judge the node.
        min_nodes: the job's MIN nodes as this node was started with (0: not said).
        max_nodes: the job's MAX nodes as this node was started with (0: not said).
        prev_rank: the rank this node held in round ``rank_round`` (-1: none yet); the seal
            keeps it where the new world allows (``stable_ranks.py``).
        rank_round: the last round this node was a member of (-1: none).
        avoid_rank: a rank this node must not be given in the round it arrives in (-1: none):
            a node suspected after a failure asks for other ranks, so that a second failure
            tells a bad node (it fails again with other ranks) from a rank-dependent bug (the
            failure follows the rank to another node).
        links_untimed: 1 when this node takes part in link checks and its links to the others
            were never timed (it is new to the job, or every check it began was cut short);
            the seal counts such members, so that every member of a round decides alike
            whether the round's links are timed.
    """

    node_id: str
    addr: str
    host: str
    pid: int
    local_world_size: int
    role: str = "default"
    prev_round: int = -1
    alive_port: int = 0
    min_nodes: int = 0
    max_nodes: int = 0
    prev_rank: int = -1
    rank_round: int = -1
    avoid_rank: int = -1
    links_untimed: int = 0


@dataclass(frozen=True)
class SealRecord:
    """The completed membership of a round, written once.

    Attributes:
        round: the round number.
        sealed_arrivals: arrival indices below this were considered; higher ones wait.
        admitted: the admitted arrival indices in rank order, as inclusive ranges: one range
            when ranks follow arrival order (a first round), up to one per member when stable
            ranks reorder a re-formed round (about 10 bytes a member).
        world_size: the number of member nodes.
        reason: why the round completed (max, last_call, reform).
        workers: the members' (local world size, role) in rank order, run-length
            encoded as (count, local_world_size, role): O(1) for a uniform job.
        restarts: the job's restart count when the round was sealed (every member's workers
            see it as TORCHELASTIC_RESTART_COUNT).
        links_untimed: how many members' links were never timed (``NodeRecord.links_untimed``):
            the round's links are timed when it is above 0.
    """

    round: int
    sealed_arrivals: int
    admitted: tuple[tuple[int, int], ...]
    world_size: int
    reason: SealReason
    workers: tuple[tuple[int, int, str], ...] = ()
    restarts: int = 0
    links_untimed: int = 0

    def admitted_indices(self) -> list[int]:
        """Return the admitted arrival indices in rank order."""
        return [i for lo, hi in self.admitted for i in range(lo, hi + 1)]

    def admitted_count(self) -> int:
        """How many arrival indices ``admitted`` names (O(ranges), not O(members))."""
        return sum(hi - lo + 1 for lo, hi in self.admitted)

    def rank_of(self, index: int) -> int | None:
        """The rank of arrival ``index``, or None when not admitted (O(ranges))."""
        below = 0
        for lo, hi in self.admitted:
            if lo <= index <= hi:
                return below + index - lo
            below += hi - lo + 1
        return None

    def index_at(self, rank: int) -> int:
        """The arrival index holding ``rank`` (0 <= rank < the admitted count; O(ranges))."""
        for lo, hi in self.admitted:
            if rank <= hi - lo:
                return lo + rank
            rank -= hi - lo + 1
        raise IndexError("rank out of range")

    def consistency_error(self) -> str | None:
        """What makes this seal unusable (its parts disagree on the member count), or None."""
        try:
            admitted = self.admitted_count()
            described = sum(int(count) for count, _, _ in self.workers)
        except (TypeError, ValueError):
            return "malformed 'admitted' or 'workers'"
        if admitted != self.world_size or described != self.world_size:
            return (
                f"world_size {self.world_size}, {admitted} admitted, "
                f"{described} described in 'workers'"
            )
        if not 0 <= self.links_untimed <= self.world_size:
            return f"links_untimed {self.links_untimed} of {self.world_size} members"
        return None


@dataclass(frozen=True)
class LostRecord:
    """Why a round ended: a member was lost, or members re-rendezvous on purpose."""

    round: int
    reason: LostReason
    node_ids: tuple[str, ...] = ()
    by: str = ""


@dataclass(frozen=True)
class ClosedRecord:
    """Why the job is closed (written once, first writer wins) and by whom."""

    reason: ClosedReason
    by: str = ""


def encode(record: Any) -> bytes:
    """Encode a record dataclass as versioned JSON bytes."""
    body = asdict(record)
    body["v"] = SCHEMA_VERSION
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def _tuplify(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuplify(v) for v in value)
    return value


def load_versioned(key: str, raw: bytes) -> dict[str, Any]:
    """Decode ``raw`` (read under ``key``) as a JSON object of schema version 1.

    Raises:
        RendezvousStateError: the value is not JSON, or not an object of version 1.
    """
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
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


def decode(cls: type[T], key: str, raw: bytes) -> T:
    """Decode ``raw`` (read under ``key``) as a record of ``cls``.

    Raises:
        RendezvousStateError: the value is not JSON, not version 1, or not of this shape.
    """
    body = load_versioned(key, raw)
    del body["v"]
    try:
        record = cls(**{k: _tuplify(v) for k, v in body.items()})
    except TypeError as exc:
        raise RendezvousStateError(
            f"the value under rendezvous key '{key}' is not a valid {cls.__name__}: {exc}"
        ) from None
    _check_types(record, key)
    check = getattr(record, "consistency_error", None)
    problem = check() if callable(check) else None
    if problem:
        raise RendezvousStateError(
            f"the value under rendezvous key '{key}' is not a valid {cls.__name__}: {problem}"
        )
    return record


# Per record class, the fields ``_check_types`` looks at: (name, int or str, None) or (name,
# None, the literal's values). Built once: ``get_type_hints`` and ``get_origin`` per field and
# per decode were a third of a node's CPU in a 4,096-node round's decodes.
_FIELD_CHECKS: dict[type, tuple[tuple[str, type | None, tuple[Any, ...]], ...]] = {}


def _field_checks(cls: type) -> tuple[tuple[str, type | None, tuple[Any, ...]], ...]:
    checks = _FIELD_CHECKS.get(cls)
    if checks is None:
        found: list[tuple[str, type | None, tuple[Any, ...]]] = []
        for name, annotation in get_type_hints(cls).items():
            if get_origin(annotation) is Literal:
                found.append((name, None, get_args(annotation)))
            elif annotation in (int, str):
                found.append((name, annotation, ()))
        checks = _FIELD_CHECKS[cls] = tuple(found)
    return checks


def _check_types(record: Any, key: str) -> None:
    """Check the scalar fields: ints are ints (not bools), strs are strs, literals are allowed."""
    for name, scalar, allowed in _field_checks(type(record)):
        value = getattr(record, name)
        if scalar is None:
            ok = value in allowed
        else:
            ok = isinstance(value, scalar) and not isinstance(value, bool)
        if not ok:
            raise RendezvousStateError(
                f"the value under rendezvous key '{key}' has a bad field '{name}': {value!r}"
            )


def decode_int(key: str, raw: bytes) -> int:
    """Decode a counter or round number stored as ASCII digits.

    Raises:
        RendezvousStateError: the value is not an integer.
    """
    try:
        return int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise RendezvousStateError(
            f"the value under rendezvous key '{key}' is not an integer ({raw[:40]!r})"
        ) from None


_INT64 = 2**63


def is_counter(raw: bytes) -> bool:
    """Whether a store can add to ``raw``: ASCII digits (a sign allowed) within 64 bits.

    TCPStore's server parses the value with ``std::stoll`` and drops the client's connection
    when it cannot (garbage, or a number past 64 bits): a counter must be checked before it is
    added to, when anything else could have written it.
    """
    text = raw[1:] if raw[:1] == b"-" else raw
    return text.isdigit() and text.isascii() and -_INT64 <= int(raw) < _INT64


def decode_heartbeat(raw: bytes | None, key: str) -> int | None:
    """Decode a heartbeat counter as read from a store; None when the node is gone.

    Gone: the key is absent (an etcd lease ended) or the counter is below zero (a node that
    left wrote ``HEARTBEAT_GONE``; a live counter starts at 1 and only grows).

    Args:
        raw: the stored value, or None when the key is absent.
        key: the key it was read under (``hb/<node id>``), named in the error.

    Raises:
        RendezvousStateError: the value is not an integer.
    """
    if raw is None:
        return None
    count = decode_int(key, raw)
    return count if count >= 0 else None


# Where a heartbeat key holds something other than an integer, ``read_heartbeat`` reads it as a
# counter of its own above every real one (a live counter counts up from 1 once a beat).
FOREIGN_BEAT_BASE = 2**62


def read_heartbeat(raw: bytes | None) -> tuple[int | None, bool]:
    """Read a heartbeat counter for a liveness verdict; never raises.

    Only a node itself writes its heartbeat key, but anything that can write to the store can
    put garbage there. Garbage must not drop the node, nor stop the reader: the value is read
    as a counter derived from its bytes. A live node overwrites it with its next beat (the
    value moves, the node stays alive); garbage that stays put is a counter that stopped
    moving, judged like any other by the heartbeat budget.

    Args:
        raw: the stored value, or None when the key is absent.

    Returns:
        (counter or None when gone, whether the value was garbage).
    """
    if raw is None:
        return None, False
    try:
        count = int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return FOREIGN_BEAT_BASE + zlib.crc32(raw), True
    return (count if count >= 0 else None), False


def read_closed(raw: bytes | None) -> tuple[ClosedRecord | None, str | None]:
    """Read the ``closed`` key for a verdict; never raises.

    Only ``close_job`` writes the key, but anything that can write to the store can put
    something else there (garbage, a pickle, a record with a reason we do not know). Such a
    value closes nothing and stops no reader: the job reads as open, and the next close (by a
    user, or by the job's own end) replaces it, compare-set from the exact bytes read.

    Args:
        raw: the stored value, or None when the key is absent.

    Returns:
        (the closed record or None while the job is open, what is wrong with the value or
        None when nothing is).
    """
    if raw is None:
        return None, None
    try:
        return decode(ClosedRecord, keys.CLOSED, raw), None
    except RendezvousStateError as exc:
        return None, str(exc)


def ranges(indices: list[int]) -> tuple[tuple[int, int], ...]:
    """Compress sorted-by-rank indices into inclusive runs of consecutive numbers."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][1] + 1 == i:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return tuple(runs)


def runs(items: list[tuple[int, str]]) -> tuple[tuple[int, int, str], ...]:
    """Run-length encode (local_world_size, role) pairs as (count, local_world_size, role)."""
    out: list[tuple[int, int, str]] = []
    for lws, role in items:
        if out and out[-1][1] == lws and out[-1][2] == role:
            out[-1] = (out[-1][0] + 1, lws, role)
        else:
            out.append((1, lws, role))
    return tuple(out)
