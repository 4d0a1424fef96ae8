"""Progress in the agent's own endpoints: /metrics exports each rank's beats and step time, and
/status carries each worker's progress (the real command, a standalone job, no torch)."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import cli_harness
import pytest
from cli_harness import Launch
from prometheus_client.parser import text_string_to_metric_families

from elastic_run.agent.health.server import render_metrics
from tests.helpers import free_port, wait_until
from tests.unit.test_agent_metrics import EXPECTED_TYPES

launch = cli_harness.launch

BEATER = """\
import sys, time
from pathlib import Path
from elastic_run.worker import progress
out = Path(sys.argv[1])
for step in range(20):
    time.sleep(0.05)
    progress(step)
(out / "beaten").write_text("1")
while not (out / "go").exists():
    time.sleep(0.05)
"""


def _get(port: int, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def test_render_metrics_keeps_labels_and_types_each_family_once() -> None:
    text = render_metrics({'beats{rank="0"}': 3, 'beats{rank="1"}': 4, "round": 2})
    assert text.splitlines() == [
        "# HELP elastic_run_beats elastic_run_beats",
        "# TYPE elastic_run_beats gauge",
        'elastic_run_beats{rank="0"} 3.0',
        'elastic_run_beats{rank="1"} 4.0',
        "# HELP elastic_run_round elastic_run_round",
        "# TYPE elastic_run_round gauge",
        "elastic_run_round 2.0",
    ]


@pytest.mark.timeout(180)
def test_metrics_and_status_show_each_ranks_progress(launch: Launch, tmp_path: Path) -> None:
    worker = tmp_path / "beater.py"
    worker.write_text(BEATER)
    port = free_port()
    agent = launch(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--health-check-port",
            str(port),
            str(worker),
            str(tmp_path),
        ]
    )
    wait_until(lambda: (tmp_path / "beaten").exists(), 120, message=agent.describe)

    def twenty_beats() -> bool:
        # Both ranks: "beaten" is written by the first to finish, the other may be behind.
        text = _get(port, "/metrics")
        return all(
            f'elastic_run_progress_beats{{local_rank="{r}",rank="{r}"}} 20.0' in text
            for r in (0, 1)
        )

    wait_until(twenty_beats, 60, interval_s=0.2, message=lambda: _get(port, "/metrics"))
    metrics = _get(port, "/metrics")
    assert 'elastic_run_progress_step{local_rank="0",rank="0"} 19.0' in metrics
    assert 'elastic_run_step_time_seconds{local_rank="0",rank="0"}' in metrics
    assert 'elastic_run_hang_timeout_seconds{local_rank="0",rank="0"} 30.0' in metrics  # floor
    assert 'elastic_run_hung{local_rank="0",rank="0"} 0.0' in metrics
    assert metrics.count("# TYPE elastic_run_progress_beats gauge") == 1
    # The real agent's text through prometheus-client's own parser: names, types, values.
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    types = {name: f.type for name, f in families.items() if not name.endswith("_created")}
    assert types == EXPECTED_TYPES, set(types) ^ set(EXPECTED_TYPES)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    assert samples[("elastic_run_rendezvous_rounds_total", ())] == 1
    assert samples[("elastic_run_rendezvous_duration_seconds_count", ())] == 1
    assert samples[("elastic_run_restart_duration_seconds_count", ())] == 0
    assert samples[("elastic_run_node_verdicts_total", (("verdict", "excluded"),))] == 0
    status = json.loads(_get(port, "/status"))
    progress = status["workers"][1]["progress"]
    assert progress["beats"] == 20 and progress["step"] == 19 and progress["verdict"] == ""
    (tmp_path / "go").touch()
    assert agent.wait(120) == 0, agent.describe()
