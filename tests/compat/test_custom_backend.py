"""A backend registered by a user, as the README shows (torch's get_state/set_state kind cannot
drive our protocol): the shipped in-memory backend, for nodes that are threads of one process.

``InMemoryRendezvousBackend`` implements the key-value seam of ``elastic_run.rendezvous.backend``
(the contract suite runs on it too); here it is registered under a name of its own in a
registry, and two nodes complete a round through ``create_handler``, as torch users build one.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from elastic_run.rendezvous import InMemoryRendezvousBackend, InMemoryStore
from elastic_run.rendezvous.api import RendezvousInfo, RendezvousParameters
from elastic_run.rendezvous.dynamic.handler import create_handler
from elastic_run.rendezvous.registry import RendezvousHandlerRegistry

pytestmark = pytest.mark.timeout(120)


def test_a_registered_in_memory_backend_runs_a_round_of_two_nodes() -> None:
    shared = InMemoryStore()
    registry = RendezvousHandlerRegistry()
    registry.register(
        "memory",
        lambda params: create_handler(
            None, InMemoryRendezvousBackend(shared, params.run_id), params
        ),
    )
    run_id = f"custom-{uuid.uuid4().hex[:8]}"
    params = RendezvousParameters("memory", "", run_id, 2, 2, last_call_timeout="1")
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
        assert handlers[0].get_backend() == "memory"
    finally:
        for h in handlers:
            h.shutdown()
