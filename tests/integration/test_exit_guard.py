"""The exit guard (elastic_run.worker.exit_guard): a worker's exit waits for gloo's threads to sleep.

Real threads and the real ``/proc``: a thread renamed ``pt_gloo_runloop`` that hashes a large
buffer (CPython drops the GIL there, so the thread runs, state ``R``) and then sleeps on an
event; a real gloo process group, whose collectives run on threads of that name; and real
workers, cold and warm, started by the CLI, which are armed.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic_run.worker.exit_guard import GLOO_THREADS, threads_named, wait_for_idle_threads
from tests.helpers import REPO_ROOT, run_cli

CHUNK = b"\0" * (64 << 20)


class Runner:
    """A thread named like gloo's run loop: hashes ``rounds`` times (or until stopped), sleeps."""

    def __init__(self, rounds: int | None) -> None:
        self.rounds = rounds
        self.done = threading.Event()
        self.stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write(GLOO_THREADS[0])
        self._started.set()  # the GIL stays here until the hash below lets it go
        n = 0
        while not self.stop.is_set() and (self.rounds is None or n < self.rounds):
            hashlib.sha256(CHUNK).digest()
            n += 1
        self.done.set()
        self.stop.wait()  # asleep (S) from here

    def start(self) -> Runner:
        self._thread.start()
        assert self._started.wait(30)
        return self

    def end(self) -> None:
        self.stop.set()
        self._thread.join(30)


@pytest.fixture(name="runners")
def runners_fixture() -> Iterator[list[Runner]]:
    made: list[Runner] = []
    yield made
    for runner in made:
        runner.end()


def test_the_exit_waits_until_the_named_thread_sleeps(runners: list[Runner]) -> None:
    runner = Runner(rounds=8).start()
    runners.append(runner)
    assert wait_for_idle_threads(needs_module=None, limit_s=120) is True
    assert runner.done.is_set()  # it had finished its work before the wait let the exit go


def test_a_thread_that_never_sleeps_holds_the_exit_only_to_the_limit(
    runners: list[Runner],
) -> None:
    runner = Runner(rounds=None).start()
    runners.append(runner)
    assert wait_for_idle_threads(needs_module=None, limit_s=0.2) is False
    assert not runner.done.is_set()


def test_without_the_module_the_exit_does_not_look(runners: list[Runner]) -> None:
    runner = Runner(rounds=None).start()
    runners.append(runner)
    assert wait_for_idle_threads(needs_module="elastic_run_no_such_module") is True
    assert not runner.done.is_set()


def test_other_threads_are_not_waited_for() -> None:
    assert threads_named(["elastic-run-no-such-thread"]) == []
    assert wait_for_idle_threads(["elastic-run-no-such-thread"], needs_module=None) is True


GLOO = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    from elastic_run.worker.exit_guard import GLOO_THREADS, threads_named, wait_for_idle_threads
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    t = torch.ones(4)
    dist.all_reduce(t)
    print("THREADS", len(threads_named(GLOO_THREADS)), wait_for_idle_threads(), flush=True)
    dist.destroy_process_group()
    """
)


def test_a_gloo_group_leaves_threads_of_the_name_waited_for(tmp_path: Path) -> None:
    """The name is torch's: were it to change, the guard would wait for nothing."""
    script = tmp_path / "gloo.py"
    script.write_text(GLOO)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "store")],
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("THREADS "))
    count, idle = line.split()[1:]
    assert int(count) >= 1 and idle == "True", done.stdout


ARMED = textwrap.dedent(
    """
    import atexit, sys
    import torch
    guard = sys.modules.get("elastic_run.worker.exit_guard")
    print("ARMED", guard is not None and guard._armed, flush=True)
    """
)


@pytest.mark.parametrize("start", ["--no-warm-start", "--warm-start"])
def test_cold_and_warm_workers_are_armed(tmp_path: Path, start: str) -> None:
    script = tmp_path / "armed.py"
    script.write_text(ARMED)
    done = run_cli(
        ["--standalone", "--nproc-per-node", "1", start, "--no-live", "--tee", "3"]
        + ["--log-dir", str(tmp_path / "logs"), str(script)],
        timeout_s=120,
    )
    assert done.returncode == 0, done.stderr
    assert "ARMED True" in done.stdout, done.stdout + done.stderr
