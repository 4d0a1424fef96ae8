"""One node's link-check helper process, from the agent's side: start it, hand it its
arguments, bound it, read what it printed, and make sure it is gone.

``LinkHelper.start`` may run early (when the agent starts to join a round): the helper imports
torch and then waits for its arguments, so a round that forms pays only the collectives. It
is a child of the agent in its own session with a parent-death signal (util-linux's
``setpriv``, else a ``preexec_fn``), so it dies with the agent even when the agent is
SIGKILLed; start it from the agent's main thread, since Linux fires that signal when the
spawning *thread* exits.

Its output is read here without threads: both pipes are drained with ``select`` in short slices
into buffers (so a chatty helper never blocks on a full pipe), and the caller's ``give_up`` runs
between slices.

Invariants:
- After ``close`` (or a ``wait`` that returned or raised) the helper has exited and been reaped,
  and its pipes are closed. A helper that printed its record is killed at once: what is left of
  it is its interpreter's shutdown (more than a second with torch loaded, on a busy host).
- A helper takes one set of arguments; it is single-use.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

from elastic_run.agent.link_check.helper_process import READY, HelperArgs
from elastic_run.errors import AgentError
from elastic_run.parent_death import death_signal_prefix, set_parent_death_signal

__all__ = ["LinkHelper", "LinkHelperTimeout"]

_HELPER_MODULE = "elastic_run.agent.link_check.helper_process"
_SLICE_S = 0.25
_READ_BYTES = 1 << 16
_KEEP_BYTES = 8 << 20  # what a helper may print at most before the rest is dropped


class LinkHelperTimeout(AgentError):
    """The helper did not finish before its deadline (it was killed)."""


class LinkHelper:
    """One helper process (see the module docstring)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        self._out = bytearray()
        self._err = bytearray()
        self._sent = False
        self._closed = False
        self._selector = selectors.DefaultSelector()
        for stream, buffer in ((proc.stdout, self._out), (proc.stderr, self._err)):
            assert stream is not None
            os.set_blocking(stream.fileno(), False)
            self._selector.register(stream, selectors.EVENT_READ, buffer)

    @classmethod
    def start(cls, env: Mapping[str, str] | None = None) -> LinkHelper:
        """Start a helper; it imports torch and waits for its arguments.

        Args:
            env: its environment (default: the agent's). ``GLOO_SOCKET_IFNAME`` and
                ``NCCL_SOCKET_IFNAME`` there choose its interface, as for the workers.

        Raises:
            AgentError: the interpreter cannot be started.
        """
        prefix = death_signal_prefix()
        try:
            proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", _HELPER_MODULE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env) if env is not None else None,
                start_new_session=True,
                preexec_fn=None if prefix else set_parent_death_signal,
            )
        except OSError as exc:
            raise AgentError(f"cannot start the link check's helper: {exc}") from exc
        return cls(proc)

    @property
    def pid(self) -> int:
        """The helper's process id."""
        return self._proc.pid

    def _open_pipes(self) -> int:
        return 0 if self._closed else len(self._selector.get_map())

    def _pump(self, timeout_s: float) -> None:
        """Read whatever the helper printed within ``timeout_s``."""
        if not self._open_pipes():
            if self._proc.poll() is None:
                try:
                    self._proc.wait(timeout=max(0.0, timeout_s))
                except subprocess.TimeoutExpired:
                    pass
            return
        for key, _ in self._selector.select(max(0.0, timeout_s)):
            try:
                data = os.read(key.fd, _READ_BYTES)
            except BlockingIOError:
                continue
            if not data:
                self._selector.unregister(key.fileobj)
                continue
            buffer: bytearray = key.data
            if len(buffer) < _KEEP_BYTES:
                buffer.extend(data)

    def is_ready(self) -> bool:
        """Whether the helper imported torch and waits for its arguments."""
        self._pump(0.0)
        return self._out.startswith(READY.encode() + b"\n")

    def is_alive(self) -> bool:
        """Whether the helper process still runs."""
        return self._proc.poll() is None

    def send(self, args: HelperArgs) -> None:
        """Hand the helper its arguments (once).

        Raises:
            AgentError: it was already used, or it is gone.
        """
        if self._sent:
            raise AgentError("this link check helper was already used")
        self._sent = True
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            stdin.write(args.to_json().encode() + b"\n")
            stdin.close()
        except (BrokenPipeError, OSError) as exc:
            raise AgentError(f"the link check's helper is gone ({exc})") from None

    def has_record(self) -> bool:
        """Whether the helper printed its record (a whole line after ``ready``)."""
        return self._out.count(b"\n") >= 2

    def wait(
        self, deadline: float, give_up: Callable[[], None] | None = None
    ) -> tuple[int | None, str, str]:
        """Wait until the helper printed its record or exited, at most until ``deadline``
        (``time.monotonic``); close it after (a helper that printed its record is only
        shutting its interpreter down, which the round need not wait for).

        Args:
            deadline: when to kill it.
            give_up: runs between short waits; whatever it raises stops the wait (the helper
                is killed first) and propagates.

        Returns:
            ``(exit status, or None when the record came first, stdout, stderr)``.

        Raises:
            LinkHelperTimeout: the deadline passed first.
        """
        code: int | None = None
        try:
            while not self.has_record() and (self._open_pipes() or self._proc.poll() is None):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LinkHelperTimeout("the link check's helper outlived its deadline")
                self._pump(min(_SLICE_S, left))
                if give_up is not None and not self.has_record() and self.is_alive():
                    give_up()
            self._pump(0.0)  # stderr written before the exit, if any
            code = None if self.has_record() else self._proc.poll()
        finally:
            self.close()
        return code, self._out.decode("utf-8", "replace"), self._err.decode("utf-8", "replace")

    def close(self) -> None:
        """Kill the helper (its session) if it runs, reap it and close its pipes. Idempotent."""
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait()
        if self._closed:
            return
        self._closed = True
        self._selector.close()
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()
