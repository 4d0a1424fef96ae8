"""Progress beats and stacks with real processes: a worker's ``progress()`` seen through the
agent's beat file, file-timer requests counted as beats, py-spy stacks of a blocked process,
and the HangWatch's verdict on a worker that stops beating."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastic_run.agent.progress import stacks
from elastic_run.agent.progress.hang_watch import HangWatch
from elastic_run.agent.rules.actions import StopHung
from elastic_run.agent.rules.observation import Observation, Phase, ProgressView
from elastic_run.agent.rules.progress import beats as hang
from elastic_run.agent.rules.progress import hung
from elastic_run.agent.watchdog.server import FileTimerServer
from elastic_run.worker.beat_file import (
    PROGRESS_FILE_ENV,
    PROGRESS_SLOT_ENV,
    BeatFile,
    create_beat_file,
    sweep_stale_beat_files,
)
from tests.helpers import REPO_ROOT, wait_until

BEATER = textwrap.dedent(
    """
    import os, sys, threading
    from pathlib import Path
    from elastic_run.worker import progress, sync_point
    out = Path(sys.argv[1])
    for step in range(int(sys.argv[2])):
        sync_point()
        progress(step * 10)
    if os.fork() == 0:          # a child (a data-loader process) must not beat for it
        progress(999)
        os._exit(0)
    os.wait()
    (out / "beaten").write_text("1")
    threading.Event().wait()    # the blocking line
    """
)
BLOCKING_LINE = BEATER.splitlines().index("threading.Event().wait()    # the blocking line") + 1


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _spawn(
    procs: list[subprocess.Popen[bytes]], code: str, args: list[str], env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Run ``code`` as the script ``<args[0]>/worker.py`` (user code, as py-spy sees it)."""
    script = Path(args[0]) / "worker.py"
    script.write_text(code)
    full = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}
    proc = subprocess.Popen([sys.executable, str(script), *args], env=full, stderr=subprocess.PIPE)
    procs.append(proc)
    return proc


def test_a_workers_beats_reach_the_agent_through_shared_memory(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    path = tmp_path / "attempt.beats"
    create_beat_file(path, 3)
    env = {PROGRESS_FILE_ENV: str(path), PROGRESS_SLOT_ENV: "2"}
    proc = _spawn(procs, BEATER, [str(tmp_path), "7"], env)
    wait_until(lambda: (tmp_path / "beaten").exists(), 60, message="the worker did not beat")
    beats = BeatFile(path)
    try:
        reading = beats.read(2)
        assert reading is not None
        assert (reading.beats, reading.step, reading.pid) == (7, 60, proc.pid)
        assert reading.busy_count == 6  # a sync point before the first beat does not count
        assert reading.last_beat_ns > 0 and reading.last_gap_ns > 0
        assert beats.read(0) == beats.read(1) and beats.read(0).beats == 0  # type: ignore[union-attr]
    finally:
        beats.close()


def test_a_beat_file_that_cannot_be_used_is_one_line_and_training_goes_on(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    env = {PROGRESS_FILE_ENV: str(tmp_path / "missing.beats"), PROGRESS_SLOT_ENV: "0"}
    code = "from elastic_run.worker import progress\nfor i in range(3): progress(i)\nprint('done')"
    proc = _spawn(procs, code, [str(tmp_path)], env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert len(lines) == 1 and "beats are off" in lines[0] and "missing.beats" in lines[0]


def _capture_at(pid: int, line: int) -> Any:
    """Stacks of ``pid`` once its user frame is at ``line`` (the last capture after 30 s).

    "beaten" is written one line before the block: a capture right after it may find the
    worker still finishing that write.
    """
    reports: list[Any] = []

    def there() -> bool:
        reports.append(stacks.capture_stacks({0: pid})[0])
        where = reports[-1].where()
        return where is not None and where.user_frame is not None and where.user_frame.line == line

    try:
        wait_until(there, 30, interval_s=0.2, message="the worker did not reach its blocking line")
    except AssertionError:
        pass  # the asserts on the last capture say what it showed
    return reports[-1]


def test_stacks_of_a_blocked_process_name_its_line(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    proc = _spawn(procs, BEATER, [str(tmp_path), "1"], {})
    wait_until(lambda: (tmp_path / "beaten").exists(), 60, message="the worker did not start")
    report = _capture_at(proc.pid, BLOCKING_LINE)
    assert report.error is None, report.error
    where = report.where()
    assert where is not None and not where.in_collective
    assert where.user_frame is not None and where.user_frame.line == BLOCKING_LINE, report
    path = tmp_path / "0" / "stacks.txt"
    assert stacks.write_stacks(path, report, "stacks of rank 0")
    text = path.read_text()
    assert text.startswith("# stacks of rank 0 (taken ")
    assert f"Thread {proc.pid}" in text and f"worker.py:{BLOCKING_LINE}" in text


def test_stacks_that_cannot_be_taken_say_why_in_one_line(
    procs: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    procs.append(sleeper)  # type: ignore[arg-type]
    report = stacks.capture_stacks({0: sleeper.pid}, timeout_s=20)[0]
    assert report.error and "\n" not in report.error and not report.threads
    monkeypatch.setattr(stacks, "py_spy_command", lambda: None)
    report = stacks.capture_stacks({0: sleeper.pid})[0]
    assert report.error == "py-spy is not installed (pip install py-spy)"


def test_the_hang_watch_stops_a_worker_that_stops_beating(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    watch = HangWatch(hang.parse_hang_timeout("1"), beat_dir=tmp_path)
    try:
        envs = watch.start_attempt(0, [(0, 5)], {0: tmp_path / "0"})
        proc = _spawn(procs, BEATER, [str(tmp_path), "4"], envs[0])
        watch.started({0: proc.pid})
        wait_until(lambda: (tmp_path / "beaten").exists(), 60, message="the worker did not beat")

        verdicts: list[StopHung] = []

        def judged() -> bool:  # the loop's turn: the watch's evidence, then the hang rule
            now = time.monotonic_ns()
            watch.tick(now)
            view = ProgressView(
                suspects=watch.suspects,
                suspect_since_ns=watch.suspect_since_ns,
                collective_grace_s=watch.collective_grace_s,
            )
            action = hung.judge(Observation(Phase.RUNNING, progress=view), now)
            if isinstance(action, StopHung):
                verdicts.append(action)
            return bool(verdicts)

        wait_until(judged, 60, interval_s=0.1, message="no verdict")
        (worker,) = verdicts[0].workers
        watch.judged_hung(verdicts[0].workers)
        assert (worker.local_rank, worker.rank, worker.pid) == (0, 5, proc.pid)
        assert worker.silence.timeout_s == 1.0 and not worker.silence.learned
        assert worker.where is not None
        assert worker.where.text() == f"Condition.wait at worker.py:{BLOCKING_LINE}"
        assert worker.stacks_file == tmp_path / "0" / "stacks.txt"
        assert "rank 5 stuck" in worker.sentence() and "timeout 1 s, given" in worker.sentence()
        assert watch.progress()[0].verdict == "hung" and watch.progress()[0].step == 30
        assert watch.attempt_beat
        proc.send_signal(signal.SIGKILL)
        watch.end_attempt(failed=True)
        assert not list(tmp_path.glob("*.beats"))  # the attempt's file is gone
    finally:
        watch.close()


def test_file_timer_requests_are_beats(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    watch = HangWatch(hang.HangRule(), beat_dir=tmp_path)
    server = FileTimerServer(
        str(tmp_path / "timer.fifo"), max_interval=0.1, on_request=watch.timer_beat
    )
    server.start()
    try:
        watch.start_attempt(0, [(0, 0)], {})
        code = textwrap.dedent(
            """
            import sys
            from elastic_run.worker import expires
            for _ in range(3):
                with expires(after=60):
                    pass
            """
        )
        proc = _spawn(procs, code, [str(tmp_path)], {"TORCHELASTIC_TIMER_FILE": server.file_path})
        watch.started({0: proc.pid})
        proc.wait(timeout=60)

        def six_beats() -> bool:
            watch.tick()
            return watch.progress()[0].beats == 6

        wait_until(six_beats, 30, interval_s=0.05, message=lambda: str(watch.progress()))
    finally:
        server.stop()
        watch.close()


def test_beat_files_of_agents_that_are_gone_are_swept(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=60)
    stale = tmp_path / f"elastic-run-{gone.pid}-0-abcd1234.beats"
    mine = tmp_path / f"elastic-run-{os.getpid()}-3-abcd1234.beats"
    other = tmp_path / "elastic-run-notapid-0-x.beats"
    for path in (stale, mine, other):
        create_beat_file(path, 1)
    sweep_stale_beat_files(tmp_path)
    assert not stale.exists() and mine.exists() and other.exists()
