"""Etcd watches shared by the clients of a process, that survive a server restart.

``WatchHub`` (one per process and cluster, on a connection of its own) waits for the first
changes of a key for any number of callers: the callers waiting on one key share one etcd
watch when it started at or before the revision each of them asked for and has delivered no
event at or after it yet (each is handed only the events at or after its own). At 1,024 nodes in 4 processes, each node's client held a
pyetcd watch stream of its own (a watch thread, gRPC's sender thread and a channel thread for
each), and the 256 nodes of a process all waited on the same seal key (issue 38).

When the stream breaks (a server restart, a failover), the watch is marked dead, the raw client
dropped, and each of its callers re-creates a watch from the last revision it saw + 1 once a
server answers, so no change in between is lost, until the caller's timeout.

Invariants: a watch is cancelled once its last caller left; a compacted start revision or a
timeout returns no events (the caller re-reads in either case); a caller whose client closed
(``close_user``) gets ``RendezvousConnectionError`` at once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyetcd
import pyetcd.exceptions as etcd_exc

from elastic_run.rendezvous.errors import RendezvousConnectionError, RendezvousError
from elastic_run.rendezvous.etcd.connection import (
    ConnectionOptions,
    EtcdConnection,
    Shared,
    cluster_key,
)
from elastic_run.rendezvous.etcd.kv import WatchEvent

__all__ = ["WatchHub", "release_hub", "shared_hub"]

log = logging.getLogger(__name__)

_CLOSED = object()  # put in a caller's queue when its client closes


@dataclass(eq=False)
class _Watch:
    """One etcd watch and the callers' queues it feeds."""

    key: str
    prefix: bool
    start_revision: int
    sinks: dict[int, tuple[queue.Queue[Any], object]] = field(default_factory=dict)
    raw: Any = None
    watch_id: Any = None
    dead: bool = False  # its stream broke (or its creation failed): nobody joins it
    last_event_revision: int = 0  # the newest event it delivered


class WatchHub:
    """The watches of a process's clients of one cluster (see the module docstring).

    Args:
        conn: the connection the watches run on (closed by ``stop()``).
    """

    def __init__(self, conn: EtcdConnection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._watches: dict[tuple[str, bool], list[_Watch]] = {}

    def stop(self) -> None:
        """Close the connection: every watch ends."""
        self._conn.close()

    def close_user(self, user: object) -> None:
        """``user``'s client closed: its waits end at once (as closed)."""
        with self._lock:
            sinks = [
                sink
                for watches in self._watches.values()
                for w in watches
                for sink, owner in w.sinks.values()
                if owner is user
            ]
        for sink in sinks:
            sink.put(_CLOSED)

    def wait(
        self,
        key: str,
        *,
        prefix: bool,
        start_revision: int,
        timeout_s: float,
        user: object,
    ) -> list[WatchEvent]:
        """Wait for the first changes of ``key`` (or keys under it) at or after ``start_revision``.

        Args:
            key: the key, or the prefix when ``prefix`` is true.
            prefix: whether to watch every key under ``key``.
            start_revision: the first revision of interest (the read's revision + 1).
            timeout_s: how long to wait.
            user: the client waiting (``close_user`` ends its wait).

        Returns:
            The events of the first batch at or after ``start_revision``, or an empty list on
            timeout or when the revision was compacted.

        Raises:
            RendezvousConnectionError: when no endpoint answers within the retry window, or
                the client closed.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        revision = start_revision
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            sink: queue.Queue[Any] = queue.Queue()
            watch = self._join(key, prefix, revision, sink, user)
            try:
                if watch is None:
                    return []  # compacted
                # As long as was left before the watch was made (its making may have failed
                # over from a member that did not answer).
                item = self._first_relevant(sink, revision, time.monotonic() + remaining)
            finally:
                if watch is not None:
                    self._leave(watch, sink)
            if item is None:
                return []
            if item is _CLOSED:
                raise RendezvousConnectionError(
                    f"the etcd client of {self._conn.endpoint} was closed during watch '{key}'"
                )
            if isinstance(item, list):
                return item
            if isinstance(item, etcd_exc.RevisionCompactedError):
                return []
            # The stream broke (server restart, failover): reconnect and resume.
            log.info("etcd watch on '%s' broke (%s); resuming at %d", key, item, revision)
            self._conn.drop(watch.raw if watch is not None else None)
            self._conn.call(
                "read the revision", lambda c: c.get_response("\0", limit=1)
            )  # waits, within the retry window, for a server to answer

    def _first_relevant(self, sink: queue.Queue[Any], revision: int, deadline: float) -> Any:
        """The first events at or after ``revision`` (a list), a failure, ``_CLOSED``, or None
        on timeout."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                item = sink.get(timeout=remaining)
            except queue.Empty:
                return None
            if item is _CLOSED or isinstance(item, BaseException) or item is None:
                return item if item is not None else RendezvousError("the watch stream ended")
            events = [
                WatchEvent(
                    key=bytes(ev.key).decode(),
                    value=bytes(ev.value),
                    mod_revision=int(ev.mod_revision),
                    is_delete=isinstance(ev, pyetcd.events.DeleteEvent),
                )
                for ev in item.events
                if int(ev.mod_revision) >= revision
            ]
            if events:
                return events

    def _join(
        self, key: str, prefix: bool, revision: int, sink: queue.Queue[Any], user: object
    ) -> _Watch | None:
        """Feed ``sink`` from a live watch of ``key`` started at or before ``revision`` (made
        now when there is none); None when ``revision`` was compacted."""
        with self._lock:
            for watch in self._watches.get((key, prefix), []):
                # A caller may join a watch that has delivered nothing it asks for yet.
                if (
                    not watch.dead
                    and watch.start_revision <= revision
                    and watch.last_event_revision < revision
                ):
                    watch.sinks[id(sink)] = (sink, user)
                    return watch
            watch = _Watch(key, prefix, revision)
            watch.sinks[id(sink)] = (sink, user)
            self._watches.setdefault((key, prefix), []).append(watch)
        kwargs: dict[str, Any] = {"start_revision": revision}
        if prefix:
            kwargs["range_end"] = pyetcd.utils.prefix_range_end(key.encode())

        def deliver(item: Any) -> None:
            with self._lock:
                if isinstance(item, BaseException) or item is None:
                    watch.dead = True
                else:
                    for ev in item.events:
                        watch.last_event_revision = max(
                            watch.last_event_revision, int(ev.mod_revision)
                        )
                sinks = [s for s, _ in watch.sinks.values()]
            for s in sinks:
                s.put(item)

        def create(c: Any) -> tuple[Any, Any]:
            return c, c.add_watch_callback(key, deliver, **kwargs)

        try:
            watch.raw, watch.watch_id = self._conn.call(f"watch '{key}'", create)
        except BaseException as exc:
            with self._lock:
                watch.dead = True
                others = [s for k, (s, _) in watch.sinks.items() if k != id(sink)]
                watch.sinks.pop(id(sink), None)
                self._forget(watch)
            compacted = isinstance(exc.__cause__, etcd_exc.RevisionCompactedError)
            for s in others:  # they retry (or return, when compacted) as after a break
                s.put(exc.__cause__ if compacted else exc)
            if isinstance(exc, RendezvousError) and compacted:
                return None
            raise
        return watch

    def _forget(self, watch: _Watch) -> None:
        """Take ``watch`` out of the table (under ``_lock``)."""
        watches = self._watches.get((watch.key, watch.prefix), [])
        if watch in watches:
            watches.remove(watch)
        if not watches:
            self._watches.pop((watch.key, watch.prefix), None)

    def _leave(self, watch: _Watch, sink: queue.Queue[Any]) -> None:
        """``sink``'s caller is done; the last one cancels the watch."""
        with self._lock:
            watch.sinks.pop(id(sink), None)
            if watch.sinks:
                return
            self._forget(watch)
            raw, watch_id = watch.raw, watch.watch_id
        if raw is not None:
            try:
                raw.cancel_watch(watch_id)
            except Exception as exc:  # the stream may be gone already; nothing to cancel
                log.debug("cancelling an etcd watch failed: %s", exc)


# Each process's hubs, one per cluster and connection settings.
_HUBS: Shared[WatchHub] = Shared(
    lambda key: WatchHub(EtcdConnection(key[1], **dict(key[2]))), WatchHub.stop
)


def shared_hub(
    endpoints: Sequence[tuple[str, int]], options: ConnectionOptions, user: object
) -> WatchHub:
    """The watch hub of this process for the cluster at ``endpoints`` (made on first use),
    held by ``user`` (a client) until ``release_hub``."""
    return _HUBS.acquire(cluster_key(endpoints, options), user)


def release_hub(hub: WatchHub, user: object) -> None:
    """``user`` (a client closing) is done with ``hub``: its waits end; the last user's release
    closes the hub's connection."""
    hub.close_user(user)
    _HUBS.release(hub, user)
