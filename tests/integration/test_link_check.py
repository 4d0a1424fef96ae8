"""The link check with real helper processes (``agent/link_check``): several nodes' helpers at once
on loopback, meeting through a real TCPStore on port 0, as the agents of a round would after it
formed (one node's helper started early and ready, as an agent would start it while it joins).
A fair loopback names nobody; a peer that never comes is cut at the timeout with one line and
leaves no process behind; a check the agent gives up on (a signal) stops at once; a helper
started for a round that needs none is closed unused."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psutil
import pytest

from elastic_run.agent.link_check import LinkCheckError, LinkHelper, LinkReport, run_link_check
from tests.helpers import is_alive, wait_until

pytestmark = pytest.mark.timeout(300)

FACTOR = 1.5  # --straggler-factor's default
TAG = "LINK_CHECK_TEST_TAG"


@pytest.fixture
def store_port() -> Iterator[int]:
    from torch.distributed import TCPStore

    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    yield int(server.port)
    del server


def _tagged() -> tuple[str, dict[str, str]]:
    tag = uuid.uuid4().hex
    return tag, dict(os.environ, **{TAG: tag})


def _helpers_of(tag: str) -> list[int]:
    """Every running helper on the machine that carries ``tag`` (orphans included)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "elastic_run.agent.link_check.helper_process" not in (proc.info["cmdline"] or ()):
                continue
            if proc.environ().get(TAG) == tag and is_alive(proc.pid):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def _check_all(n: int, port: int, tag: str, env: dict[str, str]) -> dict[int, object]:
    early = LinkHelper.start(env)  # node 0's, started "while it joined"
    wait_until(early.is_ready, 120, "the early helper to import torch")
    results: dict[int, object] = {}

    def node(rank: int) -> None:
        try:
            results[rank] = run_link_check(
                rank, n, "127.0.0.1", port, f"link-check/{tag}/0", "gloo", 1 << 20, 240.0,
                factor=FACTOR, helper=early if rank == 0 else None, env=env,
            )  # fmt: skip
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
    tag, env = _tagged()
    results = _check_all(n, store_port, tag, env)
    reports = [results[r] for r in range(n)]
    assert all(isinstance(rep, LinkReport) for rep in reports), results
    first = reports[0]
    assert isinstance(first, LinkReport)
    print(f"{n} nodes: {[round(b / 1e6) for b in first.bandwidth_bytes_per_s]} MB/s")
    assert first.measured and first.world_size == n and len(first.bandwidth_bytes_per_s) == n
    assert all(b > 0 for b in first.bandwidth_bytes_per_s)
    assert first.all_reduce_bytes_per_s > 0
    # Every node meets a partner, and from 3 nodes on two of them.
    partners = {r: {a + b - r for a, b, _ in first.pairs if r in (a, b)} for r in range(n)}
    assert all(len(ps) == min(2, n - 1) for ps in partners.values()), partners
    for rep in reports:
        assert isinstance(rep, LinkReport)
        # The same figures on every node: the agents decide alike.
        assert rep.bandwidth_bytes_per_s == first.bandwidth_bytes_per_s
        assert rep.pairs == first.pairs
        assert rep.slow == () and rep.factor == FACTOR
        assert 0 < rep.measure_s <= rep.duration_s
    assert not _helpers_of(tag)


def test_a_peer_that_never_comes_is_cut_at_the_timeout(store_port: int) -> None:
    tag, env = _tagged()
    seen: list[int] = []

    def note_helper() -> None:
        seen.extend(pid for pid in _helpers_of(tag) if pid not in seen)

    with pytest.raises(LinkCheckError) as info:
        # Node 1 of 2 never starts its helper: node 0's waits in the process group's set-up.
        run_link_check(
            0, 2, "127.0.0.1", store_port, f"link-check/{tag}/0", "gloo", 1 << 20, 4.0,
            factor=FACTOR, env=env, give_up=note_helper,
        )  # fmt: skip
    assert info.value.timed_out
    assert str(info.value) == (
        "link check on node 0 of 2 timed out after 4 s (a peer never joined, or a link is down)"
    )
    assert seen, "the helper was never seen running"
    assert not _helpers_of(tag)  # killed and reaped: no orphan, anywhere
    assert not any(is_alive(pid) for pid in seen)


def test_a_check_the_agent_gives_up_on_stops_at_once(store_port: int) -> None:
    tag, env = _tagged()

    class Stop(Exception):
        pass

    def give_up() -> None:
        wait_until(lambda: _helpers_of(tag), 30, "the helper to start")
        raise Stop

    with pytest.raises(Stop):
        run_link_check(
            0, 3, "127.0.0.1", store_port, f"link-check/{tag}/0", "gloo", 1 << 20, 120.0,
            factor=FACTOR, env=env, give_up=give_up,
        )  # fmt: skip
    assert not _helpers_of(tag)


def test_a_helper_a_round_of_one_does_not_need_is_closed() -> None:
    tag, env = _tagged()
    helper = LinkHelper.start(env)
    wait_until(lambda: _helpers_of(tag), 30, "the helper to start")
    report = run_link_check(0, 1, "127.0.0.1", 1, "p", "gloo", factor=FACTOR, helper=helper)
    assert not report.measured
    assert not helper.is_alive() and not _helpers_of(tag)
