"""Error files and the failure summary."""

from __future__ import annotations

import io
import json
import signal
from pathlib import Path

from rich.console import Console

from elastic_run.agent.workers.failures import (
    FailureRecord,
    WorkerErrorInfo,
    format_failure_summary,
    read_error_file,
    root_cause,
)
from elastic_run.cli.views.lines import render_failure_summary

TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 3\nValueError: bad lr\n'


def write_torch_error(path: Path, message: str = "ValueError: bad lr") -> None:
    path.write_text(
        json.dumps(
            {
                "message": {
                    "message": message,
                    "extraInfo": {"py_callstack": TRACEBACK, "timestamp": "1700000000"},
                }
            }
        )
    )


def test_read_error_file_torch_format(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    write_torch_error(path)
    info = read_error_file(path)
    assert info == WorkerErrorInfo(
        message="ValueError: bad lr", traceback=TRACEBACK, timestamp=1700000000.0
    )
    assert not info.is_malformed


def test_read_error_file_plain_string_message(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": "RuntimeError: boom"}))
    assert read_error_file(path) == WorkerErrorInfo(message="RuntimeError: boom")


def test_read_error_file_missing(tmp_path: Path) -> None:
    assert read_error_file(tmp_path / "absent.json") is None


def test_read_error_file_malformed(tmp_path: Path) -> None:
    for text in ["{not json", "[1, 2]", '{"message": {"extraInfo": {}}}', "", "\xff\xfe"]:
        path = tmp_path / "error.json"
        path.write_text(text, errors="surrogateescape")
        info = read_error_file(path)
        assert info is not None
        assert info.is_malformed
        assert "malformed error file" in info.message
        assert info.raw is not None


def test_read_error_file_bad_extra_info(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_text(
        json.dumps({"message": {"message": "E: x", "extraInfo": {"timestamp": "soon"}}})
    )
    assert read_error_file(path) == WorkerErrorInfo(message="E: x")


def record(
    global_rank: int, exitcode: int, timestamp: float, error: WorkerErrorInfo | None = None
) -> FailureRecord:
    return FailureRecord(
        local_rank=global_rank % 2,
        global_rank=global_rank,
        role="default",
        pid=1000 + global_rank,
        exitcode=exitcode,
        timestamp=timestamp,
        host="node-a",
        error_file=f"/logs/{global_rank}/error.json",
        log_dir=Path(f"/logs/{global_rank}"),
        error=error,
    )


def test_signal_name() -> None:
    assert record(0, -signal.SIGKILL, 0).signal_name() == "SIGKILL"
    assert record(0, 1, 0).signal_name() == "<N/A>"
    assert record(0, -signal.SIGTERM, 0).how == "killed by SIGTERM (signal 15)"
    assert record(0, 2, 0).how == "exit code 2"


def test_root_cause_is_the_earliest() -> None:
    late = record(0, -signal.SIGTERM, 200.0)
    early = record(3, 1, 100.0)
    assert root_cause([late, early]) is early
    assert root_cause([]) is None


def test_format_failure_summary() -> None:
    error = WorkerErrorInfo(message="ValueError: bad lr", traceback=TRACEBACK, timestamp=100.0)
    failures = [record(0, -signal.SIGTERM, 200.0), record(3, 1, 100.0, error)]
    text = format_failure_summary("job42", failures)
    assert text.startswith("run 'job42' failed: 2 worker(s) failed\n")
    root_at = text.index("[root cause (first failure)] rank 3")
    other_at = text.index("[failure 2] rank 0")
    assert root_at < other_at
    root_part = text[root_at:other_at]
    for fact in [
        "exit code 1",
        "pid:        1003",
        "host:       node-a",
        "ValueError: bad lr",
        'File "train.py", line 3',
        "/logs/3/error.json",
        "logs:       /logs/3",
    ]:
        assert fact in root_part, fact
    assert "killed by SIGTERM (signal 15)" in text[other_at:]
    assert "no error file" in text[other_at:]


def test_format_failure_summary_shows_raw_malformed_file() -> None:
    error = WorkerErrorInfo(message="malformed error file /x", raw="{oops")
    text = format_failure_summary("r", [record(1, 1, 1.0, error)])
    assert "raw error file:" in text
    assert "{oops" in text


def test_render_failure_summary() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, color_system=None)
    error = WorkerErrorInfo(message="ValueError: bad lr", traceback=TRACEBACK, timestamp=100.0)
    render_failure_summary(
        "job42", [record(0, -signal.SIGKILL, 200.0), record(3, 1, 100.0, error)], console
    )
    out = buffer.getvalue()
    assert "run 'job42' failed" in out
    assert out.index("root cause: rank 3") < out.index("rank 0")
    assert "ValueError: bad lr" in out
    assert "killed by SIGKILL (signal 9)" in out
    assert "/logs/3" in out
