"""Owned temporary folders (elastic_run/rendezvous/owned_dir.py) with real processes: a folder is reclaimed
once every process holding its lock is gone, SIGKILLed or not, and never while one lives; a
folder from before the lock (no marker) only when no process has a file open under it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from elastic_run.rendezvous.owned_dir import MARKER, OwnedDir, reclaim_orphans
from tests.helpers import REPO_ROOT, wait_until

PREFIX = "owned-test-"

# A process that makes an owned folder, says where, and waits (to be killed).
OWNER = """
import sys
from elastic_run.rendezvous.owned_dir import OwnedDir
held = OwnedDir.create(sys.argv[1], sys.argv[2])
print(held.path, flush=True)
sys.stdin.read()
"""


def _owner(tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, PREFIX, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_folder_whose_owner_lives_is_kept_and_reclaimed_once_it_is_sigkilled(
    tmp_path: Path,
) -> None:
    proc, path = _owner(tmp_path)
    try:
        (path / "data").write_bytes(b"x" * 1000)
        assert (path / MARKER).read_text() == f"pid {proc.pid}\n"
        assert reclaim_orphans(PREFIX, tmp_path) == []  # its owner lives
        assert path.is_dir()
    finally:
        proc.kill()
        proc.wait()
    assert path.is_dir()  # SIGKILLed: it could not remove it
    assert reclaim_orphans(PREFIX, tmp_path) == [path]
    assert not path.exists()


def test_a_child_given_the_descriptor_holds_the_folder_after_its_parent_is_gone(
    tmp_path: Path,
) -> None:
    held = OwnedDir.create(PREFIX, tmp_path)
    child = subprocess.Popen(["sleep", "600"], pass_fds=(held.fd,))
    try:
        held.release()  # this process lets go: the child still holds the lock
        assert reclaim_orphans(PREFIX, tmp_path) == []
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert reclaim_orphans(PREFIX, tmp_path) == [held.path]


def test_remove_removes_and_release_keeps(tmp_path: Path) -> None:
    gone = OwnedDir.create(PREFIX, tmp_path)
    gone.remove()
    gone.remove()  # idempotent
    assert not gone.path.exists() and gone.fd == -1
    kept = OwnedDir.create(PREFIX, tmp_path)
    kept.release()
    assert kept.path.is_dir()
    assert reclaim_orphans(PREFIX, tmp_path) == [kept.path]  # no owner any more


def test_a_folder_without_the_marker_is_kept_while_a_file_under_it_is_open(
    tmp_path: Path,
) -> None:
    legacy = tmp_path / f"{PREFIX}legacy"
    (legacy / "member").mkdir(parents=True)
    wal = legacy / "member" / "0.wal"
    wal.write_bytes(b"w")
    reader = subprocess.Popen(
        [sys.executable, "-c", "import sys; f = open(sys.argv[1]); sys.stdin.read()", str(wal)],
        stdin=subprocess.PIPE,
    )
    try:
        wait_until(
            lambda: any(
                os.readlink(f"/proc/{reader.pid}/fd/{fd}") == str(wal)
                for fd in os.listdir(f"/proc/{reader.pid}/fd")
            ),
            30,
            "the reader to open the file",
        )
        assert reclaim_orphans(PREFIX, tmp_path) == []  # an old elastic-run's etcd, running
    finally:
        reader.kill()
        reader.wait()
    assert reclaim_orphans(PREFIX, tmp_path) == [legacy]


def test_only_folders_of_the_prefix_are_touched_and_links_are_not_followed(
    tmp_path: Path,
) -> None:
    other = tmp_path / "other-folder"
    other.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / f"{PREFIX}link").symlink_to(target, target_is_directory=True)
    (tmp_path / f"{PREFIX}file").write_text("not a folder")
    assert reclaim_orphans(PREFIX, tmp_path) == []
    assert other.is_dir() and target.is_dir() and (tmp_path / f"{PREFIX}file").exists()
    assert reclaim_orphans(PREFIX, tmp_path / "no-such-folder") == []


def test_a_creator_beaten_by_a_reclaimer_makes_another_folder(tmp_path: Path) -> None:
    # A reclaimer holding a new folder's lock (between mkdtemp and the creator's flock) makes
    # the creator start over: simulated by holding the lock of every folder as it appears.
    import fcntl
    import tempfile

    taken: list[int] = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp_then_taken(*args: object, **kwargs: object) -> str:
        path = real_mkdtemp(*args, **kwargs)  # type: ignore[arg-type]
        if not taken:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            taken.append(fd)
        return path

    tempfile.mkdtemp = mkdtemp_then_taken  # type: ignore[assignment]
    try:
        held = OwnedDir.create(PREFIX, tmp_path)
    finally:
        tempfile.mkdtemp = real_mkdtemp
        for fd in taken:
            os.close(fd)
    assert held.path.is_dir() and (held.path / MARKER).exists()
    assert [p.name for p in tmp_path.iterdir()] == [held.path.name]  # the first one removed
    held.remove()
