"""What the clients of one process and cluster share: one object per key, held by its users.

``Shared(make, stop)`` keeps one object per key (a cluster's endpoints and connection
settings, with the process id: a forked child makes its own). ``acquire(key, user)`` returns the
key's object, made on first use; ``release(obj, user)`` lets go of it, and the last user's
release stops it (``stop``) and forgets it. The lease keeper and the watch hub are shared so:
a process of 256 nodes runs one of each per cluster, not 256 (issue 38).

Invariants: an object is stopped once, after its last user's release, outside the lock; an
object released by its last user is never handed out again (the next ``acquire`` makes a new one).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from elastic_run.rendezvous.etcd.connection import ConnectionOptions

__all__ = ["Shared", "cluster_key"]

T = TypeVar("T")


def cluster_key(endpoints: Sequence[tuple[str, int]], options: ConnectionOptions) -> Hashable:
    """The key of one cluster as a client reaches it: this process, the endpoints, the settings."""
    settings = tuple(sorted(options.items(), key=lambda kv: kv[0]))
    return (os.getpid(), tuple(endpoints), settings)


class Shared(Generic[T]):
    """One object per key, made on first use, stopped after its last user let go of it.

    Args:
        make: makes the object of a key.
        stop: stops an object no user holds any longer.
    """

    def __init__(self, make: Callable[[Any], T], stop: Callable[[T], None]) -> None:
        self._make = make
        self._stop = stop
        self._lock = threading.Lock()
        self._objects: dict[Hashable, T] = {}
        self._users: dict[int, tuple[Hashable, set[int]]] = {}  # id(obj) -> key, id(users)

    def acquire(self, key: Hashable, user: object) -> T:
        """The object of ``key`` (made now when there is none), held by ``user`` from now on."""
        with self._lock:
            obj = self._objects.get(key)
            if obj is None:
                obj = self._make(key)
                self._objects[key] = obj
                self._users[id(obj)] = (key, set())
            self._users[id(obj)][1].add(id(user))
            return obj

    def release(self, obj: T, user: object) -> None:
        """``user`` no longer holds ``obj``; the last user's release stops it."""
        with self._lock:
            entry = self._users.get(id(obj))
            if entry is None:
                return
            key, users = entry
            users.discard(id(user))
            if users:
                return
            del self._users[id(obj)]
            if self._objects.get(key) is obj:
                del self._objects[key]
        self._stop(obj)
