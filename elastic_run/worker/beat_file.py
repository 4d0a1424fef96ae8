"""Progress beats in shared memory: the file's layout, the worker's writer, the agent's reader.

The agent creates one small file per attempt (in ``/dev/shm`` where there is one) with one slot
per local worker, and passes its path and the worker's slot index in the environment
(:data:`PROGRESS_FILE_ENV`, :data:`PROGRESS_SLOT_ENV`). The worker maps the file once, on its
first beat; every later beat is a handful of 8-byte stores into the mapping and one read of the
monotonic clock (a vDSO call, not a system call), so a beat costs well under a microsecond and
can be taken every training step. The agent reads every slot each monitor tick.

Layout (native-endian signed 64-bit words): a header of 8 words (``MAGIC``, ``VERSION``, the
slot count, 5 reserved), then 8 words per slot:

    0 seq          a sequence counter: odd while the worker writes the slot, even when done
    1 beats        beats so far (progress() calls and optimizer steps, see below)
    2 step         the step the worker named (or ``beats`` when it named none)
    3 last_ns      CLOCK_MONOTONIC of the last beat, ns (the same clock as the agent's: one host)
    4 gap_ns       the gap between the last two beats, ns (0 after the first)
    5 busy_ns      total time from a beat to the first sync_point() after it, ns
    6 busy_count   sync_point() calls counted in busy_ns
    7 pid          the writing process

Two kinds of beat share one writer per process (:func:`shared_writer`): an explicit
``progress(step)`` call (:meth:`BeatWriter.beat`) and an automatic beat after each optimizer step
(:meth:`BeatWriter.auto_beat`, from :mod:`elastic_run.worker.auto_progress`). They are never counted
twice for one step: an explicit beat that follows an automatic one takes it over (the same beat,
now with the named step and the later time) instead of adding one, so ``opt.step();
progress(step)`` counts one beat per step, and so does a script that calls ``progress()`` only
now and then. An automatic beat names the step after the last one (the beat count when the
script never named one).

Invariants:
- Only one process writes a slot: the worker whose slot index it was given. A child the worker
  forks stops writing (``os.register_at_fork``), so a data-loader process never beats for it.
- A reader never sees a half-written slot: it retries while ``seq`` is odd or changed under it
  (a seqlock; on x86-64 stores are seen in program order, which the lock relies on).
- An agent removes its files at the end of each attempt; one killed with SIGKILL cannot, and the
  next agent on the host removes them (:func:`sweep_stale_beat_files`: the name carries the pid).
- Beats may come from any thread: the writer serializes them (a lock held for a few stores), and
  says once on stderr when beats come from a second thread (each thread's beats count).
- The worker never fails a training step over a beat: when the file cannot be mapped it says so
  once on stderr and every later beat is a no-op.

This module imports nothing of the agent, so :mod:`elastic_run.worker` can use it.
"""

from __future__ import annotations

import mmap
import operator
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "HEADER_WORDS",
    "MAGIC",
    "PROGRESS_FILE_ENV",
    "PROGRESS_SLOT_ENV",
    "SLOT_WORDS",
    "VERSION",
    "BeatFile",
    "BeatWriter",
    "SlotReading",
    "create_beat_file",
    "open_writer_from_env",
    "shared_writer",
    "sweep_stale_beat_files",
]

PROGRESS_FILE_ENV = "ELASTIC_RUN_PROGRESS_FILE"
PROGRESS_SLOT_ENV = "ELASTIC_RUN_PROGRESS_SLOT"
MAGIC = 0x45525042  # "ERPB"
VERSION = 1
HEADER_WORDS = 8
SLOT_WORDS = 8
_WORD = 8
_READ_RETRIES = 100

_SEQ, _BEATS, _STEP, _LAST_NS, _GAP_NS, _BUSY_NS, _BUSY_COUNT, _PID = range(SLOT_WORDS)


def _size(slots: int) -> int:
    return (HEADER_WORDS + slots * SLOT_WORDS) * _WORD


def create_beat_file(path: Path, slots: int) -> None:
    """Create (or replace) a zeroed beat file with ``slots`` slots.

    Args:
        path: where to create it; the directory must exist.
        slots: how many workers will beat into it.

    Raises:
        OSError: the file cannot be written.
    """
    header = memoryview(bytearray(_size(slots))).cast("q")
    header[0], header[1], header[2] = MAGIC, VERSION, slots
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, header.cast("B"))
    finally:
        os.close(fd)
    os.replace(tmp, path)


@dataclass(frozen=True)
class SlotReading:
    """One consistent read of a worker's slot.

    Attributes:
        beats: progress() calls so far (0: never beat).
        step: the last step the worker named, or its beat count when it named none.
        last_beat_ns: CLOCK_MONOTONIC of the last beat, ns (0: never).
        last_gap_ns: the gap between the last two beats, ns (0: fewer than two).
        busy_ns: total time from a beat to the following sync_point(), ns.
        busy_count: how many sync_point() calls busy_ns sums.
        pid: the process that wrote the slot (0: none yet).
    """

    beats: int
    step: int
    last_beat_ns: int
    last_gap_ns: int
    busy_ns: int
    busy_count: int
    pid: int


class BeatFile:
    """The agent's read-only view of a beat file.

    Args:
        path: a file made by :func:`create_beat_file`.

    Raises:
        OSError: the file cannot be opened or mapped.
        ValueError: the file is not a beat file of this version.
    """

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            self._map = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        self._words = memoryview(self._map).cast("q")
        if len(self._words) < HEADER_WORDS or tuple(self._words[0:2]) != (MAGIC, VERSION):
            self.close()
            raise ValueError(f"{path} is not a version {VERSION} beat file")
        self.slots = int(self._words[2])

    def read(self, slot: int) -> SlotReading | None:
        """Read one slot consistently.

        Args:
            slot: the slot index, ``0 <= slot < self.slots``.

        Returns:
            The reading, or None when the writer kept it busy through every retry (then the
            next tick reads it).
        """
        base = HEADER_WORDS + slot * SLOT_WORDS
        words = self._words
        for _ in range(_READ_RETRIES):
            values = words[base : base + SLOT_WORDS].tolist()
            seq = values[_SEQ]
            if seq % 2 == 0 and words[base + _SEQ] == seq:
                return SlotReading(*values[1:])
        return None

    def close(self) -> None:
        """Unmap the file. Idempotent."""
        words = getattr(self, "_words", None)
        if words is not None:
            words.release()
            self._words = memoryview(b"").cast("q")
        if not self._map.closed:
            self._map.close()


class BeatWriter:
    """A worker's writer of its slot; called from the training loop (any thread).

    Args:
        path: the agent's beat file (``ELASTIC_RUN_PROGRESS_FILE``).
        slot: this worker's slot (``ELASTIC_RUN_PROGRESS_SLOT``).

    Raises:
        OSError: the file cannot be opened or mapped.
        ValueError: the file is not a beat file, or ``slot`` is not one of its slots.
    """

    def __init__(self, path: str, slot: int) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        words = memoryview(self._map).cast("q")
        if len(words) < HEADER_WORDS or tuple(words[0:2]) != (MAGIC, VERSION):
            raise ValueError(f"{path} is not a version {VERSION} beat file")
        if not 0 <= slot < words[2]:
            raise ValueError(f"slot {slot} is not one of the {words[2]} slots of {path}")
        base = (HEADER_WORDS + slot * SLOT_WORDS) * _WORD
        self._w = memoryview(self._map)[base : base + SLOT_WORDS * _WORD].cast("q")
        self._seq = int(self._w[_SEQ]) + (int(self._w[_SEQ]) % 2)
        self._beats = int(self._w[_BEATS])
        self._step = int(self._w[_STEP])
        self._last = int(self._w[_LAST_NS])
        self._before_last = 0  # the beat before the last (an automatic beat's take-over)
        self._busy = int(self._w[_BUSY_NS])
        self._busy_count = int(self._w[_BUSY_COUNT])
        self._synced = True  # only the first sync_point() after a beat counts
        self._explicit_sync = False  # the script calls sync_point(): automatic marks stand down
        self._auto_pending = False  # the last beat was automatic and not taken over yet
        self._lock = threading.Lock()
        self._thread = 0
        self._w[_PID] = os.getpid()

    def beat(self, step: int | None = None) -> None:
        """One step done: count it, stamp it (a few stores, no system call).

        When the last beat was an automatic one (an optimizer step) not yet taken over, this
        beat takes it over: the same beat, with this step and time, not one more.

        Args:
            step: the step number to show (default: the count of beats).

        Raises:
            TypeError: ``step`` is not an integer.
        """
        named = None if step is None else operator.index(step)
        with self._lock:
            self._check_thread()
            if self._auto_pending:
                self._auto_pending = False
                self._write(self._beats, self._beats if named is None else named, takeover=True)
            else:
                beats = self._beats + 1
                self._write(beats, beats if named is None else named, takeover=False)

    def auto_beat(self) -> None:
        """An optimizer step ended: one beat, naming the step after the last one."""
        with self._lock:
            self._check_thread()
            self._write(self._beats + 1, self._step + 1, takeover=False)
            self._auto_pending = True

    def _check_thread(self) -> None:
        me = threading.get_ident()
        if self._thread in (me, -1):
            return
        if self._thread == 0:
            self._thread = me
            return
        self._thread = -1  # said once
        print(
            "elastic_run: progress beats now also come from another thread "
            f"({threading.current_thread().name}); every thread's beats count",
            file=sys.stderr,
            flush=True,
        )

    def _write(self, beats: int, step: int, *, takeover: bool) -> None:
        now = time.monotonic_ns()
        previous = self._before_last if takeover else self._last
        w = self._w
        seq = self._seq + 1
        w[_SEQ] = seq
        w[_GAP_NS] = now - previous if previous else 0
        w[_BEATS] = beats
        w[_STEP] = step
        w[_LAST_NS] = now
        w[_SEQ] = seq + 1
        self._seq = seq + 1
        if not takeover:
            self._before_last = self._last
        self._beats, self._step, self._last = beats, step, now
        self._synced = False

    def sync_point(self) -> None:
        """This rank's own work of the step is done; it now waits for the others.

        Only the first call after a beat counts; before the first beat it does nothing.
        """
        with self._lock:
            self._explicit_sync = True
            self._mark_work_end(time.monotonic_ns())

    def auto_sync_point(self, work_end_ns: int) -> None:
        """The automatic counterpart of :meth:`sync_point`: this step's own work ended at
        ``work_end_ns`` (the last gradient accumulated, from :mod:`elastic_run.worker.auto_progress`).

        Counts like a ``sync_point()`` at that time; ignored when it is not after the last beat,
        and for good once the script calls :meth:`sync_point` itself (its own mark is the better
        one).

        Args:
            work_end_ns: CLOCK_MONOTONIC of the end of this rank's own work, ns.
        """
        with self._lock:
            if self._explicit_sync or work_end_ns <= self._last:
                return
            self._mark_work_end(work_end_ns)

    def _mark_work_end(self, at_ns: int) -> None:
        """Count this step's work as ending at ``at_ns`` (the lock held; once per beat)."""
        if self._synced:
            return
        self._synced = True
        busy = self._busy + at_ns - self._last
        count = self._busy_count + 1
        w = self._w
        seq = self._seq + 1
        w[_SEQ] = seq
        w[_BUSY_NS] = busy
        w[_BUSY_COUNT] = count
        w[_SEQ] = seq + 1
        self._seq = seq + 1
        self._busy = busy
        self._busy_count = count


def open_writer_from_env() -> BeatWriter | None:
    """The worker's writer as the agent configured it, or None (no agent file, or unusable).

    Says once on stderr why beats are off when the variables are set but the file is unusable.
    """
    path = os.environ.get(PROGRESS_FILE_ENV)
    if not path:
        return None
    try:
        return BeatWriter(path, int(os.environ.get(PROGRESS_SLOT_ENV, "")))
    except (OSError, ValueError) as exc:
        print(f"elastic_run.worker.progress: beats are off: {exc}", file=sys.stderr, flush=True)
        return None


_shared: BeatWriter | None = None
_shared_opened = False


def _forget_shared() -> None:
    """In a forked child: it is not the worker, so it never beats into the worker's slot."""
    global _shared, _shared_opened
    _shared, _shared_opened = None, True


os.register_at_fork(after_in_child=_forget_shared)


_SHARED_LOCK = threading.Lock()


def shared_writer() -> BeatWriter | None:
    """This process's one writer (opened from the environment on the first call), or None.

    ``progress()``, ``sync_point()`` and the optimizer hook all beat through it, so their beats
    are one stream. A process forked from the worker gets None.
    """
    global _shared, _shared_opened
    if _shared_opened:
        return _shared
    with _SHARED_LOCK:  # two threads' first steps at once: both get the one writer
        if not _shared_opened:
            try:
                _shared = open_writer_from_env()
            finally:
                _shared_opened = True  # tried once, as before: a failure is not retried
    return _shared


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_beat_files(directory: Path) -> None:
    """Remove the agents' beat files (``elastic-run-<pid>-...``) whose agent no longer runs.

    An agent killed with SIGKILL cannot remove its file; the next agent on the host does. A
    file whose pid is alive is kept, even when another process reused the pid (a few hundred
    bytes, never read).

    Args:
        directory: where agents create their beat files.
    """
    try:
        paths = list(directory.glob("elastic-run-*-*-*.beats"))
    except OSError:
        return
    for path in paths:
        pid = path.name.split("-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                path.unlink()
            except OSError:
                pass
