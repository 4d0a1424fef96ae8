"""Reading a job's rendezvous without writing: the picture ``elastic-run status`` shows.

A handful of batch reads, whatever N: the round and the closed record, the latest seal, the
shown members' and waiting nodes' records, heartbeats and published states, and the last events
of the ring. Nothing is written, so it is safe from any host and on a job in any state.

A value that cannot be decoded does not hide the rest: the key is named in
``RendezvousSnapshot.problems`` and whatever else decodes is shown (an operator looking at a
broken job needs the picture most). Only an undecodable ``round`` leaves nothing to show.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from elastic_run.rendezvous.api import MemberSnapshot, RendezvousSnapshot
from elastic_run.rendezvous.backend import RendezvousBackend
from elastic_run.rendezvous.dynamic.telemetry import (
    EXCLUDED_KEY,
    decode_json_record,
    excluded_entries,
    faults_key,
    read_events,
)
from elastic_run.rendezvous.errors import RendezvousStateError
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import (
    ClosedRecord,
    LostRecord,
    NodeRecord,
    SealRecord,
    decode,
    decode_heartbeat,
    decode_int,
)

__all__ = ["read_snapshot"]

T = TypeVar("T")


class _Reader:
    """Decodes values, collecting what cannot be decoded instead of raising."""

    def __init__(self, backend: RendezvousBackend) -> None:
        self.backend = backend
        self.problems: list[str] = []

    def decode(self, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except RendezvousStateError as exc:
            self.problems.append(str(exc))
            return None

    def record(self, cls: type[T], key: str, raw: bytes | None) -> T | None:
        if raw is None:
            return None
        return self.decode(lambda: decode(cls, key, raw))

    def count(self, key: str, raw: bytes | None) -> int:
        if raw is None:
            return 0
        value = self.decode(lambda: decode_int(key, raw))
        return value if value is not None else 0

    def members(self, r: int, indices: Sequence[int], ranks: Sequence[int]) -> list[MemberSnapshot]:
        node_keys = [keys.node(r, i) for i in indices]
        found = [
            (rank, rec)
            for rank, k, v in zip(ranks, node_keys, self.backend.get_many(node_keys), strict=True)
            if (rec := self.record(NodeRecord, k, v)) is not None
        ]
        ids = [rec.node_id for _, rec in found]
        hb_keys = [keys.heartbeat(n) for n in ids]
        st_keys = [keys.state(n) for n in ids]
        fh_keys = [faults_key(n) for n in ids]
        values = self.backend.get_many([*hb_keys, *st_keys, *fh_keys])
        beats = [
            self.decode(functools.partial(decode_heartbeat, v, k))
            for k, v in zip(hb_keys, values[: len(ids)], strict=True)
        ]
        states = [
            (self.decode(functools.partial(decode_json_record, k, v)) or {}) if v else {}
            for k, v in zip(st_keys, values[len(ids) : 2 * len(ids)], strict=True)
        ]
        healths = [
            _health(self, k, v) for k, v in zip(fh_keys, values[2 * len(ids) :], strict=True)
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
                health=health,
            )
            for (rank, rec), beat, state, health in zip(found, beats, states, healths, strict=True)
        ]


def _health(reader: _Reader, key: str, raw: bytes | None) -> str:
    """A node's health as its fault history says it (``ok`` without one; a record that is not
    ours is named in ``problems`` and shows ``ok``)."""
    if raw is None:
        return "ok"
    body = reader.decode(functools.partial(decode_json_record, key, raw)) or {}
    history = body.get("history")
    state = history.get("state") if isinstance(history, dict) else None
    return state[:200] if isinstance(state, str) and state else "ok"


def _job_size(
    backend: RendezvousBackend, r: int, arrivals: int, reader: _Reader
) -> tuple[int, int]:
    """The job's MIN:MAX as the first arrival of round ``r`` was started with (0, 0: unknown)."""
    if arrivals <= 0:
        return 0, 0
    rec = reader.record(NodeRecord, keys.node(r, 0), backend.get(keys.node(r, 0)))
    return (rec.min_nodes, rec.max_nodes) if rec is not None else (0, 0)


_PROBE_ROUNDS = 32


def _last_arrived_round(backend: RendezvousBackend) -> int | None:
    """The last round with an arrival count (rounds follow one another from 0), or None.

    Only for a job whose ``round`` key is missing: a batch read per ``_PROBE_ROUNDS`` rounds.
    """
    last: int | None = None
    start = 0
    while True:
        batch = range(start, start + _PROBE_ROUNDS)
        for r, raw in zip(batch, backend.get_many([keys.arrivals(r) for r in batch]), strict=True):
            if raw is None:
                return last
            last = r
        start += _PROBE_ROUNDS


def read_snapshot(
    backend: RendezvousBackend, run_id: str, min_nodes: int = 0, max_nodes: int = 0
) -> RendezvousSnapshot | None:
    """Read a picture of a rendezvous without writing anything.

    Args:
        backend: the job's backend.
        run_id: the job id (for the picture).
        min_nodes: the job's minimum, when the reader knows it (0: read it from the records).
        max_nodes: the job's maximum, when the reader knows it (0: read it from the records).

    Returns:
        The snapshot, or None when nothing was ever written for ``run_id``. A job whose
        ``round`` key is missing is shown at the last round any node arrived in, and says so
        in ``problems``. A value under ``closed`` that is not a valid record shows the job
        open (it closes nothing), named in ``problems``.

    Raises:
        RendezvousStateError: the ``round`` key itself is not ours (nothing can be shown).
        RendezvousConnectionError: the backend cannot be reached.
    """
    reader = _Reader(backend)
    raw_round, raw_closed = backend.get_many([keys.ROUND, keys.CLOSED])
    if raw_round is not None:
        r = decode_int(keys.ROUND, raw_round)
    else:
        # A running job whose `round` key was deleted still exists (its other keys do): show
        # the last round anyone arrived in, and say why.
        found = _last_arrived_round(backend)
        if found is None and not backend.exists():
            return None
        r = found if found is not None else 0
        reader.problems.append(
            f"the rendezvous key '{keys.ROUND}' is missing: showing round {r}, the last one "
            "any node arrived in"
        )
    closed = reader.record(ClosedRecord, keys.CLOSED, raw_closed)
    # The latest sealed round is r, or r-1 while r forms.
    candidates = [c for c in (r, r - 1) if c >= 0]
    seal: SealRecord | None = None
    shown = r
    for candidate, raw in zip(
        candidates, backend.get_many([keys.seal(c) for c in candidates]), strict=True
    ):
        if raw is not None:
            seal = reader.record(SealRecord, keys.seal(candidate), raw)
            if seal is not None:
                shown = candidate
                break
    raw_arr, raw_shown_arr, raw_lost = backend.get_many(
        [keys.arrivals(r), keys.arrivals(shown), keys.lost(shown)]
    )
    arrivals = reader.count(keys.arrivals(r), raw_arr)
    members: list[MemberSnapshot] = []
    waiting: list[MemberSnapshot] = []
    lost: tuple[str, ...] = ()
    if seal is not None:
        admitted = seal.admitted_indices()
        members = reader.members(shown, admitted, range(len(admitted)))
        late = list(range(seal.sealed_arrivals, reader.count(keys.arrivals(shown), raw_shown_arr)))
        waiting = reader.members(shown, late, [-1] * len(late))
        lost_record = reader.record(LostRecord, keys.lost(shown), raw_lost)
        lost = lost_record.node_ids if lost_record is not None else ()
    if shown != r:
        waiting += reader.members(r, range(arrivals), [-1] * arrivals)
    if not (min_nodes or max_nodes):
        min_nodes, max_nodes = _job_size(backend, shown, 1 if seal else arrivals, reader)
    if closed is not None:
        state = "closed"
    elif seal is not None and shown == r:
        state = "complete"
    elif arrivals >= min_nodes > 0:
        state = "last call"
    else:
        state = "waiting for nodes"
    events = reader.decode(lambda: read_events(backend)) or ()
    if seal is not None and seal.admitted_count() >= max_nodes > 0:
        # A full round: its waiting nodes are spares (the members do not re-form for them).
        waiting = [replace(w, health="spare") if w.health == "ok" else w for w in waiting]
    excluded = tuple(
        f"{e['host'] or e['node']}: {e['reason']}"
        for e in excluded_entries(backend.get(EXCLUDED_KEY))
    )
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
        events=events,
        closed_reason=closed.reason if closed is not None else None,
        problems=tuple(reader.problems),
        excluded=excluded,
    )
