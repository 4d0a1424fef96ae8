"""Agent events: every state change of the agent, as a small immutable record.

The agent emits events through an ``EventSink``; the CLI turns them into the live view or
plain lines, ``EventLog`` writes them as JSON lines to ``<log dir>/events.jsonl``, and the
agent publishes a few to the rendezvous backend for ``elastic-run status``.

Kinds (stable, documented in the README):
    agent.started        the agent is up (fields: run_id, nproc_per_node, backend, endpoint,
                         node: its node id in the rendezvous, "" for a torch-style one; host)
    rendezvous.joining   joining round (fields: attempt)
    rendezvous.complete  a round completed (fields: round, group_rank, group_world_size,
                         world_size, master_addr, master_port)
    workers.started      the local workers run (fields: pids, ranks, attempt)
    worker.failed        the local group failed (fields: local_rank, rank, exitcode, counted,
                         failed_at: when the first worker failed, epoch seconds)
    worker.hung          a worker was silent past its hang timeout: its stacks were taken and it
                         was killed (fields: rank, local_rank, pid, silent_s, timeout_s, learned,
                         where, function, in_collective, stacks, stacks_error)
    worker.outlived      a worker's process outlived its script's end past --script-exit-timeout:
                         its stacks were taken and it was killed, its exit counted as the
                         script's status (fields: rank, local_rank, pid, lived_s, timeout_s,
                         exitcode, exitcode_known, where, stacks)
    worker.died_after_script  a warm worker was killed by a signal after its script ended (a
                         crash in the interpreter's shutdown): its exit counted as the
                         script's status (fields: rank, local_rank, pid, exitcode, counted);
                         never a worker its own agent stopped (that is workers.stopped)
    straggler            a rank stayed at or above --straggler-factor x the job's median step
                         time (fields: rank, host, node, time_s, median_s, ratio)
    watchdog.expired     the watchdog killed a worker (fields: pid, scope_id, signal)
    membership.changed   nodes wait or a member was lost: re-rendezvous (fields: reason, waiting;
                         when the round ended: cause, ended_by, lost (node ids); learned_by:
                         how this node learned it, notice (a member told it, the store
                         confirmed), look (its own read) or verdict (it judged a member lost);
                         notice_from: the node id that told it)
    restart              restarting the workers (fields: restarts, max_restarts, counted)
    workers.stopped      this node's agent stopped its workers, once per attempt (fields: by
                         ("agent"), reason (member_lost, nodes_waiting, round_ended,
                         liveness_lost, failure, no_progress, signal, closed,
                         rendezvous_error, error); signal, rank (the failed one), closed)
    succeeded            every worker of this node exited 0
    failed               the job failed (fields: reason, exit_code)
    signal               the agent received a signal (fields: signal)
    closed               the rendezvous was closed (fields: reason)
    goodput              where this node's wall time went, once its run ended (the last event of
                         events.jsonl; fields: the account's JSON, see agent/loop/goodput.py:
                         v, wall_s, training_s, share, lost_s, lost (by cause), restart_count,
                         nodes, ended, restarts (each: cause, lost_s, detection_s, stop_s,
                         rendezvous_s, worker_start_s, first_beat_s))
    agent.exited         the agent leaves (fields: exit_code)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = ["AgentEvent", "EventLog", "EventSink"]


@dataclass(frozen=True)
class AgentEvent:
    """One state change. ``timestamp`` is wall-clock seconds (for people and logs only)."""

    kind: str
    message: str
    fields: dict[str, Any] = field(default_factory=dict)
    timestamp: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON object written to events.jsonl (keys: v, ts, kind, message, fields)."""
        return {
            "v": 1,
            "ts": round(self.timestamp, 6),
            "kind": self.kind,
            "message": self.message,
            "fields": self.fields,
        }


EventSink = Callable[[AgentEvent], None]


class EventLog:
    """Appends events as JSON lines to a file, one flushed line per event (thread-safe)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: IO[str] | None = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def __call__(self, event: AgentEvent) -> None:
        line = json.dumps(event.to_dict(), default=str, separators=(",", ":"))
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")
                self._file.flush()

    def close(self) -> None:
        """Close the file. Idempotent."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
