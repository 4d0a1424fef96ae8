"""Hang verdicts and no-progress stops on a script that imports nothing of elastic_run, end to end:
the real CLI, two gloo DDP workers on 127.0.0.1 (``scripts/ddp_no_import.py``), whose only
progress beats come from the optimizer hook elastic-run installs (warm and cold workers).

- Rank 1 blocks forever between its forward and its backward on the first attempt: it is judged
  hung (``--hang-timeout 5``), its stacks name the blocking line, the agent's line names the
  frame, and the job restarts and finishes with the result of an undisturbed run.
- The same script without the hang: no verdict.
- Blocking at the same step on every attempt stops the job with exit 5 under
  ``--max-no-progress-restarts 2``, although each attempt beats 10 steps first.
- ``--print-config`` shows the setting; ``--no-auto-progress`` turns it off.

No test sleeps or asserts on a duration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_cli

SCRIPT = Path(__file__).resolve().parent / "scripts" / "ddp_no_import.py"
BLOCKING_LINE = next(
    n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "the blocking line" in line
)


def _run(tmp_path: Path, *flags: str, env: dict[str, str], timeout_s: float = 240) -> Any:
    log_dir = tmp_path / "logs"
    proc = run_cli(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--no-live",
            "--log-dir",
            str(log_dir),
            *flags,
            str(SCRIPT),
        ],
        env=env,
        timeout_s=timeout_s,
        cwd=tmp_path,
    )
    (run_dir,) = log_dir.iterdir()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return proc, run_dir, events


def _results(stdout: str) -> dict[int, list[float]]:
    found = {}
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            body = json.loads(line[len("RESULT ") :])
            found[body["rank"]] = body["weight"]
    return found


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[dict[str, Any]]]:
    """The script without a hang (cold workers), under the same hang timeout."""
    tmp_path = tmp_path_factory.mktemp("undisturbed")
    proc, _, events = _run(tmp_path, "--hang-timeout", "5", "--no-warm-start", env={})
    return proc, events


def test_without_a_hang_there_is_no_verdict(
    undisturbed: tuple[Any, list[dict[str, Any]]],
) -> None:
    proc, events = undisturbed
    assert proc.returncode == 0, proc.stderr
    kinds = [e["kind"] for e in events]
    assert "worker.hung" not in kinds and "restart" not in kinds, kinds
    results = _results(proc.stdout)
    assert set(results) == {0, 1} and results[0] == results[1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("start", ["--warm-start", "--no-warm-start"], ids=["warm", "cold"])
def test_a_rank_blocked_mid_step_is_found_and_the_job_recovers(
    tmp_path: Path, start: str, undisturbed: tuple[Any, list[dict[str, Any]]]
) -> None:
    proc, run_dir, events = _run(
        tmp_path,
        "--hang-timeout",
        "5",
        "--max-restarts",
        "1",
        start,
        env={"HANG_RANK": "1", "HANG_STEP": "10"},
    )
    assert proc.returncode == 0, proc.stderr
    hung = [e for e in events if e["kind"] == "worker.hung"]
    assert hung, proc.stderr
    fields = hung[0]["fields"]
    assert (fields["rank"], fields["in_collective"]) == (1, False), hung
    where = f"Condition.wait at ddp_no_import.py:{BLOCKING_LINE}"
    assert fields["where"] == where and where in proc.stderr
    assert all(e["fields"]["rank"] == 1 for e in hung), hung  # rank 0 only waited for it
    stacks = (run_dir / "attempt_0" / "1" / "stacks.txt").read_text()
    assert f"block_forever ({SCRIPT}:{BLOCKING_LINE})" in stacks
    assert [e["fields"].get("counted") for e in events if e["kind"] == "restart"] == [True]
    assert _results(proc.stdout) == _results(undisturbed[0].stdout)


@pytest.mark.timeout(400)
def test_blocking_at_the_same_step_every_time_stops_with_exit_5(tmp_path: Path) -> None:
    proc, _, events = _run(
        tmp_path,
        "--hang-timeout",
        "5",
        "--max-restarts",
        "50",
        "--max-no-progress-restarts",
        "2",
        env={"HANG_RANK": "1", "HANG_STEP": "10", "HANG_ALWAYS": "1"},
        timeout_s=360,
    )
    assert proc.returncode == 5, proc.stderr
    assert "no progress: 2 restarts in a row" in proc.stderr
    assert len([e for e in events if e["kind"] == "workers.started"]) == 3
    assert len([e for e in events if e["kind"] == "worker.hung"]) >= 3


def test_print_config_shows_automatic_beats(tmp_path: Path) -> None:
    shown = run_cli(["--print-config", str(SCRIPT)], cwd=tmp_path).stdout
    assert any(
        line.split() == ["auto_progress", "=", "True", "(default)"] for line in shown.splitlines()
    ), shown
    off = run_cli(["--print-config", "--no-auto-progress", str(SCRIPT)], cwd=tmp_path).stdout
    assert any(
        line.split() == ["auto_progress", "=", "False", "(given)"] for line in off.splitlines()
    ), off
    program = run_cli(["--print-config", "--no-python", "/bin/true"], cwd=tmp_path).stdout
    assert "auto_progress" in program and "--no-python" in program, program
