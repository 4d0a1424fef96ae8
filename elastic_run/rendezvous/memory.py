"""InMemoryRendezvousBackend: the supported fake at the rendezvous's one I/O seam.

For logic tests, ours and users': the nodes of a job are threads of one process, sharing one
:class:`InMemoryStore`; each node gets its own :class:`InMemoryRendezvousBackend` on it (as each
agent gets its own connection to a real store). It keeps the whole contract of
``backend.py`` (the contract suite, tests/integration/test_rendezvous_contract.py, runs on it
beside c10d, etcd and embedded etcd), opens no socket and starts no thread, and its blocking
wait is measured on an injected clock, so a test with a ``FakeClock`` advances a 30 s last call
instead of waiting it::

    from elastic_run.clock.fake import FakeClock
    from elastic_run.rendezvous import (
        DynamicRendezvousHandler, InMemoryRendezvousBackend, InMemoryStore,
    )

    clock = FakeClock()
    store = InMemoryStore(clock)
    handlers = [
        DynamicRendezvousHandler("job", InMemoryRendezvousBackend(store, "job"), 2, 3,
                                 clock=clock, death_notices=False)
        for _ in range(2)
    ]

What a real store does that a test may want, it does on purpose: :meth:`InMemoryRendezvousBackend.cut`
makes one node's calls fail as a partition does (``RendezvousUnreachableError``) until
:meth:`~InMemoryRendezvousBackend.heal`; :meth:`InMemoryStore.delete` drops a key. The round
stores it hands out are torch ``PrefixStore`` views of one torch ``HashStore`` (torch is imported
on the first one).

Invariants: every call is atomic under the store's one lock; no key is deleted except by
``delete``; a heartbeat key of a node that left holds ``HEARTBEAT_GONE`` (read as gone).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

from elastic_run.clock import SYSTEM_CLOCK, Clock
from elastic_run.rendezvous.backend import RendezvousBackend, heartbeat_values
from elastic_run.rendezvous.errors import RendezvousStateError, RendezvousUnreachableError
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import HEARTBEAT_GONE, is_counter

if TYPE_CHECKING:
    from torch.distributed import Store

__all__ = ["InMemoryRendezvousBackend", "InMemoryStore"]


class InMemoryStore:
    """What the nodes of one process share: the keys of every job, and one torch store.

    Args:
        clock: the clock the backends' blocking waits are measured on.
        name: shown as the backends' endpoint (``memory:<name>``).
    """

    def __init__(self, clock: Clock = SYSTEM_CLOCK, name: str = "store") -> None:
        self.clock = clock
        self.name = name
        self._data: dict[str, bytes] = {}
        self._changed = threading.Condition()
        self._torch_store: Store | None = None

    def keys(self) -> list[str]:
        """Every key stored, jobs' prefixes included (for tests that look)."""
        with self._changed:
            return sorted(self._data)

    def delete(self, key: str) -> bool:
        """Drop ``key`` (a full key, with its job's prefix); return whether it was there."""
        with self._changed:
            return self._data.pop(key, None) is not None

    def torch_store(self) -> Store:
        """The torch ``HashStore`` the round stores are views of (made on first use)."""
        with self._changed:
            if self._torch_store is None:
                from torch.distributed import HashStore

                self._torch_store = HashStore()
            return self._torch_store

    # -- for the backends -----------------------------------------------------------------

    def get_many(self, full_keys: Sequence[str]) -> list[bytes | None]:
        with self._changed:
            return [self._data.get(k) for k in full_keys]

    def set_many(self, items: Mapping[str, bytes]) -> None:
        with self._changed:
            self._data.update(items)
            self._changed.notify_all()

    def add(self, key: str, delta: int) -> int:
        with self._changed:
            raw = self._data.get(key, b"0")
            if not is_counter(raw):
                raise RendezvousStateError(
                    f"rendezvous key '{key}' holds {raw[:40]!r}, not a counter to add to"
                )
            value = int(raw) + delta
            self._data[key] = str(value).encode()
            self._changed.notify_all()
            return value

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> tuple[bytes, bool]:
        with self._changed:
            current = self._data.get(key)
            if current != expected:
                return (current if current is not None else b""), False
            self._data[key] = desired
            self._changed.notify_all()
            return desired, True

    def wait_for(self, full_keys: Sequence[str], timeout_s: float) -> bool:
        with self._changed:
            return self.clock.wait(
                self._changed, lambda: all(k in self._data for k in full_keys), timeout_s
            )


class InMemoryRendezvousBackend(RendezvousBackend):
    """One node's backend on an :class:`InMemoryStore` (see the module docstring).

    Args:
        store: what the job's nodes share.
        run_id: the job id; its keys live under ``memory/<run_id>/``.
    """

    CONF_KEYS: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, store: InMemoryStore, run_id: str) -> None:
        self._store = store
        self._run_id = run_id
        self._prefix = f"memory/{run_id}/"
        self._cut = False

    @property
    def name(self) -> str:
        """``memory``."""
        return "memory"

    @property
    def endpoint(self) -> str:
        """``memory:<store name>``."""
        return f"memory:{self._store.name}"

    @property
    def key_base(self) -> str:
        """The prefix of this job's keys in the store."""
        return self._prefix

    @property
    def store(self) -> InMemoryStore:
        """The shared store."""
        return self._store

    def cut(self) -> None:
        """Cut this node off the store: every call raises ``RendezvousUnreachableError``."""
        self._cut = True

    def heal(self) -> None:
        """Undo :meth:`cut`."""
        self._cut = False

    def _full(self, key: str) -> str:
        if self._cut:
            raise RendezvousUnreachableError(
                f"the in-memory rendezvous store {self.endpoint} does not answer (cut off)"
            )
        return self._prefix + key

    def get(self, key: str) -> bytes | None:
        return self._store.get_many([self._full(key)])[0]

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return self._store.get_many([self._full(k) for k in keys])

    def set(self, key: str, value: bytes) -> None:
        self._store.set_many({self._full(key): value})

    def set_many(self, items: Mapping[str, bytes]) -> None:
        self._store.set_many({self._full(k): v for k, v in items.items()})

    def add(self, key: str, delta: int) -> int:
        return self._store.add(self._full(key), delta)

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> tuple[bytes, bool]:
        return self._store.compare_set(self._full(key), expected, desired)

    def wait_for(self, keys: Sequence[str], timeout_s: float) -> bool:
        return self._store.wait_for([self._full(k) for k in keys], timeout_s)

    def heartbeat(self, node_id: str) -> None:
        key = self._full(keys.heartbeat(node_id))
        (raw,) = self._store.get_many([key])
        if raw is None or not is_counter(raw) or int(raw) < 0:
            self._store.set_many({key: b"1"})  # garbage or the gone mark stood there
        else:
            self._store.add(key, 1)

    def read_heartbeats(self, node_ids: Sequence[str]) -> list[int | None]:
        values = self.get_many([keys.heartbeat(n) for n in node_ids])
        return heartbeat_values(node_ids, values, self.endpoint)

    def forget_node(self, node_id: str) -> None:
        self.set(keys.heartbeat(node_id), str(HEARTBEAT_GONE).encode())

    def round_store(self, prefix: str) -> Store:
        from torch.distributed import PrefixStore

        return PrefixStore(self._full(prefix), self._store.torch_store())

    def delete(self, key: str) -> bool:
        """Drop the job's ``key`` (a lost key, for tests); return whether it was there."""
        return self._store.delete(self._full(key))
