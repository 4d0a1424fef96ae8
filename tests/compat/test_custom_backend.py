"""A rendezvous backend written for ours, as the README shows (torch's get_state/set_state kind
cannot drive our protocol): a shared dict, for nodes that are threads of one process.

The backend implements the key-value seam of ``elastic_run.rendezvous.backend``, is registered
under its name, and two nodes complete a round through ``get_rendezvous_handler``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence

import pytest
from torch.distributed import HashStore, PrefixStore, Store

from elastic_run.rendezvous.api import RendezvousInfo, RendezvousParameters
from elastic_run.rendezvous.backend import RendezvousBackend
from elastic_run.rendezvous.dynamic.handler import create_handler
from elastic_run.rendezvous.registry import RendezvousHandlerRegistry

pytestmark = pytest.mark.timeout(120)


class Shared:
    """What the nodes share: the keys, a condition to wait on, and a torch store for rounds."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.changed = threading.Condition()
        self.store = HashStore()


class DictBackend(RendezvousBackend):
    """The README's example: every key of a job in one dict (``Shared``)."""

    def __init__(self, shared: Shared, run_id: str) -> None:
        self._s = shared
        self._prefix = f"{run_id}/"

    @property
    def name(self) -> str:
        return "dict"  # the name it is registered under

    @property
    def endpoint(self) -> str:
        return "memory"

    def get(self, key: str) -> bytes | None:
        with self._s.changed:
            return self._s.data.get(self._prefix + key)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        with self._s.changed:
            return [self._s.data.get(self._prefix + k) for k in keys]

    def set(self, key: str, value: bytes) -> None:
        self.set_many({key: value})

    def set_many(self, items: Mapping[str, bytes]) -> None:
        with self._s.changed:
            for key, value in items.items():
                self._s.data[self._prefix + key] = value
            self._s.changed.notify_all()

    def add(self, key: str, delta: int) -> int:
        with self._s.changed:
            value = int(self._s.data.get(self._prefix + key, b"0")) + delta
            self._s.data[self._prefix + key] = str(value).encode()
            self._s.changed.notify_all()
            return value

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> tuple[bytes, bool]:
        with self._s.changed:
            current = self._s.data.get(self._prefix + key)
            if current != expected:
                return (current if current is not None else b""), False
            self._s.data[self._prefix + key] = desired
            self._s.changed.notify_all()
            return desired, True

    def wait_for(self, keys: Sequence[str], timeout_s: float) -> bool:
        full = [self._prefix + k for k in keys]
        with self._s.changed:
            return self._s.changed.wait_for(
                lambda: all(k in self._s.data for k in full), timeout=timeout_s
            )

    def heartbeat(self, node_id: str) -> None:
        self.add(f"hb/{node_id}", 1)

    def read_heartbeats(self, node_ids: Sequence[str]) -> list[int | None]:
        values = self.get_many([f"hb/{n}" for n in node_ids])
        return [int(v) if v is not None else None for v in values]

    def forget_node(self, node_id: str) -> None:
        with self._s.changed:
            self._s.data.pop(f"{self._prefix}hb/{node_id}", None)

    def round_store(self, prefix: str) -> Store:
        return PrefixStore(self._prefix + prefix, self._s.store)


def test_a_backend_written_for_ours_runs_a_round_of_two_nodes() -> None:
    shared = Shared()
    registry = RendezvousHandlerRegistry()
    registry.register(
        "dict",
        lambda params: create_handler(None, DictBackend(shared, params.run_id), params),
    )
    run_id = f"custom-{uuid.uuid4().hex[:8]}"
    params = RendezvousParameters("dict", "", run_id, 2, 2, last_call_timeout="1")
    handlers = [registry.create_handler(params) for _ in range(2)]
    infos: dict[int, RendezvousInfo] = {}

    def join(i: int) -> None:
        infos[i] = handlers[i].next_rendezvous()

    threads = [threading.Thread(target=join, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(info.rank for info in infos.values()) == [0, 1]
        assert {info.world_size for info in infos.values()} == {2}
        infos[0].store.set("k", "v")
        assert infos[1].store.get("k") == b"v"
        assert handlers[0].num_nodes_waiting() == 0
    finally:
        for h in handlers:
            h.shutdown()
