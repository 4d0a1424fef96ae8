"""elastic_run.elastic.multiprocessing.errors against torch.distributed.elastic.multiprocessing.errors.

From torch's docs: ``@record`` writes an uncaught exception (message and traceback) to the file
named by ``TORCHELASTIC_ERROR_FILE`` and re-raises it; it is equivalent to
``get_error_handler()``, ``initialize()``, and on ``ChildFailedError`` ``dump_error_file(
failure.error_file, failure.exitcode)`` of the first failure, on any other exception
``record_exception(e)``. ``ProcessFailure(local_rank, pid, exitcode, error_file)`` reads the
file (message, timestamp), or makes up a message when there is none; the root cause is the
failure with the smallest timestamp. Each test runs the decorated code in a real child process,
with ours and torch's side by side where both exist.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import elastic_run.elastic.multiprocessing.errors as ours
from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.timeout(120)

MODULES = {
    "ours": "elastic_run.elastic.multiprocessing.errors",
    "torch": "torch.distributed.elastic.multiprocessing.errors",
}


def run_child(code: str, error_file: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    if error_file is not None:
        env["TORCHELASTIC_ERROR_FILE"] = str(error_file)
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=90
    )


RAISES = """
from {module} import record

@record
def main():
    raise ValueError("bad lr 3e-4")

main()
"""


@pytest.mark.parametrize("kind", ["ours", "torch"])
def test_record_writes_the_same_error_file(tmp_path: Path, kind: str) -> None:
    error_file = tmp_path / "error.json"
    proc = run_child(RAISES.format(module=MODULES[kind]), error_file)
    assert proc.returncode == 1
    assert "ValueError: bad lr 3e-4" in proc.stderr  # re-raised
    data = json.loads(error_file.read_text())
    assert set(data) == {"message"}
    assert data["message"]["message"] == "ValueError: bad lr 3e-4"
    assert set(data["message"]["extraInfo"]) == {"py_callstack", "timestamp"}
    assert ", in main" in data["message"]["extraInfo"]["py_callstack"]
    assert abs(int(data["message"]["extraInfo"]["timestamp"]) - time.time()) < 120

    failure = ours.ProcessFailure(0, 4242, 1, str(error_file))  # read as the agent reads it
    assert failure.message == data["message"]
    assert failure.error_file_data == data
    assert failure.timestamp == int(data["message"]["extraInfo"]["timestamp"])


CLEAN_EXIT = """
import sys
from {module} import record

@record
def main():
    sys.exit(0)

print("returned", main())
"""


@pytest.mark.parametrize("kind", ["ours", "torch"])
def test_record_turns_a_clean_exit_into_none(tmp_path: Path, kind: str) -> None:
    error_file = tmp_path / "error.json"
    proc = run_child(CLEAN_EXIT.format(module=MODULES[kind]), error_file)
    assert proc.returncode == 0 and "returned None" in proc.stdout
    assert not error_file.exists()


NANNY = """
import json, sys
from {module} import ChildFailedError, ProcessFailure, record

@record
def main():
    failures = {{
        3: ProcessFailure(local_rank=1, pid=111, exitcode=-9, error_file=sys.argv[1]),
        2: ProcessFailure(local_rank=0, pid=222, exitcode=1, error_file="/nonexistent/error.json"),
    }}
    raise ChildFailedError("trainer", failures)

main()
"""


@pytest.mark.parametrize("kind", ["ours", "torch"])
def test_a_launcher_passes_its_childs_error_up_with_its_exit_code(
    tmp_path: Path, kind: str
) -> None:
    child_file = tmp_path / "child.json"
    child_file.write_text(
        json.dumps(
            {
                "message": {
                    "message": "RuntimeError: CUDA error",
                    "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1000"},
                }
            }
        )
    )
    mine = tmp_path / "mine.json"
    proc = run_child(NANNY.format(module=MODULES[kind]), mine, str(child_file))
    assert proc.returncode == 1
    assert "trainer FAILED" in proc.stderr
    copied = json.loads(mine.read_text())
    assert copied["message"]["message"] == "RuntimeError: CUDA error"
    assert copied["message"]["errorCode"] == -9


def test_process_failure_without_an_error_file_is_described_by_its_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Side by side with torch's: the same fields and data (``errorTraits`` for a process that
    exited by itself and said nothing), the same message for a signal; for an exit, ours says
    what to do (README: "`ProcessFailure.message` of a process that exited")."""
    import torch.distributed.elastic.multiprocessing.errors as torch_errors
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure as TorchFailure

    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"message": ""}))
    cases = {
        "killed": (0, 77, -signal.SIGKILL, str(tmp_path / "absent.json")),
        "exited": (1, 78, 2, str(tmp_path / "absent.json")),
        "exited, an error file without a message": (1, 79, 1, str(empty)),
        "killed, an error file without a message": (1, 80, -signal.SIGTERM, str(empty)),
    }
    for name, args in cases.items():
        # Torch's failures without an error file share one module dict, and an exit's adds its
        # errorTraits to it: every later failure in the process (a signal's too) carries them.
        # Each case starts from torch's pristine dict, as in a fresh process.
        monkeypatch.setattr(torch_errors, "_EMPTY_ERROR_DATA", {"message": "<NONE>"})
        mine, theirs = ours.ProcessFailure(*args), TorchFailure(*args)
        assert (mine.error_file, mine.error_file_data, mine.signal_name()) == (
            theirs.error_file,
            theirs.error_file_data,
            theirs.signal_name(),
        ), name
        if args[2] < 0:
            assert mine.message == theirs.message, name
        else:
            assert mine.message == (
                f"exit code {args[2]}, no error file (decorate the entrypoint with @record to have "
                "its exception and traceback here)"
            ), name
    killed = ours.ProcessFailure(*cases["killed"])
    assert killed.error_file_data == {"message": "<NONE>"}
    assert "Signal 9 (SIGKILL)" in killed.message and "77" in killed.message
    assert abs(killed.timestamp - time.time()) < 60
    assert killed.timestamp_isoformat().count("_") == 1  # YYYY-MM-DD_HH:MM:SS
    exited = ours.ProcessFailure(*cases["exited"])
    assert exited.error_file_data["errorTraits"] == {
        "category": "system_terminated_error",
        "retryability": "False",
    }


def test_process_failure_reads_torchs_own_error_file(tmp_path: Path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure as TorchFailure

    error_file = tmp_path / "error.json"
    run_child(RAISES.format(module=MODULES["torch"]), error_file)
    theirs = TorchFailure(0, 1, 1, str(error_file))
    mine = ours.ProcessFailure(0, 1, 1, str(error_file))
    assert (mine.message, mine.timestamp, mine.error_file_data) == (
        theirs.message,
        theirs.timestamp,
        theirs.error_file_data,
    )


@pytest.mark.parametrize("timestamp", [10, "10"], ids=["an int", "a str"])
def test_process_failure_reads_the_flat_form_as_torchs(tmp_path: Path, timestamp: object) -> None:
    """``{"message": "...", "timestamp": ...}``, the form torch's test names new (and "mast"),
    read side by side: the message and the timestamp given."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure as TorchFailure

    error_file = tmp_path / "error.json"
    error_file.write_text(json.dumps({"message": "test error message", "timestamp": timestamp}))
    theirs = TorchFailure(0, 997, 1, str(error_file))
    mine = ours.ProcessFailure(0, 997, 1, str(error_file))
    assert (
        (mine.message, mine.timestamp, mine.error_file)
        == (
            theirs.message,
            theirs.timestamp,
            theirs.error_file,
        )
        == ("test error message", 10, str(error_file))
    )


@pytest.mark.parametrize("path", ["", "."], ids=["empty", "a folder"])
def test_an_error_file_path_that_is_no_file_is_none_as_torchs(path: str) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure as TorchFailure

    theirs, mine = TorchFailure(0, 997, 1, path), ours.ProcessFailure(0, 997, 1, path)
    assert mine.error_file == theirs.error_file == "<N/A>"
    assert mine.error_file_data == theirs.error_file_data


RECORDS_A_CHILD_WITHOUT_A_FILE = """
import os
from {module} import ChildFailedError, ProcessFailure, record

@record
def main():
    raise ChildFailedError("trainer", {{0: ProcessFailure(0, 997, 1, "")}})

try:
    main()
except ChildFailedError:
    print("re-raised")
"""


@pytest.mark.parametrize("kind", ["ours", "torch"])
def test_record_passes_a_child_failure_without_an_error_file_up(tmp_path: Path, kind: str) -> None:
    """torch's test: ``@record`` re-raises a ``ChildFailedError`` whose failure has no error file
    and writes no error file of its own."""
    mine = tmp_path / "mine.json"
    proc = run_child(RECORDS_A_CHILD_WITHOUT_A_FILE.format(module=MODULES[kind]), mine)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "re-raised"
    assert not mine.exists()


def test_a_malformed_error_file_is_reported_not_raised(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    error_file.write_text("{not json")
    failure = ours.ProcessFailure(0, 1, 1, str(error_file))
    assert "malformed error file" in failure.message
    assert failure.error_file == str(error_file)


def test_child_failed_error_names_the_earliest_failure_as_root_cause(tmp_path: Path) -> None:
    early, late = tmp_path / "early.json", tmp_path / "late.json"
    for path, stamp, text in ((early, "100", "first"), (late, "200", "second")):
        path.write_text(
            json.dumps(
                {
                    "message": {
                        "message": f"ValueError: {text}",
                        "extraInfo": {"py_callstack": f"Traceback: {text}", "timestamp": stamp},
                    }
                }
            )
        )
    error = ours.ChildFailedError(
        "train.py",
        {
            5: ours.ProcessFailure(1, 10, 1, str(late)),
            4: ours.ProcessFailure(0, 11, 1, str(early)),
        },
    )
    rank, failure = error.get_first_failure()
    assert rank == 4 and failure.pid == 11
    text = error.format_msg()
    assert text.startswith("\n") and "train.py FAILED" in text
    root = text[text.index("Root Cause") :]
    assert "Traceback: first" in root and "rank      : 4 (local_rank: 0)" in root
    assert "Traceback: second" in text[: text.index("Root Cause")]
    assert str(error) == text
    with pytest.raises(ValueError):
        ours.ChildFailedError("train.py", {})


def test_an_error_handler_subclass_is_used_by_record() -> None:
    seen: list[BaseException] = []

    class Collecting(ours.ErrorHandler):
        def record_exception(self, e: BaseException) -> None:
            seen.append(e)

    @ours.record
    def fine() -> int:
        return 3

    def boom() -> None:
        raise KeyError("x")

    assert fine() == 3
    with pytest.raises(KeyError):
        ours.record(boom, error_handler=Collecting())()
    assert isinstance(seen[0], KeyError)
    assert isinstance(ours.get_error_handler(), ours.ErrorHandler)
