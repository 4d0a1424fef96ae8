"""What the live panel shows beyond the agent's snapshot, read by its own thread once a second.

The panel draws on rich's refresh thread, which must never wait on a store or read ``/proc``.
:class:`LiveFeed` does both on a thread of its own, at most once a second: the rendezvous
picture (one read of the backend: members, waiting nodes, the round's state) and each local
worker's CPU share and resident memory (psutil, for the pids in the agent's last snapshot). It
publishes one frozen :class:`FeedPicture`, replaced whole; the panel only reads that.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil

from elastic_run.agent.loop.snapshot import AgentSnapshot
from elastic_run.errors import ElasticRunError
from elastic_run.rendezvous.api import RendezvousSnapshot

__all__ = ["FeedPicture", "LiveFeed", "Usage"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Usage:
    """One worker's share of the machine.

    Attributes:
        cpu_percent: its CPU over the last second (100 = one core).
        rss_bytes: its resident memory.
    """

    cpu_percent: float
    rss_bytes: int


@dataclass(frozen=True)
class FeedPicture:
    """What the feed read last.

    Attributes:
        rendezvous: the rendezvous picture (None: not read yet, or not shown).
        rendezvous_error: why the last read failed ("" when it did not).
        usage: pid -> its usage.
    """

    rendezvous: RendezvousSnapshot | None = None
    rendezvous_error: str = ""
    usage: Mapping[int, Usage] = field(default_factory=dict)


class LiveFeed:
    """The live panel's reader thread.

    Args:
        snapshot: the agent's published snapshot (its workers' pids).
        rendezvous: reads the rendezvous picture (None: not shown).
        interval_s: between two reads.
    """

    def __init__(
        self,
        snapshot: Callable[[], AgentSnapshot],
        rendezvous: Callable[[], RendezvousSnapshot | None] | None = None,
        interval_s: float = 1.0,
    ) -> None:
        self._snapshot = snapshot
        self._rendezvous = rendezvous
        self._interval_s = interval_s
        self._picture = FeedPicture()
        self._procs: dict[int, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def picture(self) -> FeedPicture:
        """The last picture (any thread)."""
        return self._picture

    def start(self) -> None:
        """Start reading."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="live-feed", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop reading (a bounded join). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.read_once()
            except Exception:  # never let a bug end the panel's feed silently
                log.exception("reading the live panel's feed failed")
            self._stop.wait(self._interval_s)

    def read_once(self) -> FeedPicture:
        """Read the rendezvous and the workers' usage once; publish and return the picture."""
        last = self._picture
        rdzv, error = last.rendezvous, ""
        if self._rendezvous is not None:
            try:
                rdzv = self._rendezvous()
            except ElasticRunError as exc:
                error = str(exc)  # shown in the panel; the last picture stays
        pids = {w.pid for w in self._snapshot().workers if w.pid is not None}
        usage = {pid: u for pid in sorted(pids) if (u := self._usage(pid)) is not None}
        for gone in set(self._procs) - pids:
            del self._procs[gone]
        self._picture = FeedPicture(rdzv, error, usage)
        return self._picture

    def _usage(self, pid: int) -> Usage | None:
        try:
            proc = self._procs.get(pid)
            if proc is None:
                proc = self._procs[pid] = psutil.Process(pid)
                proc.cpu_percent(None)  # the first call starts the measure
            return Usage(proc.cpu_percent(None), int(proc.memory_info().rss))
        except (psutil.Error, OSError):
            self._procs.pop(pid, None)
            return None
