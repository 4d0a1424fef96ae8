"""The live panel's feed (``cli/live_feed.py``) reads what the panel must not: a real worker's
CPU and memory through /proc, and the rendezvous picture, keeping the last picture when the
store fails."""

from __future__ import annotations

import subprocess
import sys

from elastic_run.agent.loop.snapshot import AgentSnapshot, WorkerSnapshot
from elastic_run.cli.live_feed import LiveFeed
from elastic_run.errors import ElasticRunError
from elastic_run.rendezvous.api import RendezvousSnapshot


def _snapshot(pid: int | None) -> AgentSnapshot:
    workers = (WorkerSnapshot(local_rank=0, rank=0, pid=pid, state="HEALTHY"),)
    return AgentSnapshot("job", "c10d", "", "HEALTHY", 0, 0, 1, 1, 0, 0, workers)


def test_the_feed_reads_a_real_workers_usage_and_keeps_the_last_picture() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; x = bytearray(32 << 20); time.sleep(60)"]
    )
    try:
        pictures = [RendezvousSnapshot.__new__(RendezvousSnapshot)]
        calls = {"n": 0}

        def read() -> RendezvousSnapshot | None:
            calls["n"] += 1
            if calls["n"] > 1:
                raise ElasticRunError("the store does not answer")
            return pictures[0]

        feed = LiveFeed(lambda: _snapshot(proc.pid), read)
        first = feed.read_once()
        assert first.rendezvous is pictures[0] and first.rendezvous_error == ""
        assert proc.pid in first.usage and first.usage[proc.pid].rss_bytes > 0
        second = feed.read_once()
        assert second.rendezvous is pictures[0]  # the last picture stays
        assert second.rendezvous_error == "the store does not answer"
        assert feed.picture() is second
    finally:
        proc.kill()
        proc.wait()
    gone = LiveFeed(lambda: _snapshot(proc.pid)).read_once()
    assert gone.usage == {} and gone.rendezvous is None
