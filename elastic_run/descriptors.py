"""Listening under descriptor pressure: how many file descriptors are left, and accept()'s errors.

The agent's listeners (the health server, the death-notice listener) accept connections from
anyone who can reach them. Each accepted connection costs a file descriptor, and the agent needs
descriptors for its own work (store connections, worker pipes, log files). This module holds the
three pieces the listeners share:

- :func:`free_descriptors`: the soft ``RLIMIT_NOFILE`` minus the descriptors open now (counted
  in ``/proc/self/fd``, one ``listdir``: call it once per accept burst, not per connection).
  A listener that sees fewer than :data:`RESERVED_DESCRIPTORS` free closes new connections at
  once, so a flood of clients never takes the last descriptors from the agent.
- :func:`accept_error_kind`: what an ``accept()`` error means. ``"connection"``: that one
  pending connection failed (Linux reports a pending connection's network error on accept);
  skip it and accept the next. ``"resources"``: the process or the system is out of descriptors
  or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM); the connection stays in the kernel's backlog, so
  accepting again at once would spin. Anything else is ``"other"`` and is treated like
  ``"resources"``: a listener never ends on an accept error, it pauses and tries again.
- :class:`AcceptPause`: when to try again after such an error (a short pause that doubles up to
  a second), and whether to log it: once when an episode of errors begins, once when it ends,
  never per error. Pure: the caller passes ``now``.
"""

from __future__ import annotations

import errno
import os
import resource
import socket
from collections.abc import Callable, Iterator
from typing import Any, Literal

__all__ = [
    "accept_some",
    "RESERVED_DESCRIPTORS",
    "AcceptErrorKind",
    "AcceptPause",
    "accept_error_kind",
    "free_descriptors",
]

RESERVED_DESCRIPTORS = 64
"""Below this many free descriptors, listeners close new connections at once."""

AcceptErrorKind = Literal["connection", "resources", "other"]

_CONNECTION_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNABORTED",
        "EPROTO",
        "EPERM",
        "ENETDOWN",
        "ENOPROTOOPT",
        "EHOSTDOWN",
        "ENONET",
        "EHOSTUNREACH",
        "EOPNOTSUPP",
        "ENETUNREACH",
        "ETIMEDOUT",
        "ECONNRESET",
    )
    if hasattr(errno, name)
)
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_PROC_FD = "/proc/self/fd"


def free_descriptors() -> int | None:
    """How many more file descriptors this process may open now.

    Returns:
        The soft ``RLIMIT_NOFILE`` minus the descriptors open now, or None when either is
        unknown (no ``/proc``) or the limit is unlimited. Counting costs one ``listdir`` of
        ``/proc/self/fd`` (which itself briefly holds one descriptor, so the count is exact or
        one high); if even that cannot be opened, the answer is 0.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        open_now = len(os.listdir(_PROC_FD))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in _RESOURCE_ERRNOS:
            return 0
        return None
    return max(0, soft - open_now)


def accept_error_kind(exc: OSError) -> AcceptErrorKind:
    """Classify an error raised by ``accept()`` (see the module docstring).

    Args:
        exc: the error.

    Returns:
        ``"connection"``, ``"resources"`` or ``"other"``.
    """
    if isinstance(exc, (ConnectionAbortedError, ConnectionResetError)):
        return "connection"
    if exc.errno in _RESOURCE_ERRNOS:
        return "resources"
    if exc.errno in _CONNECTION_ERRNOS:
        return "connection"
    return "other"


class AcceptPause:
    """When a listener may call ``accept()`` again after a resource error, and when to log.

    An *episode* is a run of failures with no successful accept in between. The first failure of
    an episode is the one to log; the pause starts at ``first_s`` and doubles with each failure
    up to ``max_s``; a successful accept ends the episode (log that once too).

    Args:
        first_s: the first pause.
        max_s: the longest pause.
    """

    def __init__(self, first_s: float = 0.05, max_s: float = 1.0) -> None:
        self._first_s = first_s
        self._max_s = max_s
        self._next_s = first_s
        self._resume_at: float | None = None
        self.failures = 0
        """Failures in the current episode (0: not in one)."""

    @property
    def resume_at(self) -> float | None:
        """When accepting may resume, on the caller's clock; None when not paused."""
        return self._resume_at

    def failed(self, now: float) -> bool:
        """Record a failed accept at ``now`` and pause.

        Args:
            now: the time, on the caller's monotonic clock.

        Returns:
            True for the first failure of an episode (the one to log).
        """
        self.failures += 1
        self._resume_at = now + self._next_s
        self._next_s = min(self._max_s, self._next_s * 2)
        return self.failures == 1

    def is_paused(self, now: float) -> bool:
        """Whether accepting must still wait at ``now``; clears an expired pause.

        Args:
            now: the time, on the caller's monotonic clock.

        Returns:
            True while the pause lasts.
        """
        if self._resume_at is None:
            return False
        if now < self._resume_at:
            return True
        self._resume_at = None
        return False

    def succeeded(self) -> int:
        """Record a successful accept: the episode, if any, is over.

        Returns:
            How many failures the episode that just ended had (0: there was none; log the end
            of an episode when this is positive).
        """
        failures, self.failures = self.failures, 0
        self._next_s = self._first_s
        self._resume_at = None
        return failures


def accept_some(
    listener: socket.socket, limit: int, on_failure: Callable[[OSError], None]
) -> Iterator[tuple[socket.socket, Any]]:
    """Accept up to ``limit`` pending connections of a non-blocking listener.

    An error that concerns one connection (see :func:`accept_error_kind`) skips it; any other
    error (out of descriptors or memory) is handed to ``on_failure`` and ends the burst, as
    does an empty backlog.

    Yields:
        ``(connection, address)`` for each accepted connection.
    """
    for _ in range(limit):
        try:
            yield listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if accept_error_kind(exc) == "connection":
                continue
            on_failure(exc)
            return
