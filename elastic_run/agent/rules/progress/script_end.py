"""A worker that outlives its script's end: when the script is over, and when to stop it. Pure.

A script can end (its last line ran, it raised, it called ``sys.exit``) and its process still
not exit: the interpreter's shutdown joins every non-daemon thread and runs the atexit handlers
and finalizers, and any of them can block forever (a thread waiting on a queue nobody feeds, an
atexit handler waiting for a peer, a native destructor). torchrun then waits forever. The agent
stops such a worker once it has outlived its script's end by ``--script-exit-timeout`` (60 s by
default; ``off`` never).

How the agent learns that the script ended:

- a warm worker (forked by the zygote, which runs the script as ``__main__``) says so itself,
  with the exit status Python will exit with, the moment the script's code returns or raises;
- a cold worker (``python -u script``, left exactly as torchrun starts it) cannot, so the agent
  looks at its stacks (py-spy) when its process has been idle (:class:`IdleTrack`): the script
  is over when the main thread's outermost frame is not the script's (:func:`after_script`):
  it is ``threading._shutdown`` (joining non-daemon threads), an atexit handler or a finalizer,
  or the main thread has no Python frame left. The bound is then counted from the first such
  sighting, so a cold worker is never stopped early, only found a few seconds late.

What happens then: the agent takes its stacks, says one line naming the rank and pid (then the
stacks, in ``stacks.txt`` and the event), kills it (its process group), and counts its exit as
the script's own: a warm worker's status as the script set it (0 after a normal end: the job
succeeds); a cold worker's as 0 unless it wrote an error file (``@record``), then as 1. The
script did finish: failing the job, or restarting it, would redo work that is done.

A worker that dies after its script's end (:func:`counted_exit`): a native crash in the
interpreter's shutdown (torch's gloo teardown aborts now and then with ``terminate called
without an active exception`` after the script's last line) kills the process by a signal. For
a warm worker, whose script's status is known, that death counts as the script's status, as an
exception in an atexit handler does for Python itself (it prints it and keeps the status): a
finished training is not restarted, or failed, for a crash after its end. The agent says so in
one line (event ``worker.died_after_script``). An exit status set after the script's end
(``os._exit(3)`` in an atexit handler) is deliberate and stays as it is; a cold worker's death
stays a failure (its script's end is not known in time), as under torchrun.

Invariants: no clock, process or I/O here; times are integers of nanoseconds on the monotonic
clock, passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from elastic_run.agent.progress.stack_report import StackReport
from elastic_run.agent.rules.progress.beats import positive_seconds

__all__ = [
    "DEFAULT_SCRIPT_EXIT_TIMEOUT_S",
    "IdleTrack",
    "after_script",
    "counted_exit",
    "overdue_s",
    "parse_script_exit_timeout",
]

DEFAULT_SCRIPT_EXIT_TIMEOUT_S = 60.0
_NS = 1_000_000_000
_RUNNING_OUTERMOST = frozenset({"<module>", "_run_module_as_main"})


def parse_script_exit_timeout(text: str) -> float | None:
    """Parse ``--script-exit-timeout``: seconds (positive, finite), or ``off`` (or 0): never.

    Raises:
        ValueError: anything else.
    """
    value = text.strip().lower()
    if value in ("off", "0", "none"):
        return None
    return positive_seconds(text, value, "a number of seconds or off", " (or off)")


def after_script(report: StackReport) -> str | None:
    """Where a process is when its script is over, or None while it runs (or is unknown).

    The main thread (the one whose id is the pid) runs the script while its outermost frame is
    a ``<module>`` frame (``python script``, the zygote's worker) or runpy's
    ``_run_module_as_main`` (``python -m``); anything else there, or no frame at all, is the
    interpreter's shutdown. A main thread that cannot be told from the others is no evidence.

    Returns:
        ``joining non-daemon threads (threading._shutdown)``, ``an atexit handler or finalizer:
        FUNCTION at FILE:LINE``, ``interpreter finalization (no Python frame)``, or None.
    """
    if report.error is not None:
        return None
    main = next(
        (t for t in report.threads if t.os_thread_id == report.pid or t.name == "MainThread"),
        None,
    )
    if main is None:  # not found (py-spy may not know the threads' ids): no evidence
        return None
    if not main.frames:
        return "interpreter finalization (no Python frame)"
    outermost = main.frames[-1]
    if outermost.function in _RUNNING_OUTERMOST:
        return None
    if outermost.function == "_shutdown" and outermost.short_file == "threading.py":
        return "joining non-daemon threads (threading._shutdown)"
    innermost = main.frames[0]
    return (
        f"an atexit handler or finalizer: {outermost.function} at "
        f"{outermost.short_file}:{outermost.line}"
        + (f", in {innermost.function}" if innermost is not outermost else "")
    )


def overdue_s(ended_ns: int, now_ns: int, bound_s: float | None) -> float | None:
    """How long past the script's end the process lives, once that passed ``bound_s``; else None."""
    if bound_s is None:
        return None
    lived = max(0, now_ns - ended_ns) / _NS
    return lived if lived > bound_s else None


def counted_exit(script_code: int | None, exitcode: int) -> int:
    """The exit status counted for a worker whose process ended with ``exitcode``.

    Args:
        script_code: the status its script ended with, when known (a warm worker), else None.
        exitcode: how the process ended (``-signum`` when a signal killed it).

    Returns:
        ``script_code`` when a signal killed the process after its script ended (the crash
        was in the interpreter's shutdown), else ``exitcode``.
    """
    if script_code is not None and exitcode < 0:
        return script_code
    return exitcode


@dataclass(frozen=True)
class IdleTrack:
    """When a cold worker's process is idle enough to look at its stacks.

    Between two readings a process is busy when it used more than ``busy_fraction`` of a core
    (plus 10 ms for the readings' grain). Once it has not been busy for ``idle_s``, its stacks
    are taken, and again after a back-off that doubles (``idle_s``, 2x, 4x... up to
    ``max_backoff_s``) while it stays idle and its script runs; any busy reading starts over. A
    worker busy training is never looked at.

    Attributes:
        cpu_s: CPU seconds (user + system) at the last reading (-1: none yet).
        read_ns: the last reading's time.
        idle_since_ns: since when the process has not been busy.
        next_look_ns: the earliest time for the next look (0: none planned).
        backoff_s: the current back-off.
        idle_s: idle time before the first look.
        busy_fraction: the share of a core above which the process is busy.
        max_backoff_s: the longest back-off.
    """

    cpu_s: float = -1.0
    read_ns: int = 0
    idle_since_ns: int = 0
    next_look_ns: int = 0
    backoff_s: float = 10.0
    idle_s: float = 10.0
    busy_fraction: float = 0.05
    max_backoff_s: float = 60.0

    def read(self, cpu_s: float, now_ns: int) -> IdleTrack:
        """Fold a reading of the process's CPU seconds taken at ``now_ns``."""
        if self.cpu_s < 0:
            return replace(self, cpu_s=cpu_s, read_ns=now_ns, idle_since_ns=now_ns)
        elapsed = max(0, now_ns - self.read_ns) / _NS
        if cpu_s - self.cpu_s > self.busy_fraction * elapsed + 0.01:
            return replace(
                self,
                cpu_s=cpu_s,
                read_ns=now_ns,
                idle_since_ns=now_ns,
                next_look_ns=0,
                backoff_s=self.idle_s,
            )
        track = replace(self, cpu_s=cpu_s, read_ns=now_ns)
        if not self.next_look_ns and now_ns - self.idle_since_ns >= self.idle_s * _NS:
            track = replace(track, next_look_ns=now_ns)
        return track

    def due(self, now_ns: int) -> bool:
        """Whether to take the stacks now."""
        return bool(self.next_look_ns) and now_ns >= self.next_look_ns

    def looked(self, now_ns: int) -> IdleTrack:
        """The stacks were taken at ``now_ns`` and showed the script running: back off."""
        return replace(
            self,
            next_look_ns=now_ns + int(self.backoff_s * _NS),
            backoff_s=min(self.max_backoff_s, 2 * self.backoff_s),
        )
