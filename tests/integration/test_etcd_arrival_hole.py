"""A join completes past an arrival index that no record will ever fill (real 3-member etcd).

The CI hang of ``test_job_survives_losing_an_etcd_member``: agent 0 took its arrival index
(``r0/arrivals`` add, one transaction) on etcd member 0, which was SIGKILLed after the
cluster committed the add and before its answer reached the agent. The client failed over and
sent the add again to another member: agent 0 got index 1, and index 0 was taken by nobody
alive. Agent 1 came as index 2. Arrival 1 watched its predecessor 0, "an arrival whose record
is not yet readable counts as alive", until the join timeout (600 s by default): neither agent
ever sealed round 0. A node that dies between its add and its record leaves the same hole.

The moment of the lost answer cannot be chosen on a stock etcd (it is between the commit and
the reply inside the member), so these tests build what it leaves, deterministically: the
job's arrival counter is bumped once with no record written (the add whose answer was lost),
member 0 is SIGKILLed, then real handlers made through the public registry join over all
three endpoints. The round must complete without the hole: the hole's successor judges it
gone once it stayed empty for the stale window (``keep_alive_interval x
keep_alive_max_attempt``) and coordinates.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from etcd_fixtures import etcd_cluster3_fixture, requires_etcd  # noqa: F401 - fixtures

from elastic_run.rendezvous.api import RendezvousInfo, RendezvousParameters
from elastic_run.rendezvous.dynamic.handler import DynamicRendezvousHandler
from elastic_run.rendezvous.etcd.backend import create_etcd_backend
from elastic_run.rendezvous.etcd.server import EtcdServer
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import SealRecord, decode
from elastic_run.rendezvous.registry import rendezvous_handler_registry

pytestmark = [pytest.mark.etcd, requires_etcd, pytest.mark.timeout(120)]

# A node is judged gone after 0.25 x 4 = 1 s; a join that hangs fails after 30 s, not 600.
CONF = {
    "keep_alive_interval": "0.25",
    "keep_alive_max_attempt": "4",
    "last_call_timeout": "0.5",
    "join_timeout": "30",
    "read_timeout": "10",
}


class _Job:
    def __init__(self, cluster: EtcdServer) -> None:
        self.endpoints = ",".join(cluster.endpoints)
        self.run_id = f"hole-{uuid.uuid4().hex[:8]}"
        self.handlers: list[DynamicRendezvousHandler] = []

    def params(self, nodes: int) -> RendezvousParameters:
        return RendezvousParameters(
            "etcd", self.endpoints, self.run_id, nodes, nodes, local_addr="127.0.0.1", **CONF
        )

    def handler(self, nodes: int) -> DynamicRendezvousHandler:
        handler = rendezvous_handler_registry.create_handler(self.params(nodes))
        assert isinstance(handler, DynamicRendezvousHandler)
        self.handlers.append(handler)
        return handler

    def take_an_index_and_write_nothing(self, r: int) -> int:
        """What the lost answer left: round ``r``'s arrival count bumped, no record."""
        backend = create_etcd_backend(self.params(1))
        try:
            backend.compare_set(keys.ROUND, None, str(r).encode())
            return backend.add(keys.arrivals(r), 1) - 1
        finally:
            backend.close()

    def seal(self, r: int) -> SealRecord:
        backend = create_etcd_backend(self.params(1))
        try:
            raw = backend.get(keys.seal(r))
        finally:
            backend.close()
        assert raw is not None, f"round {r} has no seal"
        return decode(SealRecord, keys.seal(r), raw)

    def close(self) -> None:
        for handler in reversed(self.handlers):
            handler.shutdown()
            handler.backend.close()


@pytest.fixture(name="job")
def job_fixture(etcd_cluster3: EtcdServer) -> Iterator[_Job]:
    job = _Job(etcd_cluster3)
    try:
        yield job
    finally:
        job.close()


def _join_all(handlers: list[DynamicRendezvousHandler]) -> list[RendezvousInfo]:
    with ThreadPoolExecutor(len(handlers)) as pool:
        calls = [pool.submit(h.next_rendezvous) for h in handlers]
        # Bounded by the handlers' join timeout (30 s): a hang raises RendezvousTimeoutError.
        return [call.result() for call in calls]


def _assert_one_group(infos: list[RendezvousInfo]) -> None:
    assert len({info.round for info in infos}) == 1
    assert {info.world_size for info in infos} == {len(infos)}
    assert sorted(info.rank for info in infos) == list(range(len(infos)))


def test_a_round_completes_past_a_lost_first_arrival(job: _Job, etcd_cluster3: EtcdServer) -> None:
    # The CI case: the hole is index 0, the first arrival's place, below every live node.
    # Three nodes, so that no arrival is the one that brings the count to max (index + 1 ==
    # max) and seals at once: only the walk past the hole can complete the round, whatever
    # order the handlers arrive in. (With two, the node at index 1 takes one coordinator step
    # on arrival, which seals when the other node's record is already there: the CI hang
    # needed agent 1 to come after that step.)
    assert job.take_an_index_and_write_nothing(0) == 0
    etcd_cluster3.kill_member(0)
    infos = _join_all([job.handler(3) for _ in range(3)])
    _assert_one_group(infos)
    seal = job.seal(0)
    assert seal.admitted_indices() == [1, 2, 3]
    assert seal.sealed_arrivals == 4


def test_a_round_completes_past_a_hole_between_live_arrivals(
    job: _Job, etcd_cluster3: EtcdServer
) -> None:
    # Arrival 0 lives and coordinates; the hole at 1 sits between it and arrival 2.
    first = job.handler(3)
    etcd_cluster3.kill_member(0)
    with ThreadPoolExecutor(1) as pool:
        joined = pool.submit(first.next_rendezvous)
        backend = create_etcd_backend(job.params(1))
        try:
            # Arrival 0 is in when its record is there; then the hole takes index 1.
            assert backend.wait_for([keys.node(0, 0)], 30)
        finally:
            backend.close()
        assert job.take_an_index_and_write_nothing(0) == 1
        others = _join_all([job.handler(3), job.handler(3)])
        _assert_one_group([joined.result(), *others])
    assert job.seal(0).admitted_indices() == [0, 2, 3]
