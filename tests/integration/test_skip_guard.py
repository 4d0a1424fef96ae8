"""The suite's own guards, on a real pytest run: a skip fails the run, a missing program is one line.

Each test writes a tiny test module to a temporary directory and runs pytest on it in a
subprocess with the root conftest loaded as a plugin (``-p tests.conftest``), as the suite's own
run loads it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

_SKIPPING = """
import pytest

def test_skipped() -> None:
    pytest.skip("another platform")

def test_passes() -> None:
    assert True
"""

_NEEDS_A_PROGRAM = """
from tests.machine import require_program

def test_needs_it() -> None:
    require_program("no-such-program-for-elastic-run", "no-such-package")

def test_needs_it_too() -> None:
    require_program("no-such-program-for-elastic-run", "no-such-package")
"""


def _pytest(tmp_path: Path, source: str, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(source)
    full_env = {k: v for k, v in os.environ.items() if k != "ELASTIC_RUN_ALLOW_SKIPS"}
    full_env.update(env, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider"]
        + ["-q", "-rs", "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "basetemp")]
        + [str(tmp_path / "test_sample.py")],
        cwd=REPO_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_run_with_a_skip_fails_and_says_why(tmp_path: Path) -> None:
    done = _pytest(tmp_path, _SKIPPING)
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    assert "1 passed, 1 skipped" in done.stdout
    assert "1 skipped, which the README's machine never does: the run fails" in done.stdout


def test_the_opt_out_lets_a_run_with_a_skip_pass(tmp_path: Path) -> None:
    done = _pytest(tmp_path, _SKIPPING, ELASTIC_RUN_ALLOW_SKIPS="1")
    assert done.returncode == pytest.ExitCode.OK, done.stdout + done.stderr
    assert "passed anyway: ELASTIC_RUN_ALLOW_SKIPS=1" in done.stdout


def test_a_missing_program_fails_each_test_and_is_said_once_at_the_end(tmp_path: Path) -> None:
    done = _pytest(tmp_path, _NEEDS_A_PROGRAM)
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    line = (
        "missing: the program no-such-program-for-elastic-run (apt-get install no-such-package; "
        "scripts/setup.sh, as root, installs it)"
    )
    lines = done.stdout.splitlines()
    assert lines.count(line) == 2, done.stdout  # each test's failure is that line alone
    assert lines.count(f"{line} [failed 2 tests]") == 1, done.stdout
    assert "Traceback" not in done.stdout and "skipped" not in done.stdout
