"""Telemetry in the store: each agent's published state and the job's ring of recent events.

What ``elastic-run status`` shows beyond membership. Writes are best-effort: a backend error
is logged as a warning and never raised, so telemetry can never stop a job. Reads raise
``RendezvousStateError`` naming the key when a value is not ours.

Keys (see ``keys.py``): ``st/<node id>`` holds a JSON object ``{"v": 1, "state", "restarts",
"round", "message", "ts"}``; events go to a ring of ``EVENT_RING_SIZE`` slots: one atomic add on
``ev/count`` gives the event its sequence number ``seq``, one write puts it in slot
``(seq - 1) % EVENT_RING_SIZE``. Two O(1) operations per event, whatever the job's size.

Progress (the agent's hang and straggler picture): ``pg/<node id>`` holds one node's ranks
(step, step time, beats, verdicts; written at most once a second, its size bounded by the
node's local world size, not by the job's), and ``pg/job`` the job's median step time and
slowest ranks, written by the node of group rank 0 every few seconds. Both are JSON objects of
version 1 whose fields the agent defines; :func:`read_progress` reads them in one batch.

Faults: ``fh/<node id>`` holds one node's fault history (the failures charged to it, bounded;
a JSON object of version 1 whose fields the agent defines; written once per failure, O(1) in
size); :func:`read_faults` reads the nodes' in one batch. ``fh/excluded`` lists the nodes
excluded so far (at most ``EXCLUDED_KEPT``; each added by one compare-and-set), for the others'
summaries: one read at the end of a job.

Goodput: ``gp/<node id>`` holds one node's account of its wall time (seconds per cause and its
restart count, a JSON object of version 1 whose fields the agent defines; O(1) in size, written
every few seconds); :func:`read_goodput` reads the nodes' in one batch.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from elastic_run.rendezvous.backend import RendezvousBackend
from elastic_run.rendezvous.errors import RendezvousError
from elastic_run.rendezvous.outage import BACKEND_OUTAGE
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import SCHEMA_VERSION, decode_int, load_versioned

__all__ = [
    "EXCLUDED_KEPT",
    "EXCLUDED_KEY",
    "PROGRESS_JOB_KEY",
    "SNAPSHOT_EVENTS",
    "Telemetry",
    "TelemetryHost",
    "decode_json_record",
    "excluded_entries",
    "faults_key",
    "goodput_key",
    "progress_key",
    "read_events",
    "read_faults",
    "read_goodput",
    "read_progress",
]

log = logging.getLogger(__name__)

SNAPSHOT_EVENTS = 20
PROGRESS_JOB_KEY = "pg/job"
EXCLUDED_KEY = "fh/excluded"
EXCLUDED_KEPT = 64
_CAS_TRIES = 20


def progress_key(node_id: str) -> str:
    """The key of one node's progress record."""
    return f"pg/{node_id}"


def faults_key(node_id: str) -> str:
    """The key of one node's fault history."""
    return f"fh/{node_id}"


def goodput_key(node_id: str) -> str:
    """The key of one node's goodput account."""
    return f"gp/{node_id}"


@runtime_checkable
class TelemetryHost(Protocol):
    """A rendezvous handler that publishes and reads telemetry for its node (the typed seam:
    nothing above the rendezvous touches the handler's backend)."""

    def telemetry(self) -> Telemetry:
        """This node's telemetry writer and reader on the job's backend."""


def _json_bytes(body: Mapping[str, Any]) -> bytes:
    # default=str: a field the caller could not serialise is shown, not lost or raised.
    return json.dumps(body, separators=(",", ":"), default=str).encode()


def decode_json_record(key: str, raw: bytes) -> dict[str, Any]:
    """Decode a free-form JSON record (state, event) of schema version 1.

    Raises:
        RendezvousStateError: the value is not a JSON object of version 1.
    """
    return load_versioned(key, raw)


class Telemetry:
    """One node's writer of its published state and of job events.

    Args:
        backend: the job's backend.
        run_id: the job id (for warnings).
        node_id: this node's id.
        host: this node's host name (shown with each event).
    """

    def __init__(self, backend: RendezvousBackend, run_id: str, node_id: str, host: str) -> None:
        self._backend = backend
        self._run_id = run_id
        self._node_id = node_id
        self._host = host

    def publish_state(self, state: str, restarts: int, round_: int, message: str = "") -> None:
        """Write this agent's state (one O(1) write). Never raises."""
        body = {
            "v": SCHEMA_VERSION,
            "state": state,
            "restarts": restarts,
            "round": round_,
            "message": message,
            "ts": time.time(),
        }
        try:
            self._backend.set(keys.state(self._node_id), _json_bytes(body))
        except RendezvousError as exc:
            BACKEND_OUTAGE.warn(
                log, f"rendezvous '{self._run_id}': could not publish the agent state", exc
            )

    def publish_event(
        self, kind: str, message: str, fields: Mapping[str, Any] | None = None
    ) -> None:
        """Add an event to the job's ring (two O(1) operations). Never raises."""
        try:
            seq = self._backend.add(keys.EVENT_COUNT, 1)
            body = {
                "v": SCHEMA_VERSION,
                "seq": seq,
                "ts": time.time(),
                "node": self._node_id,
                "host": self._host,
                "kind": kind,
                "message": message,
                "fields": dict(fields or {}),
            }
            self._backend.set(keys.event_slot(seq), _json_bytes(body))
        except RendezvousError as exc:
            BACKEND_OUTAGE.warn(
                log, f"rendezvous '{self._run_id}': could not publish an event", exc
            )

    def publish_progress(self, body: Mapping[str, Any]) -> None:
        """Write this node's progress record (one O(1) write). Never raises."""
        self._write(progress_key(self._node_id), body, "the progress record")

    def publish_job_progress(self, body: Mapping[str, Any]) -> None:
        """Write the job's progress summary (one O(1) write). Never raises."""
        self._write(PROGRESS_JOB_KEY, body, "the job's progress summary")

    def publish_goodput(self, body: Mapping[str, Any]) -> None:
        """Write this node's goodput account (one O(1) write). Never raises."""
        self._write(goodput_key(self._node_id), {"account": dict(body)}, "the goodput account")

    def publish_faults(self, body: Mapping[str, Any]) -> None:
        """Write this node's fault history (one O(1) write). Never raises."""
        self._write(faults_key(self._node_id), {"history": dict(body)}, "the fault history")

    def note_excluded(self, reason: str) -> None:
        """Add this node to the job's list of excluded nodes (compare-and-set, a few tries).
        Never raises."""
        entry = {"node": self._node_id, "host": self._host, "reason": reason[:400]}
        try:
            for _ in range(_CAS_TRIES):
                raw = self._backend.get(EXCLUDED_KEY)
                listed = excluded_entries(raw)
                body = {"v": SCHEMA_VERSION, "nodes": [*listed, entry][-EXCLUDED_KEPT:]}
                _, written = self._backend.compare_set(EXCLUDED_KEY, raw, _json_bytes(body))
                if written:
                    return
            log.warning("rendezvous '%s': could not list this node as excluded", self._run_id)
        except RendezvousError as exc:
            BACKEND_OUTAGE.warn(
                log, f"rendezvous '{self._run_id}': could not list this node as excluded", exc
            )

    def read_excluded(self) -> tuple[dict[str, str], ...]:
        """The nodes excluded so far (``node``, ``host``, ``reason`` each); an unreadable list
        reads as none.

        Raises:
            RendezvousError: the backend cannot be read.
        """
        return tuple(excluded_entries(self._backend.get(EXCLUDED_KEY)))

    def read_progress(
        self, node_ids: Sequence[str]
    ) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None, tuple[str, ...]]:
        """Read the nodes' progress records and the job's summary (see :func:`read_progress`)."""
        return read_progress(self._backend, node_ids)

    def read_faults(
        self, node_ids: Sequence[str]
    ) -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
        """Read the nodes' fault histories (see :func:`read_faults`)."""
        return read_faults(self._backend, node_ids)

    def _write(self, key: str, body: Mapping[str, Any], what: str) -> None:
        record = {"v": SCHEMA_VERSION, "ts": time.time(), "node": self._node_id, **body}
        try:
            self._backend.set(key, _json_bytes(record))
        except RendezvousError as exc:
            BACKEND_OUTAGE.warn(log, f"rendezvous '{self._run_id}': could not publish {what}", exc)


def excluded_entries(raw: bytes | None) -> list[dict[str, str]]:
    """The entries of ``fh/excluded`` (its raw value) that are well formed (``node``, ``host``,
    ``reason`` each; a forged list shows less, never raises)."""
    if raw is None:
        return []
    try:
        body = load_versioned(EXCLUDED_KEY, raw)
    except RendezvousError:
        return []
    nodes = body.get("nodes")
    if not isinstance(nodes, list):
        return []
    return [
        {k: str(e.get(k, ""))[:400] for k in ("node", "host", "reason")}
        for e in nodes[-EXCLUDED_KEPT:]
        if isinstance(e, dict) and isinstance(e.get("node"), str)
    ]


def read_progress(
    backend: RendezvousBackend, node_ids: Sequence[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None, tuple[str, ...]]:
    """Read the nodes' progress records and the job's summary in one batch.

    Args:
        backend: the job's backend.
        node_ids: whose records.

    Returns:
        (node id -> record for those that have one, the job summary or None, the problems: a
        sentence for each value that is not ours, which is left out).
    """
    wanted = [progress_key(n) for n in node_ids]
    values = backend.get_many([*wanted, PROGRESS_JOB_KEY])
    records: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    job: dict[str, Any] | None = None
    for key, node_id, raw in zip([*wanted, PROGRESS_JOB_KEY], [*node_ids, ""], values, strict=True):
        if raw is None:
            continue
        try:
            body = decode_json_record(key, raw)
        except RendezvousError as exc:
            problems.append(str(exc))
            continue
        if node_id:
            records[node_id] = body
        else:
            job = body
    return records, job, tuple(problems)


def read_faults(
    backend: RendezvousBackend, node_ids: Sequence[str]
) -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
    """Read the nodes' fault histories in one batch.

    Returns:
        (node id -> its record (``history``: the agent's JSON, ``ts``: when written, epoch s),
        for those that have one; a sentence for each value that is not ours, left out).
    """
    return _read_records(backend, node_ids, faults_key)


def read_goodput(
    backend: RendezvousBackend, node_ids: Sequence[str]
) -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
    """Read the nodes' goodput records in one batch.

    Returns:
        (node id -> its record (``account``: the agent's JSON, ``ts``: when written, epoch s),
        for those that have one; a sentence for each value that is not ours, left out).
    """
    return _read_records(backend, node_ids, goodput_key)


def _read_records(
    backend: RendezvousBackend, node_ids: Sequence[str], key_of: Callable[[str], str]
) -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
    wanted = [key_of(n) for n in node_ids]
    records: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for key, node_id, raw in zip(wanted, node_ids, backend.get_many(wanted), strict=True):
        if raw is None:
            continue
        try:
            records[node_id] = decode_json_record(key, raw)
        except RendezvousError as exc:
            problems.append(str(exc))
    return records, tuple(problems)


def read_events(
    backend: RendezvousBackend, limit: int = SNAPSHOT_EVENTS
) -> tuple[dict[str, Any], ...]:
    """Return the last up to ``limit`` events of the job's ring, oldest first (two reads).

    A slot whose event is being written (counted, not yet set) or was overwritten by a
    newer one is skipped.

    Raises:
        RendezvousStateError: a ring key holds something that is not ours.
    """
    raw_count = backend.get(keys.EVENT_COUNT)
    if raw_count is None:
        return ()
    count = decode_int(keys.EVENT_COUNT, raw_count)
    seqs = list(range(max(1, count - min(limit, keys.EVENT_RING_SIZE) + 1), count + 1))
    slots = [keys.event_slot(seq) for seq in seqs]
    events: dict[int, dict[str, Any]] = {}
    for seq, key, raw in zip(seqs, slots, backend.get_many(slots), strict=True):
        if raw is None:
            continue
        body = decode_json_record(key, raw)
        if body.get("seq") == seq:
            events[seq] = body
    return tuple(events[seq] for seq in sorted(events))
