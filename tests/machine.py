"""What the tests need of the machine, found or failed in one line: programs, etcd, root.

The tests start real programs (etcd, Slurm and munge, tmux, openssl, iproute2's ``ip``,
chromium), and
``scripts/setup.sh`` installs every one of them. A test that needs one asks here first; when it
is missing, the test fails (never skips) with one line that says what is missing and how to get
it, starting with :data:`MISSING`. The root conftest collects those lines and repeats each once at
the end of the run, so that a machine without etcd reads as one line, not as eighty tracebacks.

Stateless on purpose: the test modules import this module under two names (``tests.machine``
and, from a directory put on ``sys.path``, ``machine``), so it keeps nothing between calls.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import NoReturn

import pytest

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.etcd.server import find_etcd_binary

__all__ = [
    "MISSING",
    "SETUP",
    "fail_missing",
    "require_etcd",
    "require_linux",
    "require_program",
    "require_root",
]

MISSING = "missing: "
SETUP = "scripts/setup.sh, as root, installs it"
# A plain user's PATH often lacks the sbin directories where slurmctld, munged or ip live.
_SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")


def fail_missing(what: str) -> NoReturn:
    """Fail the calling test with the one line ``missing: <what>`` (no traceback).

    Args:
        what: what is missing and how to get it, in one line.

    Raises:
        pytest.fail.Exception: always.
    """
    pytest.fail(MISSING + what, pytrace=False)


def require_program(name: str, package: str) -> str:
    """The path of the program ``name``, on PATH or in an sbin directory; else fail the test.

    Args:
        name: the program (``tmux``, ``openssl``, ``ip``, ``chromium``).
        package: the Debian package that provides it (named in the failure).

    Returns:
        The program's path.

    Raises:
        pytest.fail.Exception: the program is not installed (``missing: tmux (apt-get install
            tmux; ...)``).
    """
    found = shutil.which(name)
    if found is not None:
        return found
    for directory in _SBIN:
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    fail_missing(f"the program {name} (apt-get install {package}; {SETUP})")


def require_etcd() -> str:
    """The etcd the tests start: ELASTIC_RUN_ETCD_BINARY (or torch's variable), else PATH.

    The same lookup as the product's ``EtcdServer``, so a test runs exactly when the server
    it starts can.

    Returns:
        The etcd executable's path.

    Raises:
        pytest.fail.Exception: no etcd, or the variable names a file that does not exist.
    """
    try:
        return find_etcd_binary()
    except ConfigurationError as exc:
        why = str(exc)
    # Outside the except block: the failure is its one line, without the error chained to it.
    fail_missing(f"etcd ({why}; apt-get install etcd-server; {SETUP})")


def require_root(what: str) -> None:
    """Fail the test unless this process is root (network namespaces need it).

    Args:
        what: what needs root, for the failure (``network namespaces``).

    Raises:
        pytest.fail.Exception: not root.
    """
    if os.geteuid() != 0:
        fail_missing(f"root, for {what} (run the tests as root, as the README's set-up does)")


def require_linux(what: str) -> None:
    """Skip the test on a platform other than Linux: a difference no set-up can fix.

    The project's machine is Linux (README: a Debian machine); on another platform these tests
    cannot run at all, which is not something missing. The root conftest still fails a run with
    skips unless ELASTIC_RUN_ALLOW_SKIPS=1.

    Args:
        what: what needs Linux, for the skip's reason.
    """
    if not sys.platform.startswith("linux"):
        pytest.skip(f"{what} needs Linux, not {sys.platform}")
