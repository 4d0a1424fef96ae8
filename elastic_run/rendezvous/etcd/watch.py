"""Etcd watches that survive a server restart: wait for the first changes of a key.

A watch is a callback on pyetcd's shared watch stream. When the stream breaks (a server
restart, a failover), the raw client is dropped and the watch is re-created from the last
revision seen + 1, so no change in between is lost, until the caller's timeout.

Invariants: a watch is always cancelled before ``watch_first_events`` returns; a compacted
start revision or a timeout returns no events (the caller re-reads in either case).
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from typing import Any

import pyetcd
import pyetcd.exceptions as etcd_exc

from elastic_run.rendezvous.errors import RendezvousError
from elastic_run.rendezvous.etcd.kv import WatchEvent

__all__ = ["watch_first_events"]

log = logging.getLogger(__name__)


def watch_first_events(
    call: Callable[[str, Callable[[Any], tuple[Any, int]]], tuple[Any, int]],
    drop: Callable[[Any], None],
    wait_for_server: Callable[[], object],
    key: str,
    *,
    prefix: bool,
    start_revision: int,
    timeout_s: float,
) -> list[WatchEvent]:
    """Wait for the first changes of ``key`` (or keys under it) at or after ``start_revision``.

    Args:
        call: runs an operation on the raw client (``EtcdClient.call``).
        drop: forgets a raw client whose watch stream broke (``EtcdConnection.drop``).
        wait_for_server: a real request, made after the stream broke (it waits, within the
            retry window, for a server to answer).
        key: the key, or the prefix when ``prefix`` is true.
        prefix: whether to watch every key under ``key``.
        start_revision: the first revision of interest (the read's revision + 1).
        timeout_s: how long to wait.

    Returns:
        The events of the first batch, or an empty list on timeout or when the revision
        was compacted.

    Raises:
        RendezvousConnectionError: when no endpoint answers within the retry window.
    """
    deadline = time.monotonic() + max(0.0, timeout_s)
    revision = start_revision
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return []
        responses: queue.Queue[Any] = queue.Queue()
        kwargs: dict[str, Any] = {"start_revision": revision}
        if prefix:
            kwargs["range_end"] = pyetcd.utils.prefix_range_end(key.encode())

        def create(
            c: Any, sink: queue.Queue[Any] = responses, options: dict[str, Any] = kwargs
        ) -> tuple[Any, int]:
            return c, c.add_watch_callback(key, sink.put, **options)

        try:
            raw, watch_id = call(f"watch '{key}'", create)
        except RendezvousError as exc:
            if isinstance(exc.__cause__, etcd_exc.RevisionCompactedError):
                return []
            raise
        try:
            try:
                item = responses.get(timeout=remaining)
            except queue.Empty:
                return []
        finally:
            try:
                raw.cancel_watch(watch_id)
            except Exception as exc:  # the stream may be gone already; nothing to cancel
                log.debug("cancelling an etcd watch failed: %s", exc)
        if isinstance(item, etcd_exc.RevisionCompactedError):
            return []
        if isinstance(item, BaseException) or item is None:
            # The stream broke (server restart, failover): reconnect and resume.
            log.info("etcd watch on '%s' broke (%s); resuming at %d", key, item, revision)
            drop(raw)
            wait_for_server()
            continue
        events = [
            WatchEvent(
                key=bytes(ev.key).decode(),
                value=bytes(ev.value),
                mod_revision=int(ev.mod_revision),
                is_delete=isinstance(ev, pyetcd.events.DeleteEvent),
            )
            for ev in item.events
        ]
        if events:
            return events
        revision = max(revision, int(item.header.revision) + 1)
