"""The demo's DDP training (examples/train.py) survives a SIGKILLed worker: it resumes from its
last checkpoint and ends at the same step count and loss as an undisturbed run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agent_jobs import CLI, cli_env  # noqa: E402
from helpers import REPO_ROOT, no_process_left, wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(240)

STEPS = 60
TRAIN = [
    str(REPO_ROOT / "examples" / "train.py"),
    "--steps",
    str(STEPS),
    "--log-every",
    "5",
    "--checkpoint-every",
    "10",
]


def _launch(
    tmp_path: Path, name: str, *train_args: str, start: str = "--no-warm-start"
) -> tuple[subprocess.Popen[bytes], Path]:
    out = tmp_path / f"{name}.log"
    proc = subprocess.Popen(
        [*CLI, start, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--no-live",
         "--log-dir", str(tmp_path / f"{name}-logs"),
         *TRAIN, "--checkpoint-dir", str(tmp_path / name), *train_args],
        stdout=out.open("wb"),
        stderr=subprocess.STDOUT,
        env=cli_env(),
        start_new_session=True,
    )  # fmt: skip
    return proc, out


def _worker_of_rank(agent: psutil.Process, rank: str) -> psutil.Process | None:
    for child in agent.children(recursive=True):
        try:
            if child.environ().get("RANK") == rank and "train.py" in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


@pytest.fixture(scope="module", name="calm")
def calm_fixture(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The undisturbed run (cold), once for both starts: its result is deterministic."""
    where = tmp_path_factory.mktemp("calm")
    calm, calm_log = _launch(where, "calm")
    try:
        assert calm.wait(180) == 0, calm_log.read_text()
    finally:
        if calm.poll() is None:
            os.killpg(calm.pid, signal.SIGKILL)
            calm.wait(10)
    expected: dict[str, object] = json.loads((where / "calm" / "final.json").read_text())
    assert expected["steps"] == STEPS and expected["restarts"] == 0, calm_log.read_text()
    return expected


@pytest.mark.parametrize("start", ["--no-warm-start", "--warm-start"])
def test_training_survives_a_killed_worker(
    tmp_path: Path, start: str, calm: dict[str, object]
) -> None:
    """The killed run, cold then warm, ends at the undisturbed run's steps and loss."""
    expected = calm

    # 0.1 s a step: the kill after step 15 lands with 4.5 s of training left, even when this
    # process is slow to see the line and find the worker.
    agent, log = _launch(tmp_path, "killed", "--sleep-per-step", "0.1", start=start)
    seen: list[int] = []
    try:
        # After the checkpoint of step 10, kill rank 1 outright (no error file, no cleanup).
        wait_until(lambda: "step 15/" in log.read_text(), 120, message=log.read_text)
        victim = _worker_of_rank(psutil.Process(agent.pid), "1")
        assert victim is not None, log.read_text()
        seen.append(victim.pid)
        os.kill(victim.pid, signal.SIGKILL)
        assert agent.wait(180) == 0, log.read_text()
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(10)
    text = log.read_text()
    assert "killed by SIGKILL" in text
    assert "resumed from step" in text
    result = json.loads((tmp_path / "killed" / "final.json").read_text())
    assert result["restarts"] == 1
    assert result["steps"] == expected["steps"]
    assert result["world_size"] == expected["world_size"] == 2
    assert result["final_loss"] == pytest.approx(expected["final_loss"], rel=1e-5)
    assert no_process_left(seen)
