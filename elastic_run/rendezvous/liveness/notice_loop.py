"""The one thread of a process that serves every death-notice socket: listeners and watches.

Death notices (``peerwatch.py``) need no store and no blocking call, only sockets: a listener's
port and its greeted clients, and one outgoing connection per watch. So a single select loop
per process serves them all (thread ``elastic-run-notices``, started on first use, never
stopped): an agent has its liveness thread (the store: heartbeat, ring read) and this one, and
a process that holds many nodes (a benchmark, a test) still has one, not two per node.

Members (:class:`LoopMember`) own their sockets; the loop owns the selector. Every selector
change, and every member's state change, happens on the loop's thread: other threads hand work
over with :meth:`NoticeLoop.call` (or :meth:`NoticeLoop.call_wait` to wait for it, bounded).

Invariants:
- No member's error ends the thread: an exception of a member's handler is logged (once per
  run of failures) and the loop goes on; a failing ``select`` pauses (50 ms doubling to 1 s).
- The wake-up pipe lives as long as the process, so it is never closed under the thread.
- No member blocks the loop. Members' timers (``deadline``) are read all together only when
  the earliest one known is due, or at most every ``_SCAN_GAP_S`` while something may have
  changed one (a socket event, a handed-over call): a process holding thousands of members
  (a benchmark) read every timer twice per socket event before, which took seconds of the
  process's interpreter while thousands of watches connected at once. So a timer fires at
  most ``_SCAN_GAP_S`` late.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from elastic_run import clock
from elastic_run.descriptors import AcceptPause

__all__ = ["LoopMember", "NoticeLoop", "notice_loop"]

log = logging.getLogger(__name__)

_SCAN_GAP_S = 0.02


class LoopMember(Protocol):
    """What the loop asks of a member (all called on the loop's thread)."""

    def on_ready(self, fileobj: object, events: int) -> None:
        """A registered socket of this member is ready."""

    def deadline(self) -> float | None:
        """When (monotonic) this member wants ``on_timer``; None: no timer."""

    def on_timer(self, now: float) -> None:
        """Its deadline passed."""


class NoticeLoop:
    """One select loop with a thread; members register sockets and timers with it."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._calls: deque[Callable[[], None]] = deque()
        self._members: dict[int, LoopMember] = {}
        self._failing: set[int] = set()
        self._due_at: float | None = None  # the earliest member timer at the last scan
        self._changed = True  # a timer may have changed since that scan
        self._scanned_at = 0.0
        self._woken = False  # a wake-up byte is in the pipe and not yet drained
        self._thread = threading.Thread(target=self._run, name="elastic-run-notices", daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        """The loop's thread."""
        return self._thread

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop's thread, soon (in order of the calls)."""
        self._calls.append(fn)
        self._wake()

    def call_wait(self, fn: Callable[[], None], timeout_s: float) -> bool:
        """Run ``fn`` on the loop's thread and wait for it; return whether it ran in time."""
        if threading.current_thread() is self._thread:
            fn()
            return True
        done = threading.Event()

        def run() -> None:
            try:
                fn()
            finally:
                done.set()

        self.call(run)
        return done.wait(timeout_s)

    # -- on the loop's thread -----------------------------------------------------------

    def add(self, member: LoopMember) -> None:
        """Have ``member``'s timer looked at."""
        self._members[id(member)] = member

    def remove(self, member: LoopMember) -> None:
        """Forget ``member`` (its sockets must be unregistered already)."""
        self._members.pop(id(member), None)

    def register(self, fileobj: object, events: int, member: LoopMember) -> None:
        """Watch ``fileobj`` for ``events`` on behalf of ``member``."""
        self._selector.register(fileobj, events, member)  # type: ignore[arg-type]

    def modify(self, fileobj: object, events: int, member: LoopMember) -> None:
        """Watch ``fileobj`` for other ``events``."""
        self._selector.modify(fileobj, events, member)  # type: ignore[arg-type]

    def unregister(self, fileobj: object) -> None:
        """Stop watching ``fileobj`` (no error when it was not watched)."""
        try:
            self._selector.unregister(fileobj)  # type: ignore[arg-type]
        except (KeyError, ValueError):
            pass

    # -- the thread ---------------------------------------------------------------------

    def _wake(self) -> None:
        # One byte per wake-up: a thousand nodes handing work over at once (the seal) wrote a
        # thousand, each a system call that gave up the interpreter lock.
        if self._woken:
            return
        self._woken = True
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # the pipe is full: the loop is awake already

    def _run(self) -> None:
        pause = AcceptPause()
        while True:
            try:
                self._once()
                pause.succeeded()
            except Exception:
                if pause.failed(time.monotonic()):
                    log.exception("death-notice loop: unexpected error; going on")
                clock.sleep(max(0.0, (pause.resume_at or 0.0) - time.monotonic()))

    def _scan(self, now: float) -> None:
        deadlines = [d for m in list(self._members.values()) if (d := m.deadline()) is not None]
        self._due_at = min(deadlines) if deadlines else None
        self._changed, self._scanned_at = False, now

    def _once(self) -> None:
        now = time.monotonic()
        if self._changed and now >= self._scanned_at + _SCAN_GAP_S:
            self._scan(now)
        timeout = None if self._due_at is None else max(0.0, self._due_at - now)
        if self._changed:  # look again soon: a timer may have come meanwhile
            rescan = max(0.0, self._scanned_at + _SCAN_GAP_S - now)
            timeout = rescan if timeout is None else min(timeout, rescan)
        for key, events in self._selector.select(timeout):
            self._changed = True
            if key.data is None:
                _drain(self._wake_r)
                # After draining: a caller that still saw True had queued its call before
                # this line, and the calls are run below; a later one writes again.
                self._woken = False
            else:
                self._guarded(key.data, key.data.on_ready, key.fileobj, events)
        while self._calls:
            self._changed = True
            fn = self._calls.popleft()
            self._guarded(fn, fn)
        now = time.monotonic()
        if self._due_at is None or self._due_at > now:
            return
        for member in list(self._members.values()):
            when = member.deadline()
            if when is not None and when <= now:
                self._guarded(member, member.on_timer, now)
        self._scan(now)

    def _guarded(self, owner: object, fn: Callable[..., None], *args: object) -> None:
        try:
            fn(*args)
        except Exception:
            if id(owner) not in self._failing:
                log.exception("death-notice loop: a member failed; going on")
            self._failing.add(id(owner))
        else:
            self._failing.discard(id(owner))


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


_LOOP: NoticeLoop | None = None
_LOOP_LOCK = threading.Lock()


def notice_loop() -> NoticeLoop:
    """This process's loop (started on first use)."""
    global _LOOP
    loop = _LOOP
    if loop is not None and loop.thread.is_alive():
        return loop  # no lock: a thousand nodes starting at once queued on it, one at a time
    with _LOOP_LOCK:
        if _LOOP is None or not _LOOP.thread.is_alive():
            _LOOP = NoticeLoop()
        return _LOOP


def _forget_after_fork() -> None:
    # A forked child has no loop thread: the next user starts its own.
    global _LOOP, _LOOP_LOCK
    _LOOP, _LOOP_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
