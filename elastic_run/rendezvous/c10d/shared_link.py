"""One TCPStore connection a node: the blocking waits and the liveness turns take turns on it.

A TCPStore client serves one call at a time (torch holds a lock around each request), so a
blocking ``wait`` holds up every other call of the same client until it returns. The backend
used to keep a second connection for its waits; at MAX nodes that is two descriptors a node in
the store's process (issue 38: 16,384 nodes need 32,768, over this host's 20,000). Now a node
keeps one, as torch's handler does, and its waits are cut into slices that leave the link to
the calls that need it between them:

- ``hold()``: a liveness turn (a heartbeat, a ring read, an epoch read) holds the link for its
  few requests: a wait in progress finishes its slice, and no new slice begins until the turn
  let go (or held it ``cap_s``: a turn stalled half-way, its thread starved or stopped, does
  not stop the waits with it), so the turn's requests go back to back instead of one per
  slice.
- ``expect_turn(at)``: the turn says when it comes next; a slice ends then, so the turn's
  heartbeat is not late by a slice. Without a word (the other nodes of a process whose many
  nodes beat in one batch: only the batch's lead is told) a slice is as long as the caller
  asked, at most ``cap_s``.
- ``waiting_until()``: when the slice in progress ends (None: no wait holds the link now), so a
  batch of many nodes' turns picks the link that is free soonest.

A slice that ends without its keys costs the store two requests (the wait and its cancel): one
an interval for a waiting node that beats for itself, nothing for the others.

Invariants: no slice begins while the link is held, for up to ``cap_s`` of holding; a slice
never outlasts the caller's timeout; a turn that said it comes and did not within ``_GRACE_S`` is not waited for again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["SharedLink"]

# How long a wait gives a turn that said it would come now, before it slices on without it.
_GRACE_S = 0.05
_MIN_SLICE_S = 0.001


class SharedLink:
    """The turns of one client between a blocking wait and other threads' short calls.

    Args:
        cap_s: the longest slice when no turn said when it comes.
    """

    def __init__(self, cap_s: float) -> None:
        self._cap_s = max(_MIN_SLICE_S, cap_s)
        self._cond = threading.Condition()
        self._held = 0
        self._held_since = 0.0
        self._due: float | None = None
        self._slice_end: float | None = None

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Keep waits from starting a slice while the calls inside run (re-entrant)."""
        with self._cond:
            if not self._held:
                self._held_since = time.monotonic()
            self._held += 1
            self._due = None
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                self._cond.notify_all()

    def expect_turn(self, at: float) -> None:
        """The next turn that needs the link comes at ``at`` (``time.monotonic``)."""
        with self._cond:
            self._due = at

    def waiting_until(self) -> float | None:
        """When the slice of the wait in progress ends (None: no wait holds the link)."""
        return self._slice_end

    def wait(self, attempt: Callable[[float], bool], timeout_s: float) -> bool:
        """Call ``attempt(slice_s)`` (one blocking wait, True when its keys came) in slices
        until it returns True or ``timeout_s`` passed; False then."""
        end = time.monotonic() + max(timeout_s, 0.0)
        while True:
            piece = self._next_slice(end)
            try:
                if attempt(piece):
                    return True
            finally:
                self._slice_end = None
            if time.monotonic() >= end:
                return False

    def _next_slice(self, end: float) -> float:
        with self._cond:
            while True:
                now = time.monotonic()
                if self._held and now - self._held_since < self._cap_s:
                    self._cond.wait(self._cap_s - (now - self._held_since))
                    continue
                due = self._due
                if due is not None and due <= now:
                    if now - due < _GRACE_S:  # the turn is due: it takes the link first
                        self._cond.wait(_GRACE_S - (now - due))
                        continue
                    self._due = due = None  # it did not come (another link carried it)
                break
            piece = min(end - now, self._cap_s)
            if due is not None:
                piece = min(piece, due - now)
            piece = max(piece, _MIN_SLICE_S)
            self._slice_end = now + piece
            return piece
