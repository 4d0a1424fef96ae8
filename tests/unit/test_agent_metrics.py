"""The agent's Prometheus metrics (elastic_run/agent/health/metrics.py), fed events on a fake
clock and a hand-built snapshot, read back through prometheus-client's own parser: every
family's name, type and HELP, the counters' and histograms' values, and what the snapshot gives.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from elastic_run.agent.events import AgentEvent
from elastic_run.agent.health.metrics import AgentMetrics
from elastic_run.agent.loop.goodput import GoodputAccount
from elastic_run.agent.loop.snapshot import AgentSnapshot, WorkerProgress, WorkerSnapshot

# name (as the parser gives it: a counter without _total) -> type, for every family.
EXPECTED_TYPES = {
    "elastic_run_restarts": "counter",
    "elastic_run_max_restarts": "gauge",
    "elastic_run_round": "gauge",
    "elastic_run_group_rank": "gauge",
    "elastic_run_group_world_size": "gauge",
    "elastic_run_world_size": "gauge",
    "elastic_run_workers_running": "gauge",
    "elastic_run_rendezvous_rounds": "counter",
    "elastic_run_rendezvous_duration_seconds": "histogram",
    "elastic_run_restart_duration_seconds": "histogram",
    "elastic_run_worker_failures": "counter",
    "elastic_run_worker_hangs": "counter",
    "elastic_run_watchdog_expiries": "counter",
    "elastic_run_node_verdicts": "counter",
    "elastic_run_progress_beats": "gauge",
    "elastic_run_progress_step": "gauge",
    "elastic_run_step_time_seconds": "gauge",
    "elastic_run_work_time_seconds": "gauge",
    "elastic_run_last_beat_age_seconds": "gauge",
    "elastic_run_hang_timeout_seconds": "gauge",
    "elastic_run_hung": "gauge",
    "elastic_run_goodput_ratio": "gauge",
    "elastic_run_goodput_wall_seconds": "gauge",
    "elastic_run_goodput_training_seconds": "gauge",
    "elastic_run_goodput_lost_seconds_total": "gauge",
    "elastic_run_goodput_restarts": "gauge",
    "elastic_run_goodput_lost_seconds": "gauge",
}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _snapshot(restarts: int = 2) -> AgentSnapshot:
    progress = WorkerProgress(
        beats=20, step=19, step_time_s=0.05, last_beat_age_s=0.2, timeout_s=30.0, verdict="hung"
    )
    return AgentSnapshot(
        run_id="job",
        backend="c10d",
        endpoint="127.0.0.1:1",
        state="HEALTHY",
        round=3,
        group_rank=1,
        group_world_size=2,
        world_size=4,
        restarts=restarts,
        max_restarts=5,
        workers=(
            WorkerSnapshot(2, 2, 11, "HEALTHY", progress=progress),
            WorkerSnapshot(3, 3, 12, "FAILED", exitcode=1, progress=WorkerProgress()),
        ),
        goodput=GoodputAccount(wall_s=10.0, training_s=6.0, stall_s=1.0, startup_s=3.0, end_s=0.0),
    )


def _families(text: bytes) -> dict[str, object]:
    """The families, less prometheus-client's ``*_created`` gauges (each counter's and
    histogram's creation time, which the text format shows as a family of its own)."""
    return {
        f.name: f
        for f in text_string_to_metric_families(text.decode())
        if not f.name.endswith("_created")
    }


def _value(text: bytes, sample_name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.name == sample_name and sample.labels == labels:
                return float(sample.value)
    raise AssertionError(f"no sample {sample_name}{labels} in:\n{text.decode()}")


def _feed(metrics: AgentMetrics, clock: Clock) -> None:
    """One job's events: a 0.5 s first round, a failure, a restart of 4 s with a 2 s round."""
    steps: list[tuple[float, str, dict[str, object]]] = [
        (0.0, "agent.started", {}),
        (0.0, "rendezvous.joining", {"attempt": 0}),
        (0.5, "rendezvous.complete", {"round": 1}),
        (0.1, "workers.started", {}),
        (9.0, "worker.failed", {"local_rank": 3}),
        (0.0, "worker.hung", {"rank": 2}),
        (0.0, "watchdog.expired", {"pid": 11}),
        (0.5, "workers.stopped", {"reason": "failure"}),
        (1.0, "restart", {"restarts": 1}),
        (0.0, "rendezvous.joining", {"attempt": 1}),
        (2.0, "rendezvous.complete", {"round": 2}),
        (1.0, "workers.started", {}),
        (0.0, "node.suspect", {"failures": 1}),
        (0.0, "node.nonsense", {"verdict": "x"}),  # unknown: not counted, no error
        (0.0, "some.future.kind", {"x": object()}),
    ]
    for advance_s, kind, fields in steps:
        clock.now += advance_s
        metrics(AgentEvent(kind, kind, dict(fields)))


def test_every_family_has_its_name_type_and_help_as_the_parser_reads_them() -> None:
    clock = Clock()
    metrics = AgentMetrics(_snapshot, clock=clock)
    _feed(metrics, clock)
    text = metrics.render()
    families = _families(text)
    assert {name: f.type for name, f in families.items()} == EXPECTED_TYPES  # type: ignore[attr-defined]
    for name, family in families.items():
        assert family.documentation and family.documentation != name, name  # type: ignore[attr-defined]


def test_counters_and_histograms_count_the_events() -> None:
    clock = Clock()
    metrics = AgentMetrics(_snapshot, clock=clock)
    _feed(metrics, clock)
    text = metrics.render()
    assert _value(text, "elastic_run_restarts_total") == 2  # the snapshot's job count
    assert _value(text, "elastic_run_rendezvous_rounds_total") == 2
    assert _value(text, "elastic_run_worker_failures_total") == 1
    assert _value(text, "elastic_run_worker_hangs_total") == 1
    assert _value(text, "elastic_run_watchdog_expiries_total") == 1
    assert _value(text, "elastic_run_node_verdicts_total", verdict="suspect") == 1
    assert _value(text, "elastic_run_node_verdicts_total", verdict="excluded") == 0
    rdzv = "elastic_run_rendezvous_duration_seconds"
    assert _value(text, rdzv + "_count") == 2
    assert _value(text, rdzv + "_sum") == 2.5
    assert _value(text, rdzv + "_bucket", le="0.5") == 1
    assert _value(text, rdzv + "_bucket", le="2.5") == 2
    restart = "elastic_run_restart_duration_seconds"
    assert _value(text, restart + "_count") == 1  # the first start is no restart
    assert _value(text, restart + "_sum") == 4.0  # stopped -> started: 1 + 2 + 1 s


def test_node_verdicts_are_exposed_at_zero_before_any_event() -> None:
    text = AgentMetrics(_snapshot).render()
    for verdict in ("suspect", "excluded"):
        assert _value(text, "elastic_run_node_verdicts_total", verdict=verdict) == 0
    assert _value(text, "elastic_run_rendezvous_duration_seconds_count") == 0


def test_gauges_are_the_snapshots_at_each_render() -> None:
    current = [_snapshot(restarts=0)]
    metrics = AgentMetrics(lambda: current[0])
    text = metrics.render()
    assert _value(text, "elastic_run_restarts_total") == 0
    assert _value(text, "elastic_run_round") == 3
    assert _value(text, "elastic_run_group_rank") == 1
    assert _value(text, "elastic_run_world_size") == 4
    assert _value(text, "elastic_run_workers_running") == 1
    ranks = {"rank": "2", "local_rank": "2"}
    assert _value(text, "elastic_run_progress_beats", **ranks) == 20
    assert _value(text, "elastic_run_progress_step", **ranks) == 19
    assert _value(text, "elastic_run_step_time_seconds", **ranks) == 0.05
    assert _value(text, "elastic_run_hung", **ranks) == 1
    assert _value(text, "elastic_run_hung", rank="3", local_rank="3") == 0
    assert _value(text, "elastic_run_goodput_ratio") == 0.6
    assert _value(text, "elastic_run_goodput_lost_seconds_total") == 4.0
    assert _value(text, "elastic_run_goodput_lost_seconds", cause="startup") == 3.0
    current[0] = _snapshot(restarts=3)  # a new picture published: the next scrape shows it
    assert _value(metrics.render(), "elastic_run_restarts_total") == 3


def test_a_snapshot_without_progress_or_goodput_leaves_those_families_out() -> None:
    bare = AgentSnapshot("job", "c10d", "", "INIT", -1, -1, -1, -1, 0, 3)
    names = set(_families(AgentMetrics(lambda: bare).render()))
    assert "elastic_run_progress_beats" not in names
    assert "elastic_run_goodput_ratio" not in names
    assert "elastic_run_round" in names
