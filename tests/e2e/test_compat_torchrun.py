"""``scripts/compat_torchrun.py``: the drop-in check, run by the suite in its short form.

The quick cases run under torchrun and elastic-run and must differ only as the README's table
says; a difference added on purpose (``--inject-difference``: one variable more in elastic-run's
workers, through the same comparison) must fail the run. The script's matrix must pass every
flag of torchrun's own parser, and each allowed difference must name a row the README has.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from types import ModuleType

import pytest

from tests.helpers import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "compat_torchrun.py"


def _compat() -> ModuleType:
    """The script as a module (registered, as its dataclasses need)."""
    name = "compat_torchrun"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )


@pytest.mark.timeout(600)
def test_the_quick_cases_differ_only_as_the_readme_says() -> None:
    done = _run("--quick")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert re.search(r"^2 cases in \d+ s: \d+ differences, 0 not in the README's table$", out, re.M)
    assert "UNEXPECTED" not in out and "error:" not in out, out


@pytest.mark.timeout(600)
def test_a_difference_added_on_purpose_fails_the_run() -> None:
    done = _run("--quick", "-k", "env two workers", "--inject-difference")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    unexpected = [line for line in out.splitlines() if line.startswith("UNEXPECTED: ")]
    assert unexpected == [
        "UNEXPECTED: env two workers (OMP notice) / env: "
        "COMPAT_INJECTED: torchrun None, elastic-run '1'"
    ], out
    assert re.search(r"^1 cases in \d+ s: \d+ differences, 1 not in the README's table$", out, re.M)


def test_every_torchrun_flag_is_passed_by_some_case() -> None:
    compat = _compat()
    flags = compat.torchrun_flags()
    # Read from torch's parser: the flags the README's list leaves out of a hand-made one too.
    for dest in ("role", "run_path", "monitor_interval", "signals_to_handle", "start_method"):
        assert dest in flags, sorted(flags)
    assert "help" not in flags
    assert compat.uncovered_flags(compat.cases(), flags) == []


def test_a_flag_that_no_case_passes_is_found() -> None:
    compat = _compat()
    without_role = [c for c in compat.cases() if not any("--role" in node for node in c.nodes)]
    assert compat.uncovered_flags(without_role, compat.torchrun_flags()) == ["--role"]


def test_each_allowed_difference_names_a_row_of_the_readme_table() -> None:
    compat = _compat()
    rows = compat.readme_rows()
    assert "launcher stopped by signal N" in rows
    assert compat.unknown_rows(compat.DELIBERATE, rows) == []
    made_up = compat.Deliberate("a row nobody wrote", "env", "X: .*")
    assert compat.unknown_rows([made_up], rows) == ["a row nobody wrote"]
