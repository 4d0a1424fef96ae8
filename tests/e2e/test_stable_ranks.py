"""Stable node ranks end to end: three real agents on c10d and on etcd.

A node that stays in the job keeps its GROUP_RANK across rounds when the new world allows it:
after a worker failure (every node back) the ranks are identical; after a node loss the
survivors keep their relative order and as few ranks change as possible; a newcomer in a
``--nnodes 2:3`` job takes the rank above the old world. The ranks are read from the agents'
``rendezvous.complete`` events (every round, even one whose workers were stopped before they
wrote anything) and from the workers' own GROUP_RANK.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from tests.e2e.test_multinode import (  # noqa: F401 - fixtures
    EXIT_S,
    FAST_CONF,
    START_S,
    Job,
    Node,
    backend_fixture,
    etcd_server_fixture,
    make_job_fixture,
)
from tests.helpers import is_alive, wait_until


def _group_ranks(node: Node) -> list[int]:
    """The node's GROUP_RANK in every round it completed, oldest first."""
    return [
        int(e["fields"]["group_rank"]) for e in node.events() if e["kind"] == "rendezvous.complete"
    ]


def _worker_group_rank(job: Job, name: str) -> int:
    return int(job.newest(name)["GROUP_RANK"])


def test_after_a_worker_failure_only_the_suspect_and_one_other_move(
    make_job: Any, backend: tuple[str, str]
) -> None:
    """The node charged with the failure is suspect and asks for another rank (so that a
    second failure tells a bad node from a bad rank: docs/bad-nodes.md); it trades places with
    the node of the next rank up, and every other node keeps its rank."""
    job = make_job(backend)
    # Node c's local rank 0 fails in the first attempt: c's agent ends the round and most
    # likely arrives first in the next one, so arrival order alone would give it rank 0.
    env = {"MN_FAIL_NODE": "c"}
    for name in "abc":
        job.start(name, nnodes="3", host=name == "a", extra=("--max-restarts", "3"), env=env)
    wait_until(
        lambda: any(r["TORCHELASTIC_RESTART_COUNT"] == "1" for r in job.records("c")),
        START_S,
        interval_s=0.1,
        message=job.report,
    )
    job.wait_running(["a", "b", "c"], 3)
    after = {n: _worker_group_rank(job, n) for n in "abc"}
    job.go()
    for name in "abc":
        assert job.wait_exit(name) == 0, job.report()
    ranks = {n: _group_ranks(job.nodes[n]) for n in "abc"}
    assert all(len(r) == 2 for r in ranks.values()), ranks
    assert sorted(r[0] for r in ranks.values()) == [0, 1, 2], ranks
    assert sorted(r[1] for r in ranks.values()) == [0, 1, 2], ranks
    suspect_before, suspect_after = ranks["c"]
    assert suspect_after == (suspect_before + 1) % 3, ranks
    swapped = [n for n in "ab" if ranks[n][0] == suspect_after]
    assert [ranks[n][1] for n in swapped] == [suspect_before], ranks
    assert all(r[0] == r[1] for n, r in ranks.items() if n not in ("c", *swapped)), ranks
    assert after == {n: r[1] for n, r in ranks.items()}, (after, ranks)
    job.assert_no_survivors()


def test_survivors_of_a_node_loss_keep_their_order_and_move_least(
    make_job: Any, backend: tuple[str, str]
) -> None:
    job = make_job(backend)
    for name in "abc":
        job.start(name, nnodes="2:3", conf=FAST_CONF, host=name == "a")
    job.wait_running(["a", "b", "c"], 3)
    before = {n: _worker_group_rank(job, n) for n in "abc"}
    # Kill a node below the top rank, so the ranks above it must compact: the middle one
    # where it is not the c10d store's host (a), else the lowest other one.
    candidates = [n for n in "bc"] if backend[0] == "c10d" else list("abc")
    middle = [n for n in candidates if before[n] == 1]
    victim = middle[0] if middle else min(candidates, key=lambda n: before[n])
    node = job.nodes[victim]
    node.remember_descendants()
    victim_workers = {int(r["pid"]) for r in job.records(victim)}
    os.kill(node.proc.pid, signal.SIGKILL)
    assert node.proc.wait(timeout=EXIT_S) == -signal.SIGKILL
    wait_until(lambda: not any(is_alive(p) for p in victim_workers), 10.0)

    survivors = sorted((n for n in "abc" if n != victim), key=lambda n: before[n])
    job.wait_running(survivors, 2)
    after = {n: _worker_group_rank(job, n) for n in survivors}
    # Relative order kept; with two of three left that leaves ranks 0 and 1 in the old order,
    # and a survivor that held rank 0 keeps it.
    assert [after[n] for n in survivors] == [0, 1], (before, victim, after)
    changed = sum(after[n] != before[n] for n in survivors)
    assert changed == sum(before[n] != i for i, n in enumerate(survivors)), (before, after)
    job.go()
    for name in survivors:
        assert job.wait_exit(name) == 0, job.report()
        assert _group_ranks(job.nodes[name])[-1] == after[name]
    job.assert_no_survivors()


def test_a_newcomer_takes_the_highest_rank_and_the_others_keep_theirs(
    make_job: Any, backend: tuple[str, str]
) -> None:
    job = make_job(backend)
    job.start("a", nnodes="2:3", conf=FAST_CONF, host=True)
    job.start("b", nnodes="2:3", conf=FAST_CONF)
    job.wait_running(["a", "b"], 2)
    before = {n: _worker_group_rank(job, n) for n in "ab"}
    job.start("c", nnodes="2:3", conf=FAST_CONF)
    job.wait_running(["a", "b", "c"], 3)
    after = {n: _worker_group_rank(job, n) for n in "abc"}
    assert after == {**before, "c": 2}, (before, after)
    job.go()
    for name in "abc":
        assert job.wait_exit(name) == 0, job.report()
    for name in "ab":
        # One rank in every round (a newcomer may cost more than one re-form under load).
        ranks = _group_ranks(job.nodes[name])
        assert len(ranks) >= 2 and set(ranks) == {before[name]}, (name, ranks)
    job.assert_no_survivors()
