"""A job-ending worker failure caused by a lost member does not end the job (issue 26).

When a node's agent dies, its workers' peers fail in their collectives at once, often before
any watcher has judged the node gone. With its restarts used up (``--max-restarts 0``, the
default), a surviving agent that counted that failure ended the whole job although the round
could go on without the lost node. ``report_failure(last_restart=True)`` now looks at the
round's members first, and so does every ``report_failure()`` (issue 38): with restarts left,
such a failure spent a restart of the job for a loss that is nobody's.

Real processes on a real TCPStore: three nodes, each a subprocess holding a handler built
through the public registry. The lost node is stopped with SIGSTOP (a hung host: its sockets
stay open, so no death notice; only its heartbeat, 1 s budget here, convicts it), which makes
the order deterministic: without the look, the report wins the race by a second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import LostRecord, decode
from elastic_run.rendezvous.registry import create_backend
from tests.helpers import REPO_ROOT, freeze

pytestmark = pytest.mark.timeout(120)

# A 1 s heartbeat budget. The round forms when the third node arrives (max 3): the last call
# only has to outlast the spread of the nodes' starts, which on a loaded machine exceeded 1 s
# (each imports torch), and a round of two then left the third waiting for the next one.
FAST = {"keep_alive_interval": "0.25", "keep_alive_max_attempt": "4", "last_call_timeout": "60"}

_NODE = """
import json, sys
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.registry import rendezvous_handler_registry
spec = json.loads(sys.argv[1])
params = RendezvousParameters("c10d", spec["endpoint"], spec["run_id"], 2, 3,
                              local_addr="127.0.0.1", **spec["conf"])
handler = rendezvous_handler_registry.create_handler(params)
info = handler.next_rendezvous()
print(json.dumps({"node": handler.node_id, "rank": info.rank, "round": info.round}), flush=True)
for line in sys.stdin:
    if line.strip() in ("report-last", "report"):
        counted = handler.report_failure(last_restart=line.strip() == "report-last")
        print(json.dumps({"counted": counted}), flush=True)
handler.shutdown()
"""


class Node:
    def __init__(self, endpoint: str, run_id: str) -> None:
        spec = json.dumps({"endpoint": endpoint, "run_id": run_id, "conf": FAST})
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _NODE, spec],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR"),
        )
        self.joined: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"node exited with {self.proc.poll()}"
        return dict(json.loads(line))

    def report_last(self) -> bool:
        return self.report("report-last")

    def report(self, how: str = "report") -> bool:
        """Report a worker failure (``report-last``: on the last restart); whether it counted."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(how + "\n")
        self.proc.stdin.flush()
        return bool(self.read()["counted"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # SIGKILL ends a stopped process too
        self.proc.wait(30)


@pytest.fixture
def job() -> Iterator[tuple[str, str, list[Node]]]:
    from torch.distributed import TCPStore

    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    endpoint, run_id = f"127.0.0.1:{server.port}", f"loss-{uuid.uuid4().hex[:8]}"
    nodes = [Node(endpoint, run_id) for _ in range(3)]
    try:
        for node in nodes:
            node.joined = node.read()
        yield endpoint, run_id, nodes
    finally:
        for node in nodes:
            node.kill()


def _lost(endpoint: str, run_id: str, r: int) -> LostRecord:
    reader = create_backend(
        RendezvousParameters("c10d", endpoint, run_id, 1, 1, is_host="false"),
        allow_hosting=False,
    )
    raw = reader.get(keys.lost(r))
    assert raw is not None, f"round {r} has no end record"
    return decode(LostRecord, keys.lost(r), raw)


def test_a_last_restart_failure_while_a_member_hangs_ends_the_round_for_the_member(
    job: tuple[str, str, list[Node]],
) -> None:
    endpoint, run_id, nodes = job
    assert sorted(n.joined["rank"] for n in nodes) == [0, 1, 2]
    r = nodes[0].joined["round"]
    hung, reporter = nodes[1], nodes[2]
    freeze(hung.proc.pid)
    assert reporter.report_last() is False  # not counted: the job goes on
    why = _lost(endpoint, run_id, r)
    assert why.reason == "member_lost"
    assert why.node_ids == (hung.joined["node"],)


def test_a_last_restart_failure_with_every_member_alive_counts(
    job: tuple[str, str, list[Node]],
) -> None:
    endpoint, run_id, nodes = job
    r = nodes[0].joined["round"]
    reporter = nodes[2]
    assert reporter.report_last() is True
    why = _lost(endpoint, run_id, r)
    assert why.reason == "worker_failure"
    assert why.by == reporter.joined["node"]


def test_a_failure_with_restarts_left_while_a_member_hangs_spends_no_restart(
    job: tuple[str, str, list[Node]],
) -> None:
    endpoint, run_id, nodes = job
    r = nodes[0].joined["round"]
    hung, reporter = nodes[0], nodes[1]
    freeze(hung.proc.pid)
    assert reporter.report() is False  # not counted: no restart spent
    why = _lost(endpoint, run_id, r)
    assert (why.reason, why.node_ids) == ("member_lost", (hung.joined["node"],))
    reader = create_backend(
        RendezvousParameters("c10d", endpoint, run_id, 1, 1, is_host="false"),
        allow_hosting=False,
    )
    assert reader.read_counter(keys.RESTARTS) == 0


def test_a_failure_with_restarts_left_and_every_member_alive_counts_at_once(
    job: tuple[str, str, list[Node]],
) -> None:
    endpoint, run_id, nodes = job
    r = nodes[0].joined["round"]
    assert nodes[0].report() is True
    why = _lost(endpoint, run_id, r)
    assert (why.reason, why.by) == ("worker_failure", nodes[0].joined["node"])
