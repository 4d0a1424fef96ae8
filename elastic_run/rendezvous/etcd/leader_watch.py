"""Calls held by a leader that is gone: spotting them, releasing them.

When an etcd leader dies, a write its follower had forwarded to it is lost: the follower holds
the call until the call's deadline (``read_timeout``, 60 s by default) or etcd's own request
timeout (7 s with the default election timeout), although the other members elect a new leader
within about two election timeouts. Measured on a 3-member etcd 3.4: a put sent through a
follower as the leader was SIGKILLed returned after 7.0 s; the follower's status named a new
leader 1.8 s after the kill.

The rule, for every call made through ``EtcdConnection.call``: once a call has been in flight
for ``SLOW_S``, a process-wide thread asks the member it waits on for its status (a local read,
no leader needed; under the require-leader flag etcd refuses it at once when there is none,
which says the same) every ``LOOK_S`` while it stays in flight. The leader changed under the
call when the member has no leader, or its raft term is past the newest term the connection had
seen (in a response or a look) before the call began, or past the term of the first look. Every
look tells the connection the term it read, so one leader change releases the calls it caught,
not every later slow call of a connection that had not heard of it. Then the connection closes
the raw client the call waits on: the call fails as stale and ``call`` retries it, on a fresh
client of the same member when there is a new leader (the member forwards it there), on the next
member when this one has none (it may be the one cut off). A member that answers neither the
call nor the status is left to the call's own deadline.

Closing the client fails every call in flight on it, not only the slow one: each is retried. A
released write may apply twice when the lost leader had replicated it before it died (or, for
the other calls on the client, when it had already landed), as a retry after the deadline
(``EtcdConnection.call`` retries DEADLINE_EXCEEDED) already may.

Threads: one daemon thread per process, started with the first call, asleep while no call is
in flight; it never raises (a failed status read leaves the call alone).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import pyetcd

from elastic_run.rendezvous.etcd.errors import MessageKind, message_kind

__all__ = [
    "LOOK_S",
    "SLOW_S",
    "WATCH",
    "LeaderWatch",
    "Released",
    "Watched",
    "member_status",
    "raft_term_of",
]

log = logging.getLogger(__name__)

# A call in flight this long is looked at (etcd answers a healthy write in milliseconds; a
# loaded host's fsync can take longer, which only costs a status read).
SLOW_S = 0.5
# How often a slow call's member is asked again.
LOOK_S = 0.25
# The deadline of one status read.
_STATUS_TIMEOUT_S = 0.5


class Watched(Protocol):
    """What the watch needs of a connection (``EtcdConnection`` has it)."""

    def release(self, raw: Any, why: str, *, next_member: bool) -> None:
        """Close ``raw``: its calls fail as stale and are retried (on the next member when
        ``next_member``)."""

    def note_term(self, term: int) -> None:
        """A look read raft term ``term`` from the member."""


@dataclass(frozen=True)
class Released:
    """A call the watch released: which, why, after how long."""

    what: str
    why: str
    waited_s: float


@dataclass
class _Call:
    conn: Watched
    raw: Any
    what: str
    started_s: float
    term_before: int  # the newest term the connection saw before the call began (0: none)
    first_term: int | None = None  # the term of the first look
    next_look_s: float = 0.0


def raft_term_of(result: Any) -> int:
    """The raft term in the response header of ``result`` (or of one of the first items of a
    tuple or list it is), 0 when it carries none."""
    items = result[:4] if isinstance(result, tuple | list) else (result,)
    best = 0
    for item in items:
        header = getattr(item, "header", None)
        term = getattr(header, "raft_term", 0) if header is not None else 0
        if isinstance(term, int) and term > best:
            best = term
    return best


def member_status(raw: Any) -> tuple[int, int] | None:
    """(leader id, raft term) of the member ``raw`` talks to; leader 0 when it has none (or
    refuses for want of one); None when it did not answer."""
    try:
        resp = raw.maintenancestub.Status(
            pyetcd.etcdrpc.StatusRequest(),
            _STATUS_TIMEOUT_S,
            credentials=raw.call_credentials,
            metadata=raw.metadata,
        )
    except grpc.RpcError as exc:
        details = str(exc.details() or "") if hasattr(exc, "details") else ""
        if message_kind(details) is MessageKind.NO_LEADER:
            return 0, 0
        return None
    except ValueError:  # the raw client was closed meanwhile
        return None
    return int(resp.leader), int(resp.raftTerm)


class LeaderWatch:
    """The calls in flight of every connection of the process, and the thread that looks at
    the slow ones (see the module docstring).

    Args:
        status: reads a raw client's member status (``member_status``; a test may wrap it).
        on_release: told of each released call (for tests and the log).
    """

    def __init__(
        self,
        status: Callable[[Any], tuple[int, int] | None] = member_status,
        on_release: Callable[[Released], None] | None = None,
    ) -> None:
        self._status = status
        self._on_release = on_release
        self._calls: dict[int, _Call] = {}
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def enter(self, conn: Watched, raw: Any, what: str, term_before: int) -> int:
        """Note a call about to wait on ``raw``; returns its token for ``leave``."""
        now = time.monotonic()
        with self._cond:
            token = next(self._ids)
            self._calls[token] = _Call(conn, raw, what, now, term_before, next_look_s=now + SLOW_S)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="etcd-leader-watch", daemon=True
                )
                self._thread.start()
            elif len(self._calls) == 1:
                self._cond.notify()
        return token

    def leave(self, token: int) -> None:
        """The call of ``token`` returned (or failed)."""
        with self._cond:
            self._calls.pop(token, None)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (calls in flight are no longer looked at); bounded join."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._calls and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                now = time.monotonic()
                due = [(t, c) for t, c in self._calls.items() if c.next_look_s <= now]
                if not due:
                    wake = min(c.next_look_s for c in self._calls.values())
                    self._cond.wait(max(0.0, wake - now))
                    continue
                for _, call in due:  # the next look, whatever this one does
                    call.next_look_s = now + LOOK_S
            for token, call in due:
                try:
                    self._look(token, call)
                except Exception:  # noqa: BLE001 - the watch must outlive any one look
                    log.exception("looking at a slow etcd call failed")

    def _look(self, token: int, call: _Call) -> None:
        status = self._status(call.raw)
        now = time.monotonic()
        if status is not None and status[1]:
            call.conn.note_term(status[1])
        with self._cond:
            if token not in self._calls:
                return  # it returned meanwhile
            if status is None:
                return
            leader, term = status
            why = None
            if leader == 0:
                why = "the member it waits on has no leader"
            elif call.term_before and term > call.term_before:
                why = f"the leader changed (raft term {call.term_before} -> {term})"
            elif call.first_term is not None and term > call.first_term:
                why = f"the leader changed (raft term {call.first_term} -> {term})"
            if call.first_term is None:
                call.first_term = term
            if why is None:
                return
            del self._calls[token]
        released = Released(call.what, why, now - call.started_s)
        log.info("etcd: %s waited %.1f s and %s: retrying it", call.what, released.waited_s, why)
        call.conn.release(call.raw, why, next_member=leader == 0)
        if self._on_release is not None:
            self._on_release(released)


# The process's watch (every connection enters its calls here).
WATCH = LeaderWatch()
