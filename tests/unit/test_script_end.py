"""The script-end rule: where a process is once its script is over, the bound, the idle tracker."""

from __future__ import annotations

import pytest

from elastic_run.agent.progress.config import ProgressOptions
from elastic_run.agent.progress.stack_report import Frame, StackReport, ThreadStack
from elastic_run.agent.rules.progress.script_end import (
    DEFAULT_SCRIPT_EXIT_TIMEOUT_S,
    IdleTrack,
    after_script,
    counted_exit,
    overdue_s,
    parse_script_exit_timeout,
)

PID = 100
S = 1_000_000_000
STDLIB = "/usr/lib/python3.11/threading.py"


def _report(*frames: tuple[str, str, int], main_id: int = PID, other: bool = True) -> StackReport:
    threads = [ThreadStack("MainThread", main_id, False, tuple(Frame(*f) for f in frames))]
    if other:
        threads.append(
            ThreadStack("forgotten", PID + 1, False, (Frame("Event.wait", STDLIB, 629),))
        )
    return StackReport(PID, tuple(threads))


@pytest.mark.parametrize(
    "frames",
    [
        [("train", "/job/train.py", 9), ("<module>", "/job/train.py", 20)],  # python train.py
        [  # python -m train
            ("<module>", "/job/train.py", 20),
            ("_run_code", "<frozen runpy>", 88),
            ("_run_module_as_main", "<frozen runpy>", 198),
        ],
        [  # a warm worker: the zygote's runpy
            ("<module>", "/job/train.py", 20),
            ("run_path", "<frozen runpy>", 291),
            ("<module>", "/venv/elastic_run/agent/zygote_process.py", 340),
        ],
    ],
)
def test_a_running_script_is_not_over(frames: list[tuple[str, str, int]]) -> None:
    assert after_script(_report(*frames)) is None


def test_joining_non_daemon_threads_is_after_the_script() -> None:
    where = after_script(_report(("_shutdown", STDLIB, 1590)))
    assert where == "joining non-daemon threads (threading._shutdown)"


def test_an_atexit_handler_is_after_the_script() -> None:
    where = after_script(_report(("Event.wait", STDLIB, 629), ("flush_all", "/job/train.py", 4)))
    assert where == "an atexit handler or finalizer: flush_all at train.py:4, in Event.wait"


def test_no_python_frame_in_the_main_thread_is_finalization() -> None:
    assert after_script(_report()) == "interpreter finalization (no Python frame)"


def test_a_main_thread_that_cannot_be_found_is_no_evidence() -> None:
    unnamed = StackReport(PID, (ThreadStack("", 0, False, ()), ThreadStack("", 0, False, ())))
    assert after_script(unnamed) is None


def test_no_stacks_say_nothing() -> None:
    assert after_script(StackReport(PID, error="py-spy is not installed")) is None
    assert after_script(StackReport(PID)) is None


@pytest.mark.parametrize(
    ("text", "seconds"), [("60", 60.0), (" 2.5 ", 2.5), ("off", None), ("0", None), ("OFF", None)]
)
def test_script_exit_timeout_values(text: str, seconds: float | None) -> None:
    assert parse_script_exit_timeout(text) == seconds


@pytest.mark.parametrize("text", ["nan", "inf", "-1", "soon", ""])
def test_bad_script_exit_timeouts(text: str) -> None:
    with pytest.raises(ValueError):
        parse_script_exit_timeout(text)


def test_the_option_defaults_to_60_s_and_names_its_flag() -> None:
    assert ProgressOptions().script_exit_timeout_s == DEFAULT_SCRIPT_EXIT_TIMEOUT_S == 60.0
    assert ProgressOptions.parse("auto", 1.5, 0, "off").script_exit_timeout_s is None
    with pytest.raises(ValueError, match="--script-exit-timeout"):
        ProgressOptions.parse("auto", 1.5, 0, "nan")


def test_overdue_only_past_the_bound() -> None:
    assert overdue_s(10 * S, 70 * S, 60.0) is None
    assert overdue_s(10 * S, 71 * S, 60.0) == 61.0
    assert overdue_s(10 * S, 10**6 * S, None) is None


def test_a_busy_process_is_never_looked_at() -> None:
    track = IdleTrack().read(0.0, 0)
    for second in range(1, 60):
        track = track.read(float(second), second * S)  # a full core
        assert not track.due(second * S)


def test_an_idle_process_is_looked_at_then_backs_off() -> None:
    track = IdleTrack(idle_s=5.0, backoff_s=5.0).read(3.0, 0)
    looks = []
    for second in range(1, 200):
        now = second * S
        track = track.read(3.0, now)
        if track.due(now):
            looks.append(second)
            track = track.looked(now)
    assert looks == [5, 10, 20, 40, 80, 140]  # back-off 5, 10, 20, 40, then 60 s at most


def test_a_busy_reading_starts_over() -> None:
    track = IdleTrack(idle_s=5.0, backoff_s=5.0).read(0.0, 0)
    for second in range(1, 6):
        track = track.read(0.0, second * S)
    assert track.due(5 * S)
    track = track.looked(5 * S).read(1.0, 6 * S)  # a busy second
    assert not track.due(6 * S) and track.backoff_s == 5.0
    for second in range(7, 11):
        track = track.read(1.0, second * S)
        assert not track.due(second * S)
    assert track.read(1.0, 11 * S).due(11 * S)


@pytest.mark.parametrize(
    ("script_code", "exitcode", "counted"),
    [
        (0, -6, 0),  # a native crash in the shutdown after a clean end: the script's status
        (3, -11, 3),  # after sys.exit(3): still the script's 3, not the signal
        (0, 5, 5),  # os._exit(5) in an atexit handler: deliberate, kept
        (0, 0, 0),
        (None, -6, -6),  # a cold worker: its script's end is not known, the signal stands
        (None, 1, 1),
    ],
)
def test_counted_exit_is_the_scripts_status_only_after_a_signal(
    script_code: int | None, exitcode: int, counted: int
) -> None:
    assert counted_exit(script_code, exitcode) == counted
