"""The agent's Prometheus metrics: one owner, fed on the loop's thread, rendered by ``/metrics``.

Two kinds of value, one ``prometheus_client.CollectorRegistry``:

- **Counted from events** (the owner is an event sink: the loop hands it every event on its own
  thread, posted ones included): rendezvous rounds, worker failures, hangs, watchdog expiries,
  node verdicts (counters), and two histograms: each rendezvous (``rendezvous.joining`` to
  ``rendezvous.complete``) and each restart (the agent stopping its workers, ``workers.stopped``,
  to its new workers' start, ``workers.started``), timed on the monotonic clock as the events
  arrive.
- **Read from the published snapshot** at each scrape (a collector over ``snapshot_fn``, the
  agent's immutable :class:`~elastic_run.agent.loop.snapshot.AgentSnapshot`): the job's restart
  count (a counter: it only grows), the round and ranks, running workers, each rank's progress
  beats, and the goodput account.

Views read snapshots only: the HTTP thread renders the registry and reads the last published
snapshot, nothing else; it computes nothing of the agent's, reads no live state, emits nothing.

Names (``elastic_run_`` prefix; ``rank``/``local_rank`` labels on per-rank families):

=========================================  =========  ====================================
name                                       type       value
=========================================  =========  ====================================
restarts_total                             counter    the job's restarts so far
max_restarts                               gauge      restarts allowed
round, group_rank, group_world_size,       gauge      this node's place in the round
world_size, workers_running
rendezvous_rounds_total                    counter    rounds this node completed
rendezvous_duration_seconds                histogram  each rendezvous of this node
restart_duration_seconds                   histogram  stop of the workers to their restart
worker_failures_total                      counter    local groups failed (``worker.failed``)
worker_hangs_total                         counter    workers judged hung (``worker.hung``)
watchdog_expiries_total                    counter    watchdog kills (``watchdog.expired``)
node_verdicts_total{verdict}               counter    node verdicts (``suspect``, ``excluded``)
progress_beats, progress_step,             gauge      each rank's progress (per attempt)
step_time_seconds, work_time_seconds,
last_beat_age_seconds,
hang_timeout_seconds, hung
goodput_ratio, goodput_wall_seconds,       gauge      the goodput account
goodput_training_seconds,
goodput_lost_seconds_total,
goodput_lost_seconds{cause},
goodput_restarts
=========================================  =========  ====================================

``node_verdicts_total`` counts this node's verdicts on itself (``node.suspect``,
``node.excluded`` events), exposed at 0 for both until one comes.

Invariants: ``on_event`` never raises for an event of an unknown kind or shape; ``render`` is
safe on any thread (prometheus_client's values are locked) and reads only the snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from elastic_run.agent.events import AgentEvent
from elastic_run.agent.loop.snapshot import AgentSnapshot

__all__ = ["NODE_VERDICTS", "PREFIX", "AgentMetrics"]

PREFIX = "elastic_run_"
NODE_VERDICTS = ("suspect", "excluded")
_RANK_LABELS = ("rank", "local_rank")
# A rendezvous takes from tens of milliseconds (one node) to its join timeout (600 s default).
_RENDEZVOUS_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# A restart: a second or two (warm, one node) to minutes (a large job re-forming).
_RESTART_BUCKETS_S = (0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)


class AgentMetrics:
    """The agent's metrics: an event sink for the loop, a renderer for the health server.

    Args:
        snapshot_fn: returns the agent's last published snapshot (``agent.snapshot``).
        clock: the monotonic clock the durations are timed on.
    """

    def __init__(
        self,
        snapshot_fn: Callable[[], AgentSnapshot],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self.registry = CollectorRegistry(auto_describe=False)
        """The registry ``/metrics`` renders (one per agent: never the process-global one)."""
        reg = self.registry
        self._rounds = Counter(
            PREFIX + "rendezvous_rounds", "Rendezvous rounds this node completed.", registry=reg
        )
        self._failures = Counter(
            PREFIX + "worker_failures",
            "Times this node's local worker group failed (a worker exited non-zero).",
            registry=reg,
        )
        self._hangs = Counter(
            PREFIX + "worker_hangs",
            "Workers judged hung (silent past their hang timeout) and killed.",
            registry=reg,
        )
        self._expiries = Counter(
            PREFIX + "watchdog_expiries",
            "Workers the file-timer watchdog killed because a timer expired.",
            registry=reg,
        )
        self._verdicts = Counter(
            PREFIX + "node_verdicts",
            "Verdicts on nodes of the job (suspect, excluded) this agent learned of.",
            ["verdict"],
            registry=reg,
        )
        for verdict in NODE_VERDICTS:
            self._verdicts.labels(verdict=verdict)  # exposed at 0 from the start
        self._rendezvous_s = Histogram(
            PREFIX + "rendezvous_duration_seconds",
            "Each rendezvous of this node, from joining to the round's completion.",
            buckets=_RENDEZVOUS_BUCKETS_S,
            registry=reg,
        )
        self._restart_s = Histogram(
            PREFIX + "restart_duration_seconds",
            "Each restart of this node's workers, from stopping them to starting the new ones.",
            buckets=_RESTART_BUCKETS_S,
            registry=reg,
        )
        reg.register(_SnapshotCollector(snapshot_fn))
        self._joining_at: float | None = None
        self._stopped_at: float | None = None

    def __call__(self, event: AgentEvent) -> None:
        """The event sink: count and time what ``event`` says (on the loop's thread)."""
        kind, now = event.kind, self._clock()
        if kind == "rendezvous.joining":
            self._joining_at = now
        elif kind == "rendezvous.complete":
            self._rounds.inc()
            if self._joining_at is not None:
                self._rendezvous_s.observe(max(0.0, now - self._joining_at))
                self._joining_at = None
        elif kind == "workers.stopped":
            self._stopped_at = now
        elif kind == "workers.started":
            if self._stopped_at is not None:
                self._restart_s.observe(max(0.0, now - self._stopped_at))
                self._stopped_at = None
        elif kind == "worker.failed":
            self._failures.inc()
        elif kind == "worker.hung":
            self._hangs.inc()
        elif kind == "watchdog.expired":
            self._expiries.inc()
        elif kind in ("node.suspect", "node.excluded"):
            self._verdicts.labels(verdict=kind.split(".", 1)[1]).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric (any thread)."""
        return generate_latest(self.registry)


class _SnapshotCollector(Collector):
    """The families read from the agent's published snapshot at each scrape."""

    def __init__(self, snapshot_fn: Callable[[], AgentSnapshot]) -> None:
        self._snapshot_fn = snapshot_fn

    def describe(self) -> list[Metric]:
        return []  # no collect() at registration: the snapshot is read at scrapes only

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot_fn()
        restarts = CounterMetricFamily(
            PREFIX + "restarts", "Restarts of the job's workers so far (the job's count)."
        )
        restarts.add_metric([], float(snap.restarts))
        yield restarts
        yield _gauge("max_restarts", "Restarts the job allows.", snap.max_restarts)
        yield _gauge("round", "The rendezvous round (-1 before the first).", snap.round)
        yield _gauge("group_rank", "This node's rank in the round (-1: none).", snap.group_rank)
        yield _gauge("group_world_size", "Nodes in the round.", snap.group_world_size)
        yield _gauge("world_size", "Workers in the job.", snap.world_size)
        running = sum(1 for w in snap.workers if w.state == "HEALTHY")
        yield _gauge("workers_running", "This node's workers running now.", running)
        yield from _progress_families(snap)
        yield from _goodput_families(snap)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, documentation, value=float(value))


# name -> (help, the WorkerProgress attribute); None values are left out.
_PROGRESS: dict[str, tuple[str, str]] = {
    "progress_beats": ("Progress beats of the rank this attempt.", "beats"),
    "progress_step": ("The rank's last named step (-1: none).", "step"),
    "step_time_seconds": ("The mean time between the rank's recent beats.", "step_time_s"),
    "work_time_seconds": ("The rank's own work per step (beat to sync_point).", "work_time_s"),
    "last_beat_age_seconds": ("Seconds since the rank's last beat.", "last_beat_age_s"),
    "hang_timeout_seconds": ("The silence after which the rank is hung.", "timeout_s"),
}


def _progress_families(snap: AgentSnapshot) -> Iterator[GaugeMetricFamily]:
    families = {
        name: GaugeMetricFamily(PREFIX + name, help_, labels=_RANK_LABELS)
        for name, (help_, _) in _PROGRESS.items()
    }
    hung = GaugeMetricFamily(
        PREFIX + "hung", "1 when the rank was judged hung this attempt.", labels=_RANK_LABELS
    )
    watched = False
    for worker in snap.workers:
        progress = worker.progress
        if progress is None:
            continue
        watched = True
        labels = [str(worker.rank), str(worker.local_rank)]
        for name, (_, attribute) in _PROGRESS.items():
            value: Any = getattr(progress, attribute)
            if value is not None:
                families[name].add_metric(labels, float(value))
        hung.add_metric(labels, 1.0 if progress.verdict == "hung" else 0.0)
    if watched:
        yield from families.values()
        yield hung


def _goodput_families(snap: AgentSnapshot) -> Iterator[GaugeMetricFamily]:
    acc = snap.goodput
    if acc is None:
        return
    yield _gauge("goodput_ratio", "Training's share of this node's wall time (0..1).", acc.share)
    yield _gauge("goodput_wall_seconds", "This node's wall time accounted.", acc.wall_s)
    yield _gauge("goodput_training_seconds", "Seconds of this node's training.", acc.training_s)
    yield _gauge("goodput_lost_seconds_total", "Seconds not training, all causes.", acc.lost_s)
    yield _gauge("goodput_restarts", "Restarts the goodput account counted.", acc.restart_count)
    lost = GaugeMetricFamily(
        PREFIX + "goodput_lost_seconds", "Seconds not training, by cause.", labels=["cause"]
    )
    for cause, seconds in acc.lost_by_cause().items():
        lost.add_metric([cause], seconds)
    yield lost
