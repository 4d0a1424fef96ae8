"""The goodput account end to end: the real CLI, two gloo DDP workers whose rank 1 fails twice
(``scripts/bench_workers/steady_failures.py``), restarted twice under ``--max-restarts 2``.

The summary line on stderr and the ``goodput`` event at the end of ``events.jsonl`` carry the
node's account: its parts add up to its wall time, it counts the two restarts, each of which
lost time in every phase the agent waited through. No timed assertion: structure and
consistency only (the figures against outside clocks are ``scripts/bench_goodput.py``'s).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from elastic_run.agent.loop.goodput import RESTART_PHASES
from tests.helpers import run_cli

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_workers" / "steady_failures.py"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, object]]]:
    tmp_path = tmp_path_factory.mktemp("goodput")
    log_dir = tmp_path / "logs"
    proc = run_cli(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "2",
            "--no-live",
            "--log-dir",
            str(log_dir),
            str(SCRIPT),
        ],
        env={"STEPS": "15", "STEP_S": "0.02", "FAIL_STEP": "5", "FAILURES": "2"},
        timeout_s=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = log_dir.iterdir()
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return proc.stderr, [json.loads(line) for line in lines]


def test_the_last_event_is_the_account_and_its_parts_add_up(
    job: tuple[str, list[dict[str, object]]],
) -> None:
    _, events = job
    kinds = [e["kind"] for e in events]
    assert kinds.count("restart") == 2, kinds
    assert kinds[-1] == "goodput", kinds
    account = events[-1]["fields"]
    assert isinstance(account, dict)
    assert account["v"] == 1 and account["ended"] is True and account["nodes"] == 1
    assert account["restart_count"] == 2
    lost = account["lost"]
    assert set(lost) == {"startup", "stall", "end", *(f"restart.{p}" for p in RESTART_PHASES)}
    assert all(v >= 0 for v in lost.values()), lost
    assert account["lost_s"] == pytest.approx(sum(lost.values()), abs=0.01)
    assert account["training_s"] + account["lost_s"] == pytest.approx(account["wall_s"], abs=0.01)
    assert account["training_s"] > 0 and lost["startup"] > 0
    assert account["share"] == pytest.approx(account["training_s"] / account["wall_s"], abs=1e-3)


def test_each_restart_lost_time_in_each_phase_it_went_through(
    job: tuple[str, list[dict[str, object]]],
) -> None:
    _, events = job
    account = events[-1]["fields"]
    assert isinstance(account, dict)
    restarts = account["restarts"]
    assert len(restarts) == 2
    for cost in restarts:
        assert cost["cause"] == "failure"
        assert cost["lost_s"] > 0, cost
        # waits the agent always makes (detection and stop may round to 0 ms)
        for phase in ("rendezvous", "worker_start", "first_beat"):
            assert cost[f"{phase}_s"] > 0, cost
        parts = sum(cost[f"{p}_s"] for p in RESTART_PHASES)
        assert cost["lost_s"] == pytest.approx(parts, abs=0.01)


def test_the_summary_line_says_the_same(job: tuple[str, list[dict[str, object]]]) -> None:
    stderr, events = job
    account = events[-1]["fields"]
    assert isinstance(account, dict)
    (line,) = [x for x in stderr.splitlines() if x.startswith("elastic-run: goodput ")]
    match = re.match(r"elastic-run: goodput ([\d.]+)%: training ([\d.]+) s of ([\d.]+) s", line)
    assert match is not None, line
    assert float(match[1]) == pytest.approx(100 * account["share"], abs=0.1)
    assert float(match[3]) == pytest.approx(account["wall_s"], abs=0.1)
    assert "2 restarts" in line
