"""Telemetry in the store: each agent's published state and the job's ring of recent events.

What ``elastic-run status`` shows beyond membership. Writes are best-effort: a backend error
is logged as a warning and never raised, so telemetry can never stop a job. Reads raise
``RendezvousStateError`` naming the key when a value is not ours.

Keys (see ``keys.py``): ``st/<node id>`` holds a JSON object ``{"v": 1, "state", "restarts",
"round", "message", "ts"}``; events go to a ring of ``EVENT_RING_SIZE`` slots: one atomic add on
``ev/count`` gives the event its sequence number ``seq``, one write puts it in slot
``(seq - 1) % EVENT_RING_SIZE``. Two O(1) operations per event, whatever the job's size.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from elastic_run.rendezvous import keys
from elastic_run.rendezvous.backend import RendezvousBackend
from elastic_run.rendezvous.errors import RendezvousError
from elastic_run.rendezvous.records import SCHEMA_VERSION, decode_int, load_versioned

__all__ = ["SNAPSHOT_EVENTS", "Telemetry", "decode_json_record", "read_events"]

log = logging.getLogger(__name__)

SNAPSHOT_EVENTS = 20


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
            log.warning("rendezvous '%s': could not publish the agent state: %s", self._run_id, exc)

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
            log.warning("rendezvous '%s': could not publish an event: %s", self._run_id, exc)


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
