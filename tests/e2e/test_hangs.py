"""Hangs, stragglers and crash loops, end to end: real agents (two nodes on 127.0.0.1), real gloo
workers (``hang_scripts/train.py``), c10d and etcd.

- A rank that blocks forever before an all_reduce while the others wait inside it is found
  (``--hang-timeout 5`` and ``auto``), its stacks name the blocking line and the others' show
  all_reduce, the event and the summary say where it is stuck, and the job restarts and
  finishes with the result of an undisturbed run.
- No false verdict under ``auto``: a first step 20x longer, a checkpoint pause longer than the
  learned timeout, and ranks that never beat.
- A straggler shows in ``status --json`` as the slowest rank with its ratio, and as an event;
  ``status`` without ``--nnodes`` shows the job's MIN:MAX.
- ``--max-no-progress-restarts`` stops a crash loop with exit code 5 (one that beats no step,
  or the same steps every time), and not a job whose attempts each get further.

No test sleeps or asserts on a duration: each waits (with a deadline) for what it expects.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_multinode import (  # noqa: F401 - fixtures
    FAST_CONF,
    Job,
    backend_fixture,
    make_job_fixture,
)
from tests.helpers import run_cli, run_cli_in_process, wait_until
from tests.integration.etcd_fixtures import etcd_server_fixture  # noqa: F401 - a fixture

TRAIN = Path(__file__).resolve().parent / "hang_scripts" / "train.py"
BLOCKING_LINE = next(
    n for n, line in enumerate(TRAIN.read_text().splitlines(), 1) if "the blocking line" in line
)
ALL_REDUCE_LINE = next(
    n for n, line in enumerate(TRAIN.read_text().splitlines(), 1) if "dist.all_reduce(" in line
)


def _expected_total(world: int, steps: int) -> float:
    """RESULT of an undisturbed run: the sum over steps of the all_reduce of rank + 1 + step."""
    return float(steps * world * (world + 1) // 2 + world * steps * (steps - 1) // 2)


def _results(job: Job) -> dict[int, dict[str, Any]]:
    found = {}
    for node in job.nodes.values():
        for line in node.output().splitlines():
            if "RESULT " in line:
                body = json.loads(line.split("RESULT ", 1)[1])
                found[body["rank"]] = body
    return found


def _run_dir(job: Job, name: str) -> Path:
    node = job.nodes[name]
    (run_dir,) = node.log_dir.glob(f"{node.run_id}_*")
    return run_dir


def _events(job: Job, name: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in job.nodes[name].events() if e["kind"] == kind]


def _start_pair(job: Job, extra: tuple[str, ...], env: dict[str, str], **by_rank: str) -> None:
    """Node a (hosts the c10d store) and node b, two workers each; ``by_rank`` (HANG_RANK...)
    goes to both, as either node may hold the rank it names."""
    full = {**env, **by_rank}
    job.start("a", nnodes="2", nproc=2, host=True, extra=extra, env=full, script=(str(TRAIN),))
    job.start("b", nnodes="2", nproc=2, extra=extra, env=full, script=(str(TRAIN),))


def _taken_at(stacks_text: str) -> float:
    """When a stacks.txt was taken (its title's stamp), as epoch seconds."""
    found = re.search(r"\(taken ([^)]+)\)", stacks_text)
    assert found is not None, stacks_text
    return datetime.fromisoformat(found.group(1)).timestamp()


@pytest.mark.timeout(400)
def test_a_rank_blocked_before_all_reduce_is_found_and_the_job_recovers(
    make_job: Any, backend: tuple[str, str]
) -> None:
    job = make_job(backend)
    steps = 25
    env = {"STEPS": str(steps), "STEP_S": "0.05", "OUT_DIR": str(job.out)}
    # Rank 3 (node b, local rank 1) blocks at step 10 of the first attempt.
    _start_pair(
        job, ("--hang-timeout", "5", "--max-restarts", "1"), env, HANG_RANK="3", HANG_STEP="10"
    )
    assert job.wait_exit("a", 300) == 0, job.report()
    assert job.wait_exit("b", 60) == 0, job.report()

    # Rank 3 is local rank 1 of the node of group rank 1, whichever it is.
    hangs = {name: _events(job, name, "worker.hung") for name in "ab"}
    acted = [name for name, found in hangs.items() if found]
    assert len(acted) == 1, job.report()
    (stuck_node,) = acted
    other = "b" if stuck_node == "a" else "a"
    assert not hangs[other], job.report()  # its ranks waited for rank 3: the stuck node acted
    (hung,) = hangs[stuck_node]
    fields = hung["fields"]
    assert (fields["rank"], fields["local_rank"], fields["in_collective"]) == (3, 1, False)
    assert fields["where"] == f"Condition.wait at train.py:{BLOCKING_LINE}"
    assert fields["timeout_s"] == 5.0 and fields["learned"] is False
    assert "rank 3 stuck" in hung["message"] and f"train.py:{BLOCKING_LINE}" in hung["message"]
    (failed,) = _events(job, stuck_node, "worker.failed")
    assert failed["fields"]["rank"] == 3 and failed["fields"]["counted"] is True

    # stacks.txt: the stuck rank names its blocking line; the others show all_reduce.
    stuck = (_run_dir(job, stuck_node) / "attempt_0" / "1" / "stacks.txt").read_text()
    assert f"block_forever ({TRAIN}:{BLOCKING_LINE})" in stuck
    for name, local_rank in ((other, "0"), (other, "1"), (stuck_node, "0")):
        text = (_run_dir(job, name) / "attempt_0" / local_rank / "stacks.txt").read_text()
        if name == other and "all_reduce (" not in text:
            # The other node's watch runs on the same clock as the stuck node's: when its
            # capture came after the stuck rank was killed (the event precedes the kill), the
            # all_reduce had already failed and the worker was on its way out.
            assert _taken_at(text) >= hung["ts"], (name, text, hung)
            continue
        assert "all_reduce (" in text and f"train.py:{ALL_REDUCE_LINE})" in text, (name, text)

    # The second attempt finished with the result of an undisturbed run.
    results = _results(job)
    assert sorted(results) == [0, 1, 2, 3], job.report()
    assert {r["total"] for r in results.values()} == {_expected_total(4, steps)}
    assert {r["restart"] for r in results.values()} == {1}
    job.assert_no_survivors()
    if job.backend == "etcd":  # the store outlives the job: status reads MIN:MAX and progress
        body = status_json(job)
        assert (body["min_nodes"], body["max_nodes"]) == (2, 2)
        assert body["progress"]["ranks_reporting"] == 4, body["progress"]
        assert "hung" in [e["kind"].split(".")[-1] for e in body["events"]]


@pytest.mark.timeout(400)
def test_auto_learns_a_timeout_finds_the_hang_and_the_summary_names_it(make_job: Any) -> None:
    job = make_job(("c10d", ""))
    env = {"STEPS": "400", "STEP_S": "0.02", "OUT_DIR": str(job.out), "COLUMNS": "300"}
    _start_pair(job, ("--max-restarts", "0"), env, HANG_RANK="2", HANG_STEP="40")
    assert job.wait_exit("a", 300) == 1, job.report()
    assert job.wait_exit("b", 60) == 1, job.report()
    hangs = {name: _events(job, name, "worker.hung") for name in "ab"}
    acted = [name for name, found in hangs.items() if found]
    assert len(acted) == 1, job.report()
    (stuck_node,) = acted
    (hung,) = hangs[stuck_node]
    assert hung["fields"]["rank"] == 2 and hung["fields"]["learned"] is True
    assert hung["fields"]["timeout_s"] >= 30.0  # the default floor: steps here are fast
    summary = job.nodes[stuck_node].output()
    assert "root cause: rank 2" in summary or "root cause (first failure)" in summary, summary
    assert "hung: rank 2 stuck" in summary and f"train.py:{BLOCKING_LINE}" in summary
    assert "stacks" in summary and "block_forever" in summary  # the stack in the summary
    job.assert_no_survivors()


@pytest.mark.timeout(400)
def test_no_false_verdict_for_a_long_first_step_a_checkpoint_or_no_beats(make_job: Any) -> None:
    job = make_job(("c10d", ""))
    steps = 60
    env = {
        "STEPS": str(steps),
        "STEP_S": "0.05",
        "FIRST_STEP_X": "20",
        "CHECKPOINT_AT": "40",
        "CHECKPOINT_S": "6",  # longer than the learned timeout: floor 1 s here
        "OUT_DIR": str(job.out),
    }
    # Node b's ranks never beat at all.
    _start_pair(job, ("--hang-timeout", "auto:1"), env, NO_BEATS="1")
    assert job.wait_exit("a", 300) == 0, job.report()
    assert job.wait_exit("b", 60) == 0, job.report()
    for name in "ab":
        assert not _events(job, name, "worker.hung"), job.report()
        assert not _events(job, name, "restart"), job.report()
    results = _results(job)
    assert {r["total"] for r in results.values()} == {_expected_total(4, steps)}
    assert len(results) == 4
    job.assert_no_survivors()


def status_json(
    job: Job, *, may_be_absent: bool = False, in_process: bool = False
) -> dict[str, Any]:
    """``elastic-run status --json`` of the job; with ``may_be_absent``, ``{}`` while the job has
    not written its rendezvous yet (status exits 3 then: the agents are still starting) or while
    the host agent's store does not listen yet (exit 4: on a loaded machine an agent may take
    more than status's 5 s to start). With ``in_process``, the command runs in this process (for
    a wait loop: no torch import per call)."""
    proc = (run_cli_in_process if in_process else run_cli)(
        [
            "status",
            "--rdzv-backend",
            job.backend,
            "--rdzv-endpoint",
            job.endpoint,
            "--rdzv-id",
            job.run_id,
            "--json",
            "--sample",
            "0",
        ],
        timeout_s=60,
    )
    if may_be_absent and proc.returncode == 3 and "no rendezvous" in proc.stderr:
        return {}
    if may_be_absent and proc.returncode == 4 and "cannot reach" in proc.stderr:
        return {}
    assert proc.returncode == 0, proc.stderr
    body: dict[str, Any] = json.loads(proc.stdout)
    return body


@pytest.mark.timeout(400)
def test_a_straggler_is_the_slowest_rank_in_status_and_an_event(make_job: Any) -> None:
    job = make_job(("c10d", ""))
    env = {"STEPS": "100000", "STEP_S": "0.02", "STRAGGLER_RANK": "1", "STRAGGLER_S": "0.05"}
    for name in "ab":
        job.start(
            name,
            nnodes="2:3",
            nproc=2,
            host=name == "a",
            conf=FAST_CONF,
            env=env,
            script=(str(TRAIN),),
        )
    seen: dict[str, Any] = {}

    def straggler_shown() -> bool:
        body = status_json(job, may_be_absent=True, in_process=True)
        seen.update(body)
        progress = body.get("progress") or {}
        slowest = progress.get("slowest") or []
        kinds = [e["kind"] for e in body.get("events", [])]
        return bool(slowest) and slowest[0]["rank"] == 1 and "straggler" in kinds

    wait_until(straggler_shown, 240, interval_s=1.0, message=lambda: json.dumps(seen)[-3000:])
    progress = seen["progress"]
    top = progress["slowest"][0]
    assert top["ratio"] >= 1.5 and top["straggler"] is True, progress
    assert progress["median_step_s"] > 0 and progress["ranks_reporting"] == 4
    (event,) = [e for e in seen["events"] if e["kind"] == "straggler"]
    assert event["fields"]["rank"] == 1 and event["fields"]["ratio"] >= 1.5
    by_rank = {r["rank"]: r for r in progress["ranks"]}
    assert by_rank[1]["verdict"] == "straggler" and by_rank[1]["step"] >= 0
    assert by_rank[0]["timeout_s"] > 0 and by_rank[0]["age_s"] is not None
    # No --nnodes given to status: the job's MIN:MAX comes from the rendezvous.
    assert (seen["min_nodes"], seen["max_nodes"]) == (2, 3)
    text = run_cli(
        [
            "status",
            "--rdzv-backend",
            job.backend,
            "--rdzv-endpoint",
            job.endpoint,
            "--rdzv-id",
            job.run_id,
            "--sample",
            "0",
        ],
        env={"COLUMNS": "200"},
    ).stdout
    assert "nnodes 2:3" in text and "straggler" in text and "median work per step" in text


CRASH = "from elastic_run.worker import progress\nimport os, sys\n{beat}sys.exit(1)\n"


FURTHER = "for _ in range(int(os.environ['TORCHELASTIC_RESTART_COUNT']) + 1):\n    progress()\n"


@pytest.mark.parametrize(
    ("beat", "code", "attempts"),
    [("", 5, 3), ("progress()\n", 5, 3), (FURTHER, 1, 4)],
    ids=["no-beat-exits-5", "same-step-every-time-exits-5", "further-each-time-uses-every-restart"],
)
def test_max_no_progress_restarts_stops_a_crash_loop(
    tmp_path: Path, beat: str, code: int, attempts: int
) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASH.format(beat=beat))
    log_dir = tmp_path / "logs"
    proc = run_cli(
        [
            "--standalone",
            "--no-live",
            "--max-restarts",
            "3",
            "--max-no-progress-restarts",
            "2",
            "--log-dir",
            str(log_dir),
            str(script),
        ],
        timeout_s=120,
    )
    assert proc.returncode == code, proc.stderr
    (run_dir,) = log_dir.iterdir()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    started = [e for e in events if e["kind"] == "workers.started"]
    assert len(started) == attempts
    (failed,) = [e for e in events if e["kind"] == "failed"]
    assert failed["fields"]["exit_code"] == code
    if code == 5:
        assert "no progress: 2 restarts in a row" in proc.stderr


def test_each_worker_gets_its_beat_slot_and_the_file_goes_with_its_attempt(
    tmp_path: Path,
) -> None:
    script = tmp_path / "env.py"
    script.write_text(
        "import os, json\n"
        "print('ENV ' + json.dumps({k: v for k, v in os.environ.items() "
        "if k.startswith('ELASTIC_RUN_PROGRESS')}))\n"
    )
    proc = run_cli(["--standalone", "--no-live", str(script)], timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if "ENV " in x)
    shown = json.loads(line.split("ENV ", 1)[1])
    assert set(shown) == {"ELASTIC_RUN_PROGRESS_FILE", "ELASTIC_RUN_PROGRESS_SLOT"}
    assert shown["ELASTIC_RUN_PROGRESS_SLOT"] == "0"
    assert not Path(shown["ELASTIC_RUN_PROGRESS_FILE"]).exists()  # removed with its attempt


WATCHED = (
    "import threading\n"
    "from elastic_run.worker import expires\n"
    "with expires(after=1, scope='load'):\n"
    "    threading.Event().wait()  # stuck here\n"
)


def test_a_watchdog_expiry_takes_the_stacks_before_the_kill(tmp_path: Path) -> None:
    script = tmp_path / "watched.py"
    script.write_text(WATCHED)
    log_dir = tmp_path / "logs"
    proc = run_cli(
        ["--standalone", "--no-live", "--watchdog", "--log-dir", str(log_dir), str(script)],
        env={"COLUMNS": "300"},
        timeout_s=120,
    )
    assert proc.returncode == 1, proc.stderr
    (run_dir,) = log_dir.iterdir()
    stacks = (run_dir / "attempt_0" / "0" / "stacks.txt").read_text()
    assert "its watchdog timer expired" in stacks.splitlines()[0]
    assert f"<module> ({script}:4)" in stacks
    assert "the watchdog timer 'load' expired and killed the worker" in proc.stderr
    assert "stuck in Condition.wait at watched.py:4" in proc.stderr
