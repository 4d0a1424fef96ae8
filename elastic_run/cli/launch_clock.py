"""When this launcher started, on the monotonic clock: where the goodput account begins.

Not the process's creation time alone. The kernel stamps a process when it is forked, and
``exec`` keeps that stamp, so for ``sh -c '...; exec elastic-run ...'`` (a container
entrypoint, a batch wrapper, ``scripts/demo.sh``) ``psutil.Process().create_time()`` is the
shell's start, and every second the wrapper spent (installs, a ``sleep``, a queue) would count
as the job's lost start-up. Linux records no exec time.

So two stamps, the later of which is the launcher's start:

- ``IMPORTED_MONOTONIC_S``, taken when this module is first imported in this process image:
  the console script imports it first thing (``elastic_run.cli.main``'s first import), about
  the interpreter's start-up after the ``exec`` (10-20 ms after it on the development
  machine); an ``exec`` builds a new image, so a wrapper's time is never in it;
- the process's creation (its fork), which is the later one in a process forked from one that
  had imported this module long before (a warm-start template serving the console script):
  there the import stamp is the template's, the fork is the launcher's start.

Invariants: the answer is never before the process's creation nor after the first call to
:func:`launcher_start_monotonic_s`; reading it costs no process start.
"""

from __future__ import annotations

import os
import time

IMPORTED_MONOTONIC_S = time.monotonic()

__all__ = ["IMPORTED_MONOTONIC_S", "later_start_s", "launcher_start_monotonic_s"]


def later_start_s(imported_monotonic_s: float, created_monotonic_s: float | None) -> float:
    """The launcher's start: the later of the import stamp and the process's creation.

    Args:
        imported_monotonic_s: when this module was imported in this process image.
        created_monotonic_s: the process's creation on the same clock (None: unknown).

    Returns:
        The monotonic time the goodput account starts at.
    """
    if created_monotonic_s is None:
        return imported_monotonic_s
    return max(imported_monotonic_s, created_monotonic_s)


def _created_monotonic_s() -> float | None:
    """This process's creation (fork) on the monotonic clock, None where it cannot be read.

    From ``/proc/self/stat``'s start time (clock ticks since boot) against ``CLOCK_BOOTTIME``,
    exact to a tick; psutil's ``create_time`` adds the boot time, which ``/proc/stat`` gives in
    whole seconds, and so is off by up to a second. A sandbox whose ``/proc`` lacks the field, or
    gives a start in the future, leaves the import stamp alone.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat(5); the split starts at field 3
        age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, AttributeError):
        return None
    if age_s < 0:
        return None
    return time.monotonic() - age_s


def launcher_start_monotonic_s() -> float:
    """When this launcher started, on ``time.monotonic()``'s clock (see the module's text)."""
    return later_start_s(IMPORTED_MONOTONIC_S, _created_monotonic_s())
