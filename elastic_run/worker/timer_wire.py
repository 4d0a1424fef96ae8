"""The file-timer wire format: timer requests as JSON lines on the watchdog's FIFO.

One request is one line, written by the worker with a single ``write`` and read by the agent's
watchdog; the format is torch's ``FileTimerRequest.to_json`` (``torch.distributed.elastic.timer``)
so either side may be torch's::

    {"version": 1, "pid": 123, "scope_id": "step", "expiration_time": 1700000000.5, "signal": 9}

Invariants:
- A request line, newline included, is at most ``PIPE_BUF`` bytes, so that writes from many
  workers never interleave; :func:`encode_request` refuses a longer one.
- An ``expiration_time`` below 0 releases the timer ``(pid, scope_id)``; a release is sent with
  -1 and signal 0, as torch's client does. A ``signal`` of 0 or below arms a timer that kills
  nothing when it expires.
- Decoding never trusts its input: every field is checked, and a bad line raises
  :class:`TimerWireError` saying why. A missing ``version`` reads as 1 and a missing ``signal``
  as SIGKILL (torch's client always sends both).
- :class:`RequestFramer` turns the byte stream of the pipe into requests whatever the chunking
  of the reads; it never raises, and reports each dropped line or fragment as a problem.

This module imports only the standard library and :mod:`elastic_run.errors`: the worker side
(:mod:`elastic_run.worker`) and the agent side (:mod:`elastic_run.agent.watchdog.server`) share it.
"""

from __future__ import annotations

import json
import math
import select
import signal as signal_module
from dataclasses import dataclass
from typing import Any, ClassVar

from elastic_run.errors import ElasticRunError

__all__ = [
    "MAX_LINE_BYTES",
    "RELEASE_EXPIRATION",
    "FileTimerRequest",
    "FramedRequests",
    "RequestFramer",
    "TimerWireError",
    "decode_request",
    "encode_request",
]

MAX_LINE_BYTES = select.PIPE_BUF
"""The longest request line, newline included: the size of an atomic pipe write."""

RELEASE_EXPIRATION = -1
"""The ``expiration_time`` a release request carries."""

_VERSION = 1
_MAX_PID = 2**31 - 1  # pid_t is a signed 32-bit integer
_VALID_SIGNALS = frozenset(int(s) for s in signal_module.valid_signals())
# Every record starts so (torch's to_json and ours): where a dead client's fragment ends.
_RECORD_START = b'{"version"'


class TimerWireError(ElasticRunError, ValueError):
    """A timer request that does not fit the wire format (bad field, not JSON, too long)."""


def _is_finite_number(value: object) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


@dataclass(frozen=True)
class FileTimerRequest:
    """One timer request: arm (or re-arm) the timer ``(worker_pid, scope_id)``, or release it.

    Named, ordered and serialised like torch's ``FileTimerRequest``.

    Attributes:
        worker_pid: the process the timer guards (the one that sends the request), positive.
        scope_id: the timer's name, unique within the process.
        expiration_time: when the timer expires, epoch seconds; below 0: a release.
        signal: the signal sent at expiry; 0 or below: none.
        version: the wire format's version (always 1).

    Raises:
        TimerWireError: a field has the wrong type, ``worker_pid`` is not positive,
            ``expiration_time`` is not finite, or ``signal`` is not a valid signal number.
    """

    worker_pid: int
    scope_id: str
    expiration_time: float
    signal: int = 0
    version: ClassVar[int] = _VERSION

    def __post_init__(self) -> None:
        pid: object = self.worker_pid
        if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid <= _MAX_PID:
            raise TimerWireError(f"pid must be a positive integer (a pid_t), got {pid!r}")
        scope: object = self.scope_id
        if not isinstance(scope, str):
            raise TimerWireError(f"scope_id must be a string, got {scope!r}")
        expiration: object = self.expiration_time
        if not _is_finite_number(expiration):
            raise TimerWireError(f"expiration_time must be a finite number, got {expiration!r}")
        signo: object = self.signal
        if not isinstance(signo, int) or isinstance(signo, bool):
            raise TimerWireError(f"signal must be an integer, got {signo!r}")
        if signo > 0 and signo not in _VALID_SIGNALS:
            raise TimerWireError(f"signal {signo} is not a valid signal number")

    @property
    def worker_id(self) -> int:
        """The worker's id in torch's base ``TimerRequest``: here, its pid."""
        return self.worker_pid

    @property
    def is_release(self) -> bool:
        """Whether this request releases the timer rather than arming it."""
        return self.expiration_time < 0

    def to_json(self) -> str:
        """Return the request as one JSON object, without the newline (torch's ``to_json``).

        Returns:
            ``{"version", "pid", "scope_id", "expiration_time", "signal"}`` in that order.
        """
        return json.dumps(
            {
                "version": self.version,
                "pid": self.worker_pid,
                "scope_id": self.scope_id,
                "expiration_time": self.expiration_time,
                "signal": self.signal,
            }
        )


def encode_request(request: FileTimerRequest) -> bytes:
    """Return the line a client writes for ``request``, newline included.

    Args:
        request: the request to send.

    Returns:
        The UTF-8 line, at most :data:`MAX_LINE_BYTES` long.

    Raises:
        TimerWireError: the line is longer than an atomic pipe write (a long scope id).
    """
    line = (request.to_json() + "\n").encode("utf-8")
    if len(line) > MAX_LINE_BYTES:
        raise TimerWireError(
            f"timer request for scope {request.scope_id[:64]!r} is {len(line)} bytes, over the "
            f"{MAX_LINE_BYTES}-byte limit of an atomic pipe write; use a shorter scope id"
        )
    return line


def decode_request(line: bytes) -> FileTimerRequest:
    """Decode one request line (without its newline).

    Args:
        line: the bytes of one line.

    Returns:
        The request.

    Raises:
        TimerWireError: the line is not JSON, not an object, of another version, or a field is
            missing or invalid.
    """
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TimerWireError(f"not JSON ({exc})") from exc
    if not isinstance(record, dict):
        raise TimerWireError("not a JSON object")
    version = record.get("version", _VERSION)
    if version != _VERSION or isinstance(version, bool):
        raise TimerWireError(f"unsupported version {version!r}")

    def field(name: str) -> Any:  # every value is checked by FileTimerRequest
        return record.get(name)

    signo = field("signal")
    if signo is None:
        signo = int(signal_module.SIGKILL)
    expiration = field("expiration_time")
    if _is_finite_number(expiration):
        expiration = float(expiration)
    return FileTimerRequest(field("pid"), field("scope_id"), expiration, signo)


@dataclass(frozen=True)
class FramedRequests:
    """What one chunk of the pipe yielded.

    Attributes:
        requests: the valid requests, in the order they were written.
        problems: one sentence for each line or fragment that was dropped, and why.
    """

    requests: tuple[FileTimerRequest, ...] = ()
    problems: tuple[str, ...] = ()


class RequestFramer:
    """Split the pipe's byte stream into request lines and decode them; pure, ``now`` passed in.

    Conforming clients write whole lines atomically, so a tail without its newline that stays so
    for ``stale_after_s`` was left by a client that died mid-write, and is dropped. A line
    longer than ``max_line_bytes`` is dropped, and so are the bytes after it up to the next
    newline. A broken line that ends with a whole record (a dead client's fragment followed by
    the next client's line) yields that record.

    Args:
        max_line_bytes: the longest accepted line, newline excluded.
        stale_after_s: how long an incomplete tail may wait for the rest of its line.
    """

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES, stale_after_s: float = 0.1) -> None:
        self._max_line_bytes = max_line_bytes
        self._stale_after_s = stale_after_s
        self._buffer = bytearray()
        self._discarding = False
        self._tail_since = 0.0

    @property
    def stale_at(self) -> float | None:
        """When the pending tail goes stale (in the clock of ``now``); None if none is pending."""
        if self._buffer or self._discarding:
            return self._tail_since + self._stale_after_s
        return None

    def feed(self, chunk: bytes, now: float) -> FramedRequests:
        """Take the next bytes read from the pipe.

        Args:
            chunk: the bytes, in the order read.
            now: the time of the read, in any monotonic clock (the one of :meth:`drop_stale`).

        Returns:
            The requests completed by ``chunk`` and the problems met.
        """
        requests: list[FileTimerRequest] = []
        problems: list[str] = []
        tail_is_new = not self._buffer and not self._discarding
        self._buffer.extend(chunk)
        while (newline := self._buffer.find(b"\n")) >= 0:
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            tail_is_new = True
            if self._discarding:
                self._discarding = False
                continue
            self._decode_line(line, requests, problems)
        if len(self._buffer) > self._max_line_bytes and not self._discarding:
            problems.append(f"dropping a request line longer than {self._max_line_bytes} bytes")
            self._discarding = True
        if self._discarding:
            self._buffer.clear()
        if tail_is_new:
            self._tail_since = now
        return FramedRequests(tuple(requests), tuple(problems))

    def drop_stale(self, now: float) -> tuple[str, ...]:
        """Drop the pending tail if it waited ``stale_after_s`` for its newline.

        Args:
            now: the time, in the clock of :meth:`feed`'s ``now``.

        Returns:
            The problems met (one sentence per dropped fragment).
        """
        stale_at = self.stale_at
        if stale_at is None or now < stale_at:
            return ()
        problems: tuple[str, ...] = ()
        if self._buffer:
            problems = (f"dropping an incomplete request of {len(self._buffer)} bytes",)
            self._buffer.clear()
        self._discarding = False
        return problems

    def _decode_line(
        self, line: bytes, requests: list[FileTimerRequest], problems: list[str]
    ) -> None:
        line = line.strip()
        if not line:
            return
        if len(line) > self._max_line_bytes:
            problems.append(
                f"dropping a request line of {len(line)} bytes (limit {self._max_line_bytes})"
            )
            return
        try:
            requests.append(decode_request(line))
        except TimerWireError as exc:
            # A client that died mid-write leaves a fragment that the next atomic line is
            # appended to: salvage that last record rather than lose it.
            start = line.rfind(_RECORD_START)
            if start > 0:
                problems.append(f"dropping {start} bytes of a broken request before a valid one")
                self._decode_line(line[start:], requests, problems)
                return
            problems.append(f"ignoring a bad request ({exc}): {line[:200]!r}")
