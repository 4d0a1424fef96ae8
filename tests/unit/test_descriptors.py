"""descriptors.py: accept()'s errors, the pause after them, and the count of free descriptors."""

from __future__ import annotations

import errno
import os

import pytest

from elastic_run.descriptors import AcceptPause, accept_error_kind, free_descriptors


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (OSError(errno.EMFILE, "Too many open files"), "resources"),
        (OSError(errno.ENFILE, "Too many open files in system"), "resources"),
        (OSError(errno.ENOBUFS, "No buffer space"), "resources"),
        (OSError(errno.ENOMEM, "Cannot allocate memory"), "resources"),
        (ConnectionAbortedError(errno.ECONNABORTED, "aborted"), "connection"),
        (OSError(errno.EPROTO, "Protocol error"), "connection"),
        (OSError(errno.EPERM, "Operation not permitted"), "connection"),
        (OSError(errno.EBADF, "Bad file descriptor"), "other"),
    ],
)
def test_accept_errors_are_classified(exc: OSError, kind: str) -> None:
    assert accept_error_kind(exc) == kind


def test_an_episode_is_logged_once_and_its_pause_doubles_up_to_the_cap() -> None:
    pause = AcceptPause(first_s=0.05, max_s=0.2)
    assert not pause.is_paused(0.0)
    assert pause.failed(10.0) is True  # the first failure: log it
    assert pause.resume_at == pytest.approx(10.05)
    assert pause.is_paused(10.04)
    assert not pause.is_paused(10.05)
    assert pause.resume_at is None
    firsts = [pause.failed(now) for now in (11.0, 12.0, 13.0)]
    assert firsts == [False, False, False]  # the same episode: not logged again
    assert pause.resume_at == pytest.approx(13.2)  # 0.1, 0.2, then capped at 0.2
    assert pause.succeeded() == 4  # the episode ends after 4 failures: log that once
    assert pause.succeeded() == 0
    assert pause.failed(20.0) is True  # a new episode starts over
    assert pause.resume_at == pytest.approx(20.05)


def test_free_descriptors_drops_as_files_open() -> None:
    before = free_descriptors()
    assert before is not None and before > 0
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(10)]
    try:
        assert free_descriptors() == before - 10
    finally:
        for fd in fds:
            os.close(fd)
    assert free_descriptors() == before
