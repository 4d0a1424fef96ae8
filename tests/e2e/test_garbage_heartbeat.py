"""Garbage under a node's heartbeat key drops no node and stops no reader (issue 19, 2.4).

Two real ``elastic-run`` agents on a TCPStore hosted by the test. While the round forms and
while the job trains, a real TCPStore client writes garbage (a new value each time) over each
node's ``hb/<node id>``, as anything that can write to the store could. The nodes still beat
(their next beat overwrites the garbage), so neither may be dropped: one round, both workers
at WORLD_SIZE 2, both agents exit 0. A warning names the key ``hb/<node id>``.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import cli_harness
import pytest
from cli_harness import Launch, only_run_dir, read_events

from tests.helpers import wait_until

launch = cli_harness.launch
RUN = 90.0
CONF = "is_host=false,keep_alive_interval=0.25,keep_alive_max_attempt=4,last_call_timeout=2"

_WORKER = """
import os, sys, time
from pathlib import Path
out = Path(sys.argv[1])
(out / f"ran-{os.environ['RANK']}-{os.environ['WORLD_SIZE']}").write_text(str(os.getpid()))
while not (out / "stop").exists():
    time.sleep(0.05)
"""


@pytest.fixture(name="store")
def store_fixture() -> Iterator[Any]:
    import torch.distributed as dist

    server = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    yield server


class _Forger:
    """Writes fresh garbage over every arrived node's heartbeat key until stopped."""

    def __init__(self, store: Any, run_id: str) -> None:
        import torch.distributed as dist

        self._job = dist.PrefixStore(f"elastic-run/{run_id}/", store)
        self._stop = threading.Event()
        self.node_ids: set[str] = set()
        self.writes = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            for i in range(2):
                key = f"r0/node/{i}"
                if len(self.node_ids) <= i and self._job.check([key]):
                    self.node_ids.add(json.loads(self._job.get(key))["node_id"])
            for node_id in self.node_ids:
                self._job.set(f"hb/{node_id}", f"\x00garbage {self.writes}".encode())
                self.writes += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_garbage_heartbeats_drop_no_node(launch: Launch, tmp_path: Path, store: Any) -> None:
    run_id = f"hb-{uuid.uuid4().hex[:8]}"
    worker = tmp_path / "worker.py"
    worker.write_text(_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    forger = _Forger(store, run_id)
    agents = []
    try:
        for n in range(2):
            args = ["--nnodes", "2:3", "--rdzv-backend", "c10d"]
            args += ["--rdzv-endpoint", f"127.0.0.1:{store.port}", "--rdzv-id", run_id]
            args += ["--rdzv-conf", CONF, "--local-addr", "127.0.0.1"]
            args += ["--log-dir", str(tmp_path / f"logs{n}"), "--no-live", str(worker), str(out)]
            agents.append(launch(args, name=f"node{n}"))

        def describe() -> str:
            return "\n".join(a.describe() for a in agents)

        ran = {out / "ran-0-2", out / "ran-1-2"}
        wait_until(
            lambda: ran <= set(out.iterdir()) or any(a.proc.poll() is not None for a in agents),
            RUN,
            message=describe,
        )
        # Keep forging for several heartbeat budgets (1 s) while the job trains.
        seen = forger.writes
        wait_until(lambda: forger.writes >= seen + 600, RUN, message=describe)
    finally:
        forger.stop()
    (out / "stop").write_text("")
    for agent in agents:
        assert agent.wait(RUN) == 0, describe()
    assert sorted(p.name for p in out.iterdir()) == ["ran-0-2", "ran-1-2", "stop"]
    for n in range(2):
        events = read_events(only_run_dir(tmp_path / f"logs{n}"))
        kinds = [e["kind"] for e in events]
        assert kinds.count("rendezvous.complete") == 1, (n, kinds)
    warned = "".join(a.stderr for a in agents)
    assert "'hb/" in warned and "not an integer" in warned, describe()
    assert "Traceback" not in warned
