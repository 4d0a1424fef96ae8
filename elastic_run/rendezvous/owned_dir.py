"""Owned temporary folders: a folder held by a living process, and reclaimed once it is gone.

An etcd member's data (123 MB from its first second: etcd preallocates its 64 MB WAL segments)
lives in a temporary folder that its owner removes when it ends; so do the function workers'
return values (the Python API's agents). A process SIGKILLed with its
whole tree (the OOM killer, Slurm's KillWait, a container stopped) cannot; so ownership is
recorded where the kernel keeps it: the owner holds an exclusive ``flock`` on the folder itself
(an open descriptor of the directory), which the kernel releases when the last process holding
that descriptor ends, however it ends. The next elastic-run that starts on the host calls
:func:`reclaim_orphans`, which removes each folder of a known prefix whose lock it can take:
one whose owner lives is never touched (its lock is held; a lock test cannot be fooled by a
reused pid, as a pid file can).

Protocol:

- Create (:meth:`OwnedDir.create`): ``mkdtemp``, open the directory, take the lock without
  waiting, check that the path still names the locked directory, write the marker file
  :data:`MARKER` (who made it, for people). A reclaimer that got in between (the folder was new
  and not yet locked) removed it: the creator sees that and makes another.
- Hand on (:attr:`OwnedDir.fd`): a child given the descriptor (``pass_fds``) holds the same
  lock, so the folder lives while the owner or that child does (the embedded member's keeper).
- Reclaim: a folder of the prefix whose lock is free and that holds the marker is an orphan.
  One without the marker was made by an elastic-run from before this protocol (or its creator
  died before it wrote the marker): it is removed only if no process has a file open under it
  (read from ``/proc/*/fd``; a ``/proc`` that cannot be read keeps it).

Invariants: nothing here raises for a folder that vanished or cannot be read (a reclaim is a
best effort, silent); only folders owned by this process's user are reclaimed; symbolic links
are never followed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ETCD_PREFIX",
    "MARKER",
    "OWNED_PREFIXES",
    "RESULTS_PREFIX",
    "OwnedDir",
    "reclaim_every_orphan",
    "reclaim_orphans",
]

ETCD_PREFIX = "elastic-run-etcd-"
"""The prefix of every etcd data folder elastic-run makes (embedded members, ``EtcdServer``)."""

RESULTS_PREFIX = "elastic-run-results-"
"""The prefix of the function workers' return-value folders (the Python API's agents)."""

OWNED_PREFIXES = (ETCD_PREFIX, RESULTS_PREFIX)
"""Every kind of owned folder elastic-run makes in the temp folder."""

MARKER = "elastic-run.owner"
"""The file in an owned folder that says it was made under the lock (and by which pid)."""

_CREATE_TRIES = 5


@dataclass
class OwnedDir:
    """A temporary folder this process holds locked (see the module's protocol).

    Attributes:
        path: the folder.
        fd: the open directory descriptor that holds the lock (-1 once released).
    """

    path: Path
    fd: int

    @classmethod
    def create(cls, prefix: str, parent: str | os.PathLike[str] | None = None) -> OwnedDir:
        """Make a new folder ``<parent>/<prefix>XXXXXXXX`` and hold it.

        Args:
            prefix: the folder name's start (e.g. :data:`ETCD_PREFIX`).
            parent: where (default: the system temp folder, ``TMPDIR``).

        Returns:
            The held folder.

        Raises:
            OSError: it cannot be made (or was taken away five times in a row).
        """
        for _ in range(_CREATE_TRIES):
            path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except FileNotFoundError:
                continue  # reclaimed before it was locked: make another
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if not _names(path, fd):
                    raise FileNotFoundError(errno.ENOENT, "reclaimed", str(path))
                with open(path / MARKER, "x") as marker:
                    marker.write(f"pid {os.getpid()}\n")
            except (BlockingIOError, FileNotFoundError):
                os.close(fd)  # a reclaimer holds or removed it: make another
                shutil.rmtree(path, ignore_errors=True)
                continue
            except BaseException:
                os.close(fd)
                shutil.rmtree(path, ignore_errors=True)
                raise
            return cls(path, fd)
        raise OSError(errno.EAGAIN, f"could not hold a new folder {prefix}* in {parent}")

    def remove(self) -> None:
        """Remove the folder and release it. Idempotent."""
        if self.fd >= 0:
            shutil.rmtree(self.path, ignore_errors=True)
        self.release()

    def release(self) -> None:
        """Close this process's descriptor (the folder stays; a child may still hold it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the directory open at ``fd``."""
    try:
        here = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)


def reclaim_orphans(
    prefix: str = ETCD_PREFIX, parent: str | os.PathLike[str] | None = None
) -> list[Path]:
    """Remove the folders ``<parent>/<prefix>*`` whose owner is gone.

    Args:
        prefix: which folders.
        parent: where (default: the system temp folder, ``TMPDIR``).

    Returns:
        The folders removed.
    """
    root = Path(tempfile.gettempdir() if parent is None else parent)
    try:
        entries = [
            e
            for e in os.scandir(root)
            if e.name.startswith(prefix)
            and e.is_dir(follow_symlinks=False)
            and e.stat(follow_symlinks=False).st_uid == os.geteuid()
        ]
    except OSError:
        return []
    removed: list[Path] = []
    unmarked: list[tuple[Path, int]] = []
    for entry in entries:
        path = Path(entry.path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # held: its owner lives
            continue
        if not _names(path, fd):
            os.close(fd)
            continue
        if (path / MARKER).exists():
            shutil.rmtree(path, ignore_errors=True)
            os.close(fd)
            removed.append(path)
        else:
            unmarked.append((path, fd))  # kept locked while /proc is read
    if unmarked:
        in_use = _paths_in_use([p for p, _ in unmarked])
        for path, fd in unmarked:
            if in_use is not None and path not in in_use:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
            os.close(fd)
    return removed


def reclaim_every_orphan(parent: str | os.PathLike[str] | None = None) -> list[Path]:
    """:func:`reclaim_orphans` for every prefix of :data:`OWNED_PREFIXES` (what each
    ``elastic-run`` does as it starts).

    Returns:
        The folders removed.
    """
    return [path for prefix in OWNED_PREFIXES for path in reclaim_orphans(prefix, parent)]


def _paths_in_use(folders: list[Path]) -> set[Path] | None:
    """Which of ``folders`` some process has a file (or its working directory) open under;
    None when ``/proc`` cannot be read (then every one of them counts as in use)."""
    prefixes = {str(f) + os.sep: f for f in folders}
    found: set[Path] = set()
    try:
        pids = [p for p in os.listdir("/proc") if p.isdecimal()]
    except OSError:
        return None
    readable = False
    me = str(os.getpid())  # this process holds each of them open, to lock it
    for pid in pids:
        if pid == me:
            continue
        base = f"/proc/{pid}"
        try:
            links = [f"{base}/fd/{fd}" for fd in os.listdir(f"{base}/fd")] + [f"{base}/cwd"]
        except OSError:
            continue  # gone, or another user's
        readable = True
        for link in links:
            try:
                target = os.readlink(link) + os.sep
            except OSError:
                continue
            for start, folder in prefixes.items():
                if target.startswith(start):
                    found.add(folder)
    return found if readable else None
