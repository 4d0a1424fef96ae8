"""Test-suite set-up: the repository on sys.path, a guard that makes process leaks loud, and a
run that fails when a test skipped.

Nothing here starts a process. The autouse ``no_leaked_processes`` fixture fails a test that
leaves a process of its own running, and kills that process. A test's processes are the
descendants of pytest that appeared during the test, plus any process that carries the test's
marker variable (set in ``os.environ`` for the test's duration and inherited by what it
starts), so workers orphaned by a dead agent are caught too. Processes that fixtures of a wider
scope (module, session) started before the test are not the test's.

Nothing is left in the temp folder: the autouse session fixture ``private_temp_folder`` gives
the session's every process a private ``TMPDIR`` (a fresh folder of the system temp folder, set
in ``os.environ`` before the first test, inherited by all it starts: agents, etcd, Slurm daemons
and their jobs; ``tempfile`` honours it), and at the session's end fails naming whatever is still
in it (then removes it). A private folder, not a before/after listing of ``/tmp``: other test
runs on the same machine write there at the same time. pytest's own ``tmp_path`` folders stay
where pytest keeps them (its last three runs). Launchers given no ``--log-dir`` log under the
test's ``tmp_path`` (``PET_LOG_DIR``), not in the temp folder.

No skip passes: on the machine the README's set-up prepares, every test runs. A test that needs
a program fails when it is missing (``tests/machine.py``: one ``missing: ...`` line, repeated
once in the run's summary however many tests it failed), and a run in which any test skipped
(the few skips left are platforms no set-up can change, such as a system other than Linux) ends
with a non-zero status and one line saying so. ``ELASTIC_RUN_ALLOW_SKIPS=1`` lets such a run
pass, for a developer on another platform; the README's check never sets it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.forked_agents import template_pids  # noqa: E402
from tests.helpers import TICKS_PER_S, ProcessTable, wait_until  # noqa: E402  (needs the path above)
from tests.machine import MISSING, require_etcd  # noqa: E402

ALLOW_SKIPS_VARIABLE = "ELASTIC_RUN_ALLOW_SKIPS"

TEST_MARKER_VARIABLE = "ELASTIC_RUN_TEST_ID"
# A process that is on its way out (signalled as the test ended) gets this long to go.
_EXIT_GRACE_S = 3.0

ProcessKey = tuple[int, int]  # (pid, start in clock ticks since boot): a pid may be reused


def _descendants(table: ProcessTable) -> dict[ProcessKey, int]:
    """This process's living descendants, but for the agent templates (kept for later tests)."""
    templates = template_pids()
    found: dict[ProcessKey, int] = {}
    for pid in table.descendants(os.getpid()):
        key = table.key(pid)
        if key is not None and pid not in templates:
            found[key] = pid
    return found


def _describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {proc.pid}: (exited)"


@pytest.fixture(autouse=True)
def no_leaked_processes() -> Iterator[None]:
    """Fail the test if a process it started is still running after it, and kill that process.

    Yields:
        Nothing; the check runs after the test and its function-scoped fixtures.
    """
    before = set(_descendants(ProcessTable()))
    marker = uuid.uuid4().hex
    since = ProcessTable.now() - TICKS_PER_S  # a margin of a second
    previous = os.environ.get(TEST_MARKER_VARIABLE)
    os.environ[TEST_MARKER_VARIABLE] = marker
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(TEST_MARKER_VARIABLE, None)
        else:
            os.environ[TEST_MARKER_VARIABLE] = previous

    def leaked() -> dict[ProcessKey, int]:
        table = ProcessTable()
        found = {k: pid for k, pid in _descendants(table).items() if k not in before}
        for pid in table.marked(TEST_MARKER_VARIABLE, marker, since):
            key = table.key(pid)
            if key is not None:
                found[key] = pid
        return found

    try:
        wait_until(lambda: not leaked(), _EXIT_GRACE_S)
    except AssertionError:
        survivors = []
        for pid in leaked().values():
            try:
                survivors.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
        lines = [_describe(proc) for proc in survivors]
        for proc in survivors:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(survivors, timeout=10)
        if survivors:
            pytest.fail(
                "the test left processes running (now killed):\n  " + "\n  ".join(lines),
                pytrace=False,
            )


TEMP_VARIABLE = "TMPDIR"
# torch's own compile cache (torch/_inductor: ``<temp>/torchinductor_<user>``), made by importing
# parts of torch and meant to outlive a run: torch's, not a test's or the product's leftover.
TORCH_CACHE_PREFIX = "torchinductor_"
# Each entry of the private temp folder -> the test after which it was first seen.
_first_seen: dict[str, str] = {}


def _left_in(folder: Path) -> list[str]:
    """What is in ``folder`` but torch's cache: each entry with its size and the test after which
    it appeared, largest first."""
    found = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(TORCH_CACHE_PREFIX):
            continue
        size = 0
        for path in [entry, *(entry.rglob("*") if entry.is_dir() else [])]:
            try:
                size += path.lstat().st_size
            except OSError:
                pass
        found.append((size, entry.name))
    return [
        f"{name} ({size / 1e6:.1f} MB, after {_first_seen.get(name, 'the last test')})"
        for size, name in sorted(found, reverse=True)
    ]


@pytest.fixture(scope="session", autouse=True)
def private_temp_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Give the session a private temp folder; fail the session if anything is left in it.

    Before judging, the orphans the product itself reclaims (etcd and function workers' folders
    whose owners were SIGKILLed: the next elastic-run on a host removes them) are removed, as
    that next run would.

    Yields:
        The folder (also ``TMPDIR`` and ``tempfile.gettempdir()`` meanwhile).
    """
    from elastic_run.rendezvous.owned_dir import reclaim_every_orphan

    tmp_path_factory.getbasetemp()  # pytest's own folder first, where pytest keeps it
    folder = Path(tempfile.mkdtemp(prefix="elastic-run-tests-"))
    previous = os.environ.get(TEMP_VARIABLE)
    os.environ[TEMP_VARIABLE] = str(folder)
    tempfile.tempdir = None  # tempfile reads TMPDIR again
    try:
        yield folder
    finally:
        if previous is None:
            os.environ.pop(TEMP_VARIABLE, None)
        else:
            os.environ[TEMP_VARIABLE] = previous
        tempfile.tempdir = None
        reclaim_every_orphan(folder)
        left = _left_in(folder)
        shutil.rmtree(folder, ignore_errors=True)
    if left:
        pytest.fail(
            "the test session left files in its temp folder (now removed): " + ", ".join(left),
            pytrace=False,
        )


LOG_DIR_VARIABLE = "PET_LOG_DIR"  # torchrun's --log-dir, and ours, from the environment


@pytest.fixture(autouse=True)
def _test_log_dir(
    request: pytest.FixtureRequest, tmp_path: Path, private_temp_folder: Path
) -> Iterator[None]:
    """Each test's launchers log under its own ``tmp_path`` when it gives no ``--log-dir``
    (``PET_LOG_DIR``, which torchrun and elastic-run both read): their default,
    ``<temp>/torchelastic_*``, is kept by design for the user, and would be left in the temp
    folder. After the test, note which new entries of the temp folder appeared (the session's
    message names the test)."""
    previous = os.environ.get(LOG_DIR_VARIABLE)
    os.environ[LOG_DIR_VARIABLE] = str(tmp_path / "default-logs")
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(LOG_DIR_VARIABLE, None)
        else:
            os.environ[LOG_DIR_VARIABLE] = previous
        for name in os.listdir(private_temp_folder):
            _first_seen.setdefault(name, request.node.nodeid)


@pytest.fixture(scope="session")
def etcd_binary() -> str:
    """The etcd executable the product's EtcdServer would start; fails the test when missing.

    Session-scoped so that it comes before any module-scoped fixture that starts an etcd.

    Returns:
        Its path (ELASTIC_RUN_ETCD_BINARY, else PATH).
    """
    return require_etcd()


# ---- a run with skips fails; what is missing is said once -----------------------------------


class _SkipGuard:
    """Counts the run's skips and ``missing:`` failures; fails a run with skips at its end."""

    def __init__(self) -> None:
        self.skipped: list[str] = []
        self.missing: dict[str, int] = {}  # the one line -> how many tests it failed

    def _note(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skipped.append(report.nodeid)
        elif report.failed and report.longreprtext.startswith(MISSING):
            line = report.longreprtext.splitlines()[0]
            self.missing[line] = self.missing.get(line, 0) + 1

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._note(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._note(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        allowed = os.environ.get(ALLOW_SKIPS_VARIABLE) == "1"
        if self.skipped and not allowed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        for line, count in self.missing.items():
            tests = "test" if count == 1 else "tests"
            terminalreporter.write_line(f"{line} [failed {count} {tests}]", red=True, bold=True)
        if self.skipped:
            if os.environ.get(ALLOW_SKIPS_VARIABLE) == "1":
                verdict = f"passed anyway: {ALLOW_SKIPS_VARIABLE}=1"
            else:
                verdict = f"the run fails ({ALLOW_SKIPS_VARIABLE}=1 lets it pass)"
            terminalreporter.write_line(
                f"{len(self.skipped)} skipped, which the README's machine never does: {verdict}",
                red=True,
                bold=True,
            )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_SkipGuard(), "elastic-run-skip-guard")


LINK_CHECK_VARIABLE = "PET_LINK_CHECK"


@pytest.fixture(autouse=True, scope="session")
def _no_link_check_by_default() -> Iterator[None]:
    """The session's agents run with ``--link-check off`` unless a test asks for it: the
    check's helper imports torch (about 2 s of CPU per node of a multi-node job, several
    hundred agents a run), and only the link check's own tests are about it
    (``tests/integration/test_link_check.py``, ``tests/e2e/test_link_netns.py``, the agent-level
    case in ``tests/e2e/test_bad_nodes.py``, each giving ``--link-check`` itself)."""
    previous = os.environ.get(LINK_CHECK_VARIABLE)
    os.environ.setdefault(LINK_CHECK_VARIABLE, "off")
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(LINK_CHECK_VARIABLE, None)
