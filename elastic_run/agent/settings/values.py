"""The values of the settings: a flag's or a variable's text in, a checked value out.

One concept: each function here turns one setting's text into what the launcher uses, or raises
:class:`ConfigurationError` with a one-line sentence that names where the text came from (the
flag, its ``PET_`` variable or torch's variable: the ``what`` argument) and the value. They are
pure functions of their arguments (no environment, no files; torch only to count devices for
``--nproc-per-node gpu``), so the CLI's checks are tested without starting anything. The
settings table (:mod:`elastic_run.agent.settings.table`) names one of them for each setting.

Bounds, and why:
- workers per node 1..:data:`MAX_NPROC_PER_NODE`: beyond it a typo, not a job, is more likely,
  and huge counts overflow C++ ints or memory; node counts (``--nnodes``) are the rendezvous's
  to bound, by :func:`elastic_run.rendezvous.settings.parse_nnodes`, the one parser of them;
- durations are finite, positive (some may be 0) and at most :data:`MAX_SECONDS` (a year):
  Python's ``timedelta`` and the C++ ``std::chrono`` of torch's stores overflow above that
  (:func:`check_seconds` is the rendezvous settings' own check, one set of bounds);
- ``--max-restarts`` 0..:data:`MAX_RESTARTS`, ports 0..65535.
A value the user typed is shown in an error at most 60 characters long, with control and
non-ASCII characters escaped (the settings' :func:`shown`), so an error stays one readable line.
"""

from __future__ import annotations

import hashlib
import re
import signal
from collections.abc import Callable

from elastic_run.agent.settings.streams import Std, StdSpec
from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.settings import MAX_DURATION_S, check_seconds, parse_int, shown

__all__ = [
    "MAX_NPROC_PER_NODE",
    "MAX_RESTARTS",
    "MAX_RUN_ID_CHARS",
    "MAX_SECONDS",
    "check_count",
    "check_endpoint_ports",
    "check_port",
    "check_seconds",
    "count_cuda_devices",
    "count_usable_cpus",
    "count_xpu_devices",
    "parse_filters",
    "parse_int",
    "parse_local_ranks",
    "parse_modules",
    "parse_nproc",
    "parse_seconds",
    "parse_signals",
    "parse_std",
    "parse_switch",
    "parse_truthy",
    "safe_run_id",
    "shown",
]

MAX_NPROC_PER_NODE = 1024
MAX_RESTARTS = 10_000
MAX_SECONDS = MAX_DURATION_S  # one year: the rendezvous's bound too, one number
MAX_RUN_ID_CHARS = 128

_SHOWN_CHARS = 60
_RUN_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def check_count(value: int, what: str, low: int, high: int, why: str = "") -> int:
    """Check that an integer flag lies in ``low..high``.

    Args:
        value: the value (click's int, or one parsed here).
        what: the flag, for the message (``--max-restarts``).
        low: the smallest value allowed.
        high: the largest value allowed.
        why: appended to the message when the value is too large (a reason for the bound).

    Returns:
        ``value``.

    Raises:
        ConfigurationError: the value is out of range.
    """
    if value < low or value > high:
        number = str(value) if len(str(value)) <= _SHOWN_CHARS else f"{str(value)[:20]}..."
        reason = f": {why}" if why and value > high else ""
        raise ConfigurationError(f"{what} {number} is out of range ({low}..{high}){reason}")
    return value


def parse_nproc(
    text: str,
    *,
    cpu_count: int,
    cuda_device_count: Callable[[], int],
    xpu_device_count: Callable[[], int] = lambda: 0,
    what: str = "--nproc-per-node",
) -> int:
    """Parse ``--nproc-per-node``: ``N``, ``cpu``, ``gpu``, ``xpu`` or ``auto``.

    Args:
        text: the value.
        cpu_count: this machine's cores (for ``cpu`` and a GPU-less ``auto``).
        cuda_device_count: returns the CUDA devices available (0 if none); called only for
            ``gpu`` and ``auto``.
        xpu_device_count: returns the Intel XPU devices available; called only for ``xpu``,
            and for ``auto`` when there is no CUDA device.
        what: where the text came from, for the message.

    Returns:
        The number of workers on this node.

    Raises:
        ConfigurationError: not one of those forms, ``gpu``/``xpu`` without a device, or a number
            outside 1..MAX_NPROC_PER_NODE.
    """
    value = text.strip().lower()
    if value == "cpu":
        return max(1, cpu_count)
    if value == "xpu":
        devices = xpu_device_count()
        if devices > 0:
            return devices
        raise ConfigurationError(f"{what} xpu: no XPU device is available")
    if value in ("gpu", "auto"):
        devices = cuda_device_count()
        if devices > 0:
            return devices
        if value == "gpu":
            raise ConfigurationError(f"{what} gpu: no CUDA device is available")
        # torch's auto: the accelerator's devices (CUDA, else XPU), else the CPUs
        return xpu_device_count() or max(1, cpu_count)
    if not value.lstrip("+-").isascii() or not value.lstrip("+-").isdigit():
        raise ConfigurationError(f"{what} {shown(text)} is not a number, cpu, gpu, xpu or auto")
    count = parse_int(value, what)
    if count < 1:
        raise ConfigurationError(f"{what} {shown(text)} must be at least 1")
    return check_count(
        count,
        what,
        1,
        MAX_NPROC_PER_NODE,
        "more workers per node than any machine runs",
    )


def parse_std(text: str, flag: str) -> StdSpec:
    """Parse ``--redirects``/``--tee``: ``0``..``3``, or ``LOCAL_RANK:0..3`` items.

    Args:
        text: the value (``3`` or ``0:1,1:2``); empty is ``0``.
        flag: the flag, for the message.

    Returns:
        The StdSpec.

    Raises:
        ConfigurationError: any other form, or a local rank past MAX_NPROC_PER_NODE.
    """
    value = text.strip()
    if not value:
        return StdSpec()
    bad = f"{flag} {shown(text)}: expected 0..3 or LOCAL_RANK:0..3 items separated by commas"

    def one(item: str) -> Std:
        if item not in ("0", "1", "2", "3"):
            raise ConfigurationError(bad)
        return Std(int(item))

    if ":" not in value:
        return StdSpec(default=one(value))
    per_rank: list[tuple[int, Std]] = []
    for item in value.split(","):
        rank, sep, std = item.partition(":")
        rank = rank.strip()
        if not sep or not (rank.isascii() and rank.isdigit()) or len(rank) > 6:
            raise ConfigurationError(bad)
        local_rank = check_count(int(rank), f"{flag} local rank", 0, MAX_NPROC_PER_NODE - 1)
        per_rank.append((local_rank, one(std.strip())))
    return StdSpec(per_rank=tuple(per_rank))


def parse_local_ranks(text: str, what: str = "--local-ranks-filter") -> frozenset[int] | None:
    """Parse ``--local-ranks-filter``: local ranks separated by commas.

    Args:
        text: the value; empty means every rank.
        what: where the text came from, for the message.

    Returns:
        The ranks, or None for every rank.

    Raises:
        ConfigurationError: an item is not a local rank (0..MAX_NPROC_PER_NODE-1).
    """
    value = text.strip()
    if not value:
        return None
    ranks: set[int] = set()
    for item in value.split(","):
        item = item.strip()
        if not (item.isascii() and item.isdigit()) or len(item) > 6:
            raise ConfigurationError(
                f"{what} {shown(text)}: expected local ranks separated by commas"
            )
        ranks.add(check_count(int(item), what, 0, MAX_NPROC_PER_NODE - 1))
    return frozenset(ranks)


def parse_signals(text: str, what: str = "--signals-to-handle") -> tuple[signal.Signals, ...]:
    """Parse ``--signals-to-handle``: names such as ``SIGTERM,SIGINT`` (``TERM`` too).

    Args:
        text: the value.
        what: where the text came from, for the message.

    Returns:
        The signals, in order.

    Raises:
        ConfigurationError: an unknown name, or SIGKILL, SIGSTOP or SIGCHLD.
    """
    out: list[signal.Signals] = []
    for item in text.split(","):
        name = item.strip().upper()
        if not name:
            continue
        if not name.startswith("SIG"):
            name = "SIG" + name
        sig = signal.Signals.__members__.get(name)
        if sig is None:
            raise ConfigurationError(f"{what}: unknown signal {shown(item.strip())}")
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            raise ConfigurationError(f"{what}: {name} cannot be handled")
        out.append(sig)
    return tuple(out)


def check_port(value: int | None, what: str) -> int | None:
    """Check a port number (0..65535; None passes).

    Args:
        value: the port, or None when not given.
        what: the flag or variable, for the message.

    Returns:
        ``value``.

    Raises:
        ConfigurationError: out of range.
    """
    if value is None:
        return None
    return check_count(value, what, 0, 65535)


def check_endpoint_ports(endpoint: str, what: str = "--rdzv-endpoint") -> tuple[int, ...]:
    """Check the ports of ``--rdzv-endpoint`` (``host[:port][,host[:port]...]``).

    A bare IPv6 address (several colons, no brackets) has no port to check.

    Args:
        endpoint: the value.
        what: where the text came from, for the message.

    Returns:
        The ports given, in order; a host without a port adds none.

    Raises:
        ConfigurationError: a port is not a number in 0..65535.
    """
    ports = []
    for part in endpoint.split(","):
        part = part.strip()
        host, sep, port = part.rpartition(":")
        if not sep or not host or (":" in host and not host.endswith("]")):
            continue
        if not (port.isascii() and port.isdigit()) or len(port) > 5 or int(port) > 65535:
            raise ConfigurationError(
                f"{what} {shown(endpoint)}: port {shown(port)} is not in 0..65535"
            )
        ports.append(int(port))
    return tuple(ports)


def parse_seconds(text: str, what: str, *, allow_zero: bool = False) -> float:
    """Parse a duration in seconds from text, then :func:`check_seconds` it.

    Args:
        text: the value (``30``, ``0.5``, ``1e3``).
        what: the flag, key or variable, for the message.
        allow_zero: whether 0 is allowed.

    Returns:
        The duration.

    Raises:
        ConfigurationError: not a number, or out of range (see :func:`check_seconds`).
    """
    try:
        value = float(text.strip())
    except ValueError:
        raise ConfigurationError(f"{what} {shown(text)} is not a number of seconds") from None
    return check_seconds(value, what, allow_zero=allow_zero)


def safe_run_id(run_id: str, what: str = "--rdzv-id") -> str:
    """Make a run id safe as a directory name, the same way on every node.

    Keeps ``[A-Za-z0-9._-]`` and replaces every other character with ``_``; an id of dots
    only (``.``, ``..``) becomes underscores; an id longer than MAX_RUN_ID_CHARS keeps its
    first characters and ends in a digest of the whole, so two long ids stay apart.

    Args:
        run_id: the ``--rdzv-id`` value.
        what: where the text came from, for the message.

    Returns:
        The id to use everywhere (log directory, rendezvous keys, TORCHELASTIC_RUN_ID); equal
        to ``run_id`` when that was safe.

    Raises:
        ConfigurationError: the id is empty or only white space.
    """
    if not run_id.strip():
        raise ConfigurationError(f"{what} must not be empty")
    safe = _RUN_ID_UNSAFE.sub("_", run_id)
    if not safe.strip("."):
        safe = "_" * len(safe)
    if len(safe) > MAX_RUN_ID_CHARS:
        digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        safe = f"{safe[: MAX_RUN_ID_CHARS - 9]}-{digest}"
    return safe


def parse_filters(text: str, what: str = "--duplicate-stdout-filters") -> tuple[str, ...]:
    """``a,b,,c`` -> ``("a", "b,c")``; empty: no filter (torchrun's comma_separated_list).

    Args:
        text: the value.
        what: where the text came from (every text is a list of filters: never an error).
    """
    if not text:
        return ()
    placeholder = "\x00"
    items = text.replace(",,", placeholder).split(",")
    return tuple(item.replace(placeholder, ",") for item in items if item)


def parse_modules(text: str, what: str = "--preload") -> tuple[str, ...]:
    """Parse module names separated by commas (``--preload a,b.c``).

    Raises:
        ConfigurationError: an item is not a dotted module name.
    """
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise ConfigurationError(f"{what}: {shown(name)} is not a module name")
    return names


# click's spellings of a boolean in an environment variable (``PET_STANDALONE=1``), kept so
# that every value click read before still reads the same.
_SWITCH_STATES = {
    "1": True,
    "0": False,
    "yes": True,
    "no": False,
    "true": True,
    "false": False,
    "on": True,
    "off": False,
    "t": True,
    "f": False,
    "y": True,
    "n": False,
}


def parse_switch(text: str, what: str) -> bool:
    """Parse an on/off setting's text (a ``PET_`` variable of a flag): 1/0, true/false, yes/no,
    on/off, t/f, y/n in any case.

    Raises:
        ConfigurationError: anything else.
    """
    value = _SWITCH_STATES.get(text.strip().lower())
    if value is None:
        raise ConfigurationError(
            f"{what} {shown(text)} is not on or off (1/0, true/false, yes/no, on/off, t/f, y/n)"
        )
    return value


def parse_truthy(text: str, what: str) -> bool:
    """Read a torch variable that turns something on (``TORCHELASTIC_ENABLE_FILE_TIMER``): 1,
    true, yes, y, t or on in any case is on, anything else off (never an error, as torch reads
    it)."""
    return text.strip().lower() in ("1", "true", "yes", "y", "t", "on")


def count_usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, as torch's ``--nproc-per-node cpu``
    counts them: a job under ``taskset`` or a cpuset starts one worker per CPU it was given)."""
    import os

    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def count_cuda_devices() -> int:
    """The CUDA devices this machine has (imports torch: only for ``gpu`` and ``auto``)."""
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def count_xpu_devices() -> int:
    """The Intel XPU devices this machine has (imports torch: only for ``xpu``)."""
    import torch

    xpu = getattr(torch, "xpu", None)
    return int(xpu.device_count()) if xpu is not None and xpu.is_available() else 0
