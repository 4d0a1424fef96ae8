"""The tests' process accounting (``tests.helpers.ProcessTable``) on real processes.

The leak guard around every test and the jobs' worker bookkeeping read the machine's processes
through it; here it is held to psutil on the same processes, and to the cases the guard relies
on: a zombie is gone, a detached process is found by its environment, a process started before
the window is not, an entry counts only whole.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psutil
import pytest

from tests.helpers import TICKS_PER_S, ProcessTable, wait_until

# A child that starts a grandchild, prints its pid, and waits for it.
_TREE = "import subprocess, sys; p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True); p.wait()"


@pytest.fixture(name="tree")
def tree_fixture() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A child (python) with a grandchild (sleep); both killed after the test."""
    child = subprocess.Popen(
        [sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert child.stdout is not None
    grandchild = int(child.stdout.readline())
    try:
        yield child, grandchild
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=30)


def test_descendants_and_keys_are_psutils(tree: tuple[subprocess.Popen[str], int]) -> None:
    child, grandchild = tree
    table = ProcessTable()
    mine = set(table.descendants(os.getpid()))
    assert {child.pid, grandchild} <= mine
    assert set(table.descendants(child.pid)) == {grandchild}
    assert table.descendants(grandchild) == []
    for pid in (child.pid, grandchild):
        key = table.key(pid)
        assert key is not None and key[0] == pid
        started = psutil.boot_time() + key[1] / TICKS_PER_S
        # psutil derives create_time from the same field (and the boot time, to the second).
        assert abs(started - psutil.Process(pid).create_time()) < 1.5
        assert table.alive(pid)
    assert table.key(2**22 + 1) is None and not table.alive(2**22 + 1)  # above any pid_max


def test_a_zombie_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Exited, not yet reaped (nothing here waits for it until the end).
        wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, 30)
        table = ProcessTable()
        assert table.key(child.pid) is not None  # still in the table, but not alive
        assert not table.alive(child.pid)
        assert child.pid not in table.descendants(os.getpid())
    finally:
        child.wait(timeout=30)
    assert ProcessTable().key(child.pid) is None


def test_marked_finds_a_detached_process_by_its_environment_only_in_its_window() -> None:
    marker = uuid.uuid4().hex
    # A double fork: the process is nobody's descendant here, only its environment says whose.
    detach = (
        "import os, subprocess; "
        "p = subprocess.Popen(['sleep', '60'], start_new_session=True, "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)"
    )

    def start(env: dict[str, str]) -> int:
        out = subprocess.run(
            [sys.executable, "-c", detach], env=env, capture_output=True, text=True, timeout=60
        )
        return int(out.stdout)

    before = start({**os.environ, "PROBE_MARK": marker})
    wait_until(lambda: ProcessTable().key(before) is not None, 30)
    since = (ProcessTable().key(before) or (0, 0))[1] + 1
    wait_until(lambda: ProcessTable.now() > since, 30)  # the next tick has begun
    pids = [start({**os.environ, "PROBE_MARK": marker}), start(dict(os.environ))]
    try:
        table = ProcessTable()
        assert pids[0] not in table.descendants(os.getpid())
        assert table.marked("PROBE_MARK", marker, since) == [pids[0]]
        assert set(table.marked("PROBE_MARK", marker, 0)) == {before, pids[0]}
        assert table.marked("PROBE_MARK", marker[:-1], 0) == []  # whole entries only
    finally:
        for pid in [before, *pids]:
            os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not ProcessTable().marked("PROBE_MARK", marker, 0), 30)
