"""The link check with real helper processes (``agent/link_check``): several nodes' helpers at once
on loopback, meeting through a real TCPStore on port 0, as the agents of a round would after it
formed. A fair loopback names nobody; a peer that never comes is cut at the timeout with one line
and leaves no process behind; a check the agent gives up on (a signal) stops at once."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psutil
import pytest

from elastic_run.agent.link_check import LinkCheckError, LinkReport, run_link_check
from tests.helpers import is_alive, wait_until

pytestmark = pytest.mark.timeout(300)

FACTOR = 1.5  # --straggler-factor's default


@pytest.fixture
def store_port() -> Iterator[int]:
    from torch.distributed import TCPStore

    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    yield int(server.port)
    del server


def _helpers_of(prefix: str) -> list[psutil.Process]:
    """Every process on the machine whose command line carries ``prefix`` (orphans included)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(prefix in part for part in proc.info["cmdline"] or ()):
            found.append(proc)
    return found


def _check_all(n: int, port: int, prefix: str) -> dict[int, LinkReport | BaseException]:
    results: dict[int, LinkReport | BaseException] = {}

    def node(rank: int) -> None:
        try:
            results[rank] = run_link_check(
                rank, n, "127.0.0.1", port, prefix, "gloo", 1 << 20, 240.0, factor=FACTOR
            )
        except BaseException as exc:  # handed to the test's thread
            results[rank] = exc

    threads = [threading.Thread(target=node, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.parametrize("n", [2, 3])
def test_a_fair_loopback_gives_every_node_a_figure_and_names_nobody(
    n: int, store_port: int
) -> None:
    prefix = f"link-check/{uuid.uuid4().hex}/0"
    results = _check_all(n, store_port, prefix)
    errors = {r: v for r, v in results.items() if isinstance(v, BaseException)}
    assert not errors, errors
    reports = [results[r] for r in range(n)]
    assert all(isinstance(rep, LinkReport) for rep in reports)
    first = reports[0]
    assert isinstance(first, LinkReport)
    print(f"{n} nodes: {[round(b / 1e6) for b in first.bandwidth_bytes_per_s]} MB/s")
    assert first.measured and first.world_size == n and len(first.bandwidth_bytes_per_s) == n
    assert all(b > 0 for b in first.bandwidth_bytes_per_s)
    assert first.all_reduce_bytes_per_s > 0
    # Every node has a partner per round it plays, and every one meets two from 3 nodes on.
    partners = {r: {a + b - r for a, b, _ in first.pairs if r in (a, b)} for r in range(n)}
    assert all(len(ps) == min(2, n - 1) for ps in partners.values()), partners
    for rep in reports:
        assert isinstance(rep, LinkReport)
        # The same figures on every node: the agents decide alike.
        assert rep.bandwidth_bytes_per_s == first.bandwidth_bytes_per_s
        assert rep.pairs == first.pairs
        assert rep.slow == () and rep.factor == FACTOR
        assert 0 < rep.measure_s <= rep.duration_s
    assert not _helpers_of(prefix)


def test_a_peer_that_never_comes_is_cut_at_the_timeout(store_port: int) -> None:
    prefix = f"link-check/{uuid.uuid4().hex}/0"
    seen: list[int] = []

    def note_helper() -> None:
        seen.extend(p.pid for p in _helpers_of(prefix) if p.pid not in seen)

    with pytest.raises(LinkCheckError) as info:
        # Node 1 of 2 never starts its helper: node 0's waits in the process group's set-up.
        run_link_check(
            0, 2, "127.0.0.1", store_port, prefix, "gloo", 1 << 20, 4.0,
            factor=FACTOR, give_up=note_helper,
        )  # fmt: skip
    message = str(info.value)
    assert info.value.timed_out
    assert message == (
        "link check on node 0 of 2 timed out after 4 s (a peer never joined, or a link is down)"
    )
    assert seen, "the helper was never seen running"
    assert not _helpers_of(prefix)  # killed and reaped: no orphan, anywhere
    assert not any(is_alive(pid) for pid in seen)


def test_a_check_the_agent_gives_up_on_stops_at_once(store_port: int) -> None:
    prefix = f"link-check/{uuid.uuid4().hex}/0"

    class Stop(Exception):
        pass

    def give_up() -> None:
        wait_until(lambda: _helpers_of(prefix), 30, "the helper to start")
        raise Stop

    with pytest.raises(Stop):
        run_link_check(
            0, 3, "127.0.0.1", store_port, prefix, "gloo", 1 << 20, 120.0,
            factor=FACTOR, give_up=give_up,
        )  # fmt: skip
    assert not _helpers_of(prefix)
