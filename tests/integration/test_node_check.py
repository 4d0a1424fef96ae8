"""The node check against real processes and the real disk: the user's command (a failure and
its reason, a hang cut at its time limit with its forked child gone from the process table, a
failure with no output, a chatty command, one that exits leaving a child behind), a disk bound
the disk cannot meet, the CPU-only node's device skip, and the device probe's harness for real:
the probe itself on the CPU (torch's CPU matmul, the same child the CUDA check runs), and
stand-in interpreters that hang with a forked child or die with garbage on stdout."""

from __future__ import annotations

import os
import re
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest

from elastic_run.agent.node_check import (
    CPU_SMOKE,
    NOTHING,
    CheckStatus,
    DeviceRequest,
    NodeCheckOptions,
    NodeCheckResult,
    failure_line,
    run_node_check,
    startup_line,
)
from elastic_run.agent.node_check.bounded_process import MAX_OUTPUT_BYTES, run_bounded
from tests.helpers import ProcessTable, wait_until

MARK = "ELASTIC_RUN_NODE_CHECK_TEST"


@pytest.fixture
def marked_env() -> tuple[dict[str, str], str, int]:
    """An environment whose every child carries a fresh marker, the marker, and the tick since
    which its processes count."""
    token = uuid.uuid4().hex
    return {**os.environ, MARK: token}, token, ProcessTable.now() - 1


def _left_running(token: str, since: int) -> list[int]:
    return ProcessTable().marked(MARK, token, since)


def _assert_nothing_left(token: str, since: int) -> None:
    # Killed processes are reaped by init a moment after the kill: wait for that, not a sleep.
    wait_until(
        lambda: not _left_running(token, since),
        10.0,
        lambda: f"still running: {_left_running(token, since)}",
    )


def _check(
    command: str | None, tmp_path: Path, env: dict[str, str], **fields: Any
) -> NodeCheckResult:
    options = NodeCheckOptions(command=command, **fields)
    return run_node_check(options, NOTHING, tmp_path / "logs", env=env)


def test_a_failing_command_gives_its_first_line_as_the_reason(
    tmp_path: Path, marked_env: tuple[dict[str, str], str, int]
) -> None:
    env, token, since = marked_env
    result = _check("echo; echo 'scratch disk full' >&2; echo later; exit 1", tmp_path, env)
    assert not result.healthy
    assert result.reason == "scratch disk full"
    assert failure_line("h3", result) == "node h3 failed its node check: scratch disk full"
    assert [(c.name, c.status) for c in result.checks] == [
        ("devices", CheckStatus.SKIP),
        ("disk", CheckStatus.OK),
        ("command", CheckStatus.FAIL),
    ]
    _assert_nothing_left(token, since)


def test_a_hanging_command_is_cut_at_its_time_limit_with_its_forked_child(
    tmp_path: Path, marked_env: tuple[dict[str, str], str, int]
) -> None:
    env, token, since = marked_env
    pids = tmp_path / "pids"
    result = _check(
        f"sleep 300 & echo $! > {pids}; echo $$ >> {pids}; sleep 300", tmp_path, env, timeout_s=1.5
    )
    ended = ProcessTable.now()
    assert not result.healthy
    command = result.check("command")
    assert command is not None and command.status is CheckStatus.FAIL
    assert re.fullmatch(r"node check command timed out after 1(\.\d)? s", command.detail), command
    # the shell and the child it forked both ran, and neither is left in the process table
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 2
    _assert_nothing_left(token, since)

    # A SIGKILLed process loses its environment before it leaves the table, so the marker
    # alone misses one still dying: wait for the two pids too. A process at one of them that
    # started after the check returned is another one (pid_max may be 32,768, and a whole check
    # once saw a pid reused here).
    def left() -> list[int]:
        table = ProcessTable()
        return [
            pid for pid in started if table.alive(pid) and (table.key(pid) or (0, ended))[1] < ended
        ]

    wait_until(lambda: not left(), 10.0, lambda: f"still running: {left()}")


@pytest.mark.parametrize(
    ("command", "status", "detail"),
    [
        ("exit 3", CheckStatus.FAIL, "node check command exited 3 with no output"),
        ("kill -9 $$", CheckStatus.FAIL, "node check command was killed by SIGKILL with no output"),
        # a chatty command: read all along, so it never blocks on a full pipe
        ("head -c 1000000 /dev/zero | tr '\\0' a; exit 0", CheckStatus.OK, "ok"),
        # exits at once, a child left holding its output: not waited for, and killed
        ("sleep 300 & echo fine", CheckStatus.OK, "ok"),
        # the shell's own words (dash's, bash's): its first line
        ("/nonexistent/check", CheckStatus.FAIL, r"/bin/sh: .*/nonexistent/check: .*"),
    ],
)
def test_how_a_command_ends(
    command: str,
    status: CheckStatus,
    detail: str,
    tmp_path: Path,
    marked_env: tuple[dict[str, str], str, int],
) -> None:
    env, token, since = marked_env
    result = _check(command, tmp_path, env, timeout_s=20.0)
    got = result.check("command")
    assert got is not None and got.status == status
    assert got.detail == detail or re.fullmatch(detail, got.detail), got.detail
    _assert_nothing_left(token, since)


def test_output_past_the_cap_is_dropped(marked_env: tuple[dict[str, str], str, int]) -> None:
    env, _, _ = marked_env
    run = run_bounded(["/bin/sh", "-c", "head -c 200000 /dev/zero | tr '\\0' b"], 20.0, env=env)
    assert run.exit_code == 0 and not run.timed_out
    assert run.output == "b" * MAX_OUTPUT_BYTES


def test_a_disk_bound_the_disk_cannot_meet(tmp_path: Path) -> None:
    result = run_node_check(
        NodeCheckOptions(min_free_bytes=1 << 60, command="true"), NOTHING, tmp_path / "not" / "yet"
    )
    disk = result.check("disk")
    assert disk is not None and disk.status is CheckStatus.FAIL
    assert re.fullmatch(
        rf"the log directory's disk \({re.escape(str(tmp_path))}\) has [\d.]+ [KMGT]?i?B free, "
        r"under the 1 EiB the node check asks",
        disk.detail,
    ), disk.detail
    assert result.reason == disk.detail
    command = result.check("command")
    assert command is not None and command.status is CheckStatus.SKIP  # not run after a failure
    assert not (tmp_path / "not").exists()  # the check makes nothing


def test_a_cpu_only_node_checks_no_device_and_says_so(tmp_path: Path) -> None:
    result = run_node_check(NodeCheckOptions(), NOTHING, tmp_path)
    assert result.healthy
    devices = result.check("devices")
    assert devices is not None and devices.status is CheckStatus.SKIP
    assert devices.detail == "no accelerator requested, nothing checked"
    assert re.fullmatch(
        r"node check passed in [\d.]+ s: devices: no accelerator requested, nothing checked; "
        r"disk: [\d.]+ [KMGT]?i?B free; command: none given",
        startup_line(result),
    ), startup_line(result)


def test_the_probe_runs_its_matmul_in_a_child_on_the_cpu(
    tmp_path: Path, marked_env: tuple[dict[str, str], str, int]
) -> None:
    """The CUDA check's own child and harness, with torch's CPU matmul: spawned, bounded, its
    JSON lines read back. (Its CUDA lines run on a GPU, in scripts/gpu_check.py.)"""
    env, token, since = marked_env
    result = run_node_check(NodeCheckOptions(timeout_s=60.0), CPU_SMOKE, tmp_path, env=env)
    devices = result.check("devices")
    assert devices is not None and devices.status is CheckStatus.OK, devices
    assert re.fullmatch(r"cpu ok \(1024x1024 matmul [\d.]+ s\)", devices.detail), devices.detail
    _assert_nothing_left(token, since)


def _fake_python(tmp_path: Path, body: str) -> str:
    """A stand-in for the probe's interpreter: a shell script that ignores its arguments."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_probe_that_hangs_is_cut_at_the_budget_with_its_child(
    tmp_path: Path, marked_env: tuple[dict[str, str], str, int]
) -> None:
    env, token, since = marked_env
    python = _fake_python(
        tmp_path,
        """echo '{"probe": 1, "step": "cuda:0: initialising, 1024x1024 matmul"}'\n"""
        "sleep 300 &\nsleep 300",
    )
    result = run_node_check(
        NodeCheckOptions(timeout_s=1.5, command="true"),
        DeviceRequest("cuda", 1),
        tmp_path,
        env=env,
        python=python,
    )
    devices = result.check("devices")
    assert devices is not None and devices.status is CheckStatus.FAIL
    assert re.fullmatch(
        r"device check timed out after 1(\.\d)? s at cuda:0: initialising, 1024x1024 matmul",
        devices.detail,
    ), devices.detail
    assert [c.status for c in result.checks[1:]] == [CheckStatus.SKIP, CheckStatus.SKIP]
    _assert_nothing_left(token, since)


def test_a_probe_that_dies_with_garbage_fails_with_its_words(
    tmp_path: Path, marked_env: tuple[dict[str, str], str, int]
) -> None:
    env, token, since = marked_env
    python = _fake_python(tmp_path, "echo 'libcuda.so: cannot open shared object'; exit 1")
    result = run_node_check(
        NodeCheckOptions(), DeviceRequest("cuda", 1), tmp_path, env=env, python=python
    )
    assert result.reason == (
        "the device probe exited 1 before its answer: libcuda.so: cannot open shared object"
    )
    _assert_nothing_left(token, since)


def test_without_a_pidfd_the_harness_looks_for_the_exit_instead(
    monkeypatch: pytest.MonkeyPatch, marked_env: tuple[dict[str, str], str, int]
) -> None:
    """A kernel or sandbox without pidfd_open: the same ends, seen by looking every 50 ms."""
    env, token, since = marked_env

    def refused(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", refused)
    left_child = run_bounded(["/bin/sh", "-c", "sleep 300 & echo fine"], 20.0, env=env)
    assert (left_child.exit_code, left_child.output, left_child.timed_out) == (0, "fine\n", False)
    hung = run_bounded(["/bin/sh", "-c", "sleep 300 & sleep 300"], 1.0, env=env)
    assert hung.timed_out and hung.exit_code is None
    _assert_nothing_left(token, since)


def test_cuda_asked_of_a_node_that_shows_none_fails_saying_so(
    tmp_path: Path, marked_env: tuple[dict[str, str], str, int]
) -> None:
    """The probe's CUDA path for real, up to its count: with no device visible to the child
    (``CUDA_VISIBLE_DEVICES`` empty, so the same on a GPU machine), the node is unfit."""
    env, token, since = marked_env
    env = {**env, "CUDA_VISIBLE_DEVICES": ""}
    result = run_node_check(
        NodeCheckOptions(timeout_s=60.0), DeviceRequest("cuda", 2), tmp_path, env=env
    )
    assert result.reason == "2 CUDA devices requested, none visible"
    assert failure_line("h3", result) == (
        "node h3 failed its node check: 2 CUDA devices requested, none visible"
    )
    _assert_nothing_left(token, since)
