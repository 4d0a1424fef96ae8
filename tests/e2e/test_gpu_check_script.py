"""scripts/gpu_check.py as a user runs it, on a machine without a GPU: one line saying so, exit
0; a bad ``--only`` is one ``Error:`` line and exit 2. (The checks themselves need a GPU: see
README "GPU check".)"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gpu_check.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )


@pytest.mark.skipif(
    shutil.which("nvidia-smi") is not None, reason="this machine may have a GPU: the checks run"
)
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0() -> None:
    done = _run("--json", "/nonexistent/never-written.json")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "gpu_check: no GPU on this machine (nvidia-smi not found); nothing to check"
    ]
    assert done.stderr == ""


def test_a_bad_only_is_one_error_line_and_exit_2() -> None:
    done = _run("--only", "1,9")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "Error: --only '1,9': '9' is not a check number (1, 2, 3, 4, 5, 6, 7)"
    ]
