"""The launcher's start (elastic_run/cli/launch_clock.py): the later of the import stamp and the
process's creation. In a process forked long after the module was imported (a warm-start
template serving the console script), the fork is the start; in this process, the import."""

from __future__ import annotations

import os
import time

from elastic_run.cli import launch_clock


def test_the_later_stamp_wins_and_an_unknown_creation_leaves_the_import() -> None:
    assert launch_clock.later_start_s(10.0, 4.0) == 10.0
    assert launch_clock.later_start_s(10.0, 12.5) == 12.5
    assert launch_clock.later_start_s(10.0, None) == 10.0


def test_this_process_counts_from_its_import() -> None:
    start = launch_clock.launcher_start_monotonic_s()
    assert start >= launch_clock.IMPORTED_MONOTONIC_S
    assert start <= time.monotonic()


def test_a_process_forked_after_the_import_counts_from_its_fork() -> None:
    imported = launch_clock.IMPORTED_MONOTONIC_S
    read, write = os.pipe()
    before_fork = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: its answer, through the pipe, then out at once
        os.close(read)
        os.write(write, repr(launch_clock.launcher_start_monotonic_s()).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child_start = float(pipe.read())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The creation time has a clock tick's granularity (10 ms): allow that much early.
    assert child_start >= before_fork - 0.02
    assert child_start > imported or before_fork - imported < 0.02
