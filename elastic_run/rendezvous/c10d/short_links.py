"""The short-call connections of a process's nodes on one store: their own up to a few, then shared.

Each node keeps two connections to the c10d store (``backend.py``): one for its short calls
(the requests the store answers at once: heartbeats, reads, compare-sets, counters) and one for
its blocking waits (the seal, the round's store). An agent holds one node: two connections, as
before. A process that holds many nodes of one store (a benchmark, a test: a thousand simulated
nodes) would hold two a node as well, and the store's host one descriptor for each of them:
16,384 nodes would need over 32,768 there, past the 20,000 a process may open on some hosts.

So the first ``OWN_LINKS`` nodes of a process on one store each get a short-call connection of
their own, and the nodes after them share those, each taking the least used. Sharing costs a
node only the requests queued on the link before its own, never a wait: no short call blocks
(a TCPStore ``get`` is only sent for a key a ``check`` found, and no key is ever deleted). The
blocking waits keep one connection a node: a wait holds its connection until it returns, and a
heartbeat behind it is a node judged gone (tried: docs/performance.md, "One connection a node").

A shared link that broke is remade once, by whichever of its nodes' calls failed first; the
others take the new client at their own next failed call (their lease still holds the old one).
A node's backend releases its lease when it closes; a link nobody holds is dropped, and the next
node of that store connects afresh. A forked child shares none of its parent's links.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import Store

__all__ = ["OWN_LINKS", "LinkLease", "take_short_link"]

# The nodes of one process and store with a short-call connection of their own; later ones
# share. An agent (one node), and a test's few handlers, never share.
OWN_LINKS = 16


class _Link:
    """One short-call connection and the nodes that use it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held while the link is made or remade
        self.client: Store | None = None
        self.users = 0


class LinkLease:
    """A node's hold on one short-call link: its client, made again after it broke.

    Args:
        link: the shared link.
        connect: makes a fresh client (the first connect).
        reconnect: makes a fresh client after a break (short connects, a probe first).
        release: called once, when the lease is released.
    """

    def __init__(
        self,
        link: _Link,
        connect: Callable[[], Store],
        reconnect: Callable[[], Store],
        release: Callable[[_Link], None],
    ) -> None:
        self._link = link
        self._reconnect = reconnect
        self._release = release
        self._released = False
        with link.lock:
            if link.client is None:
                try:
                    link.client = connect()
                except BaseException:
                    self.release()
                    raise
            self.client: Store = link.client

    def renew(self) -> Store:
        """The link's client after a call on ``client`` failed on a broken link.

        Remade when the link still holds the client this lease had; when another node's call
        remade it already, that new client. Raises what the connect raised.
        """
        link = self._link
        with link.lock:
            if link.client is None or link.client is self.client:
                link.client = None
                link.client = self._reconnect()
            self.client = link.client
            return self.client

    def release(self) -> None:
        """This node is done with the link (idempotent)."""
        if not self._released:
            self._released = True
            self._release(self._link)


class _Links:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_store: dict[Hashable, list[_Link]] = {}

    def take(
        self, key: Hashable, connect: Callable[[], Store], reconnect: Callable[[], Store]
    ) -> LinkLease:
        with self._lock:
            links = self._by_store.setdefault(key, [])
            if len(links) < OWN_LINKS:
                link = _Link()
                links.append(link)
            else:
                link = min(links, key=lambda one: one.users)
            link.users += 1
        return LinkLease(link, connect, reconnect, functools.partial(self._release, key))

    def _release(self, key: Hashable, done: _Link) -> None:
        with self._lock:
            done.users -= 1
            if done.users <= 0:
                left = [one for one in self._by_store.get(key, []) if one is not done]
                if left:
                    self._by_store[key] = left
                else:
                    self._by_store.pop(key, None)


_LINKS = _Links()


def take_short_link(
    key: Hashable, connect: Callable[[], Store], reconnect: Callable[[], Store]
) -> LinkLease:
    """A lease on a short-call link to the store ``key`` names (a new link, or the least used).

    Args:
        key: the store and the client's settings (links are shared only between equal keys).
        connect: makes the link's client when the lease is the link's first.
        reconnect: makes it again after it broke.

    Raises:
        What ``connect`` raised (the lease is released then).
    """
    return _LINKS.take(key, connect, reconnect)


def _forget_after_fork() -> None:
    # A forked child must not send on its parent's sockets: its nodes connect afresh.
    global _LINKS
    _LINKS = _Links()


os.register_at_fork(after_in_child=_forget_after_fork)
