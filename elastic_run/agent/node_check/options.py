"""The node check's settings: one frozen value, and the parsers that make its parts from text.

One concept: what the node check is asked to do (:class:`NodeCheckOptions`) and the one-line
``ConfigurationError`` for a value it cannot take. The parsers take ``(text, what)``, the form
the settings table's rows call (``what`` names where the text came from: the flag, its ``PET_``
variable), so a bad value reads the same from either. A :class:`NodeCheckOptions` checks its
fields when it is made, so no code holds one the node check cannot run.

Bounds, and why:
- ``timeout_s``: finite, above 0 and at most a year, the rendezvous settings' one check of every
  duration (Python's ``timedelta`` and the stores' C++ clocks overflow above it);
- ``command``: not empty, no NUL character (a shell cannot be given one) and at most
  :data:`MAX_COMMAND_CHARS` characters (Linux refuses a longer single argument);
- ``min_free_bytes``: 0 (no disk bound) up to :data:`MAX_MIN_FREE_BYTES` (1 EiB: no disk is that
  big, so a larger bound is a typo).

Pure: no environment, files or processes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from elastic_run.errors import ConfigurationError
from elastic_run.rendezvous.settings import check_seconds, shown

__all__ = [
    "DEFAULT_MIN_FREE_BYTES",
    "DEFAULT_TIMEOUT_S",
    "MAX_COMMAND_CHARS",
    "MAX_MIN_FREE_BYTES",
    "NodeCheckOptions",
    "check_min_free_bytes",
    "check_node_check_cmd",
    "parse_min_free_bytes",
    "parse_node_check_cmd",
    "parse_node_check_timeout",
]

DEFAULT_TIMEOUT_S = 30.0
"""``--node-check-timeout``'s default: the budget every check shares."""
DEFAULT_MIN_FREE_BYTES = 1 << 30
"""The free space the log directory's disk must have: 1 GiB, a fixed bound (not a share of the
disk): enough for a job's logs, error files and events many times over, small enough for any
node's disk; a share would ask 50 GiB of a 5 TB scratch disk that has 40 GiB to spare."""
MAX_COMMAND_CHARS = 128 * 1024 - 1
"""The longest ``--node-check-cmd``: Linux's limit of one argument (MAX_ARG_STRLEN), less its NUL."""
MAX_MIN_FREE_BYTES = 1 << 60
"""The largest disk bound: 1 EiB; no disk is that big, so a larger one is a typo."""

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tib": 1 << 40,
}
_BYTES_RE = re.compile(r"([0-9]{1,30})\s*([A-Za-z]*)")


@dataclass(frozen=True)
class NodeCheckOptions:
    """What the node check does, checked when made.

    Attributes:
        enabled: run the check at all (``--node-check/--no-node-check``, on by default).
        timeout_s: the budget every check shares (``--node-check-timeout``); past it the node
            fails its check and nothing the check started is left running.
        command: the user's command (``--node-check-cmd``), run through ``/bin/sh -c``; None:
            none.
        min_free_bytes: the free space the log directory's disk must have; 0: not checked.

    Raises:
        ConfigurationError: a field the node check cannot take (see the module's bounds).
    """

    enabled: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S
    command: str | None = None
    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigurationError(f"--node-check {shown(self.enabled)} is not on or off")
        check_seconds(self.timeout_s, "--node-check-timeout")
        if self.command is not None:
            check_node_check_cmd(self.command, "--node-check-cmd")
        check_min_free_bytes(self.min_free_bytes, "min_free_bytes")


def parse_node_check_timeout(text: str, what: str = "--node-check-timeout") -> float:
    """Parse ``--node-check-timeout``: seconds, above 0, at most a year.

    Args:
        text: the value (``30``, ``2.5``, ``1e2``).
        what: where it came from, for the message (the flag, ``PET_NODE_CHECK_TIMEOUT``).

    Returns:
        The budget in seconds.

    Raises:
        ConfigurationError: not a number, 0, negative, NaN, infinite or above a year.
    """
    try:
        value = float(text.strip())
    except ValueError:
        raise ConfigurationError(f"{what} {shown(text)} is not a number of seconds") from None
    return check_seconds(value, what)


def check_node_check_cmd(command: str, what: str = "--node-check-cmd") -> str:
    """Check the user's node check command.

    Args:
        command: the command, as the shell will be given it.
        what: where it came from, for the message.

    Returns:
        ``command``, unchanged.

    Raises:
        ConfigurationError: empty or only white space, holding a NUL character, or longer than
            :data:`MAX_COMMAND_CHARS`.
    """
    if not isinstance(command, str):
        raise ConfigurationError(f"{what} {shown(command)} is not a command")
    if not command.strip():
        raise ConfigurationError(f"{what} must not be empty (leave it out for no command)")
    if "\0" in command:
        raise ConfigurationError(f"{what} {shown(command)} holds a NUL character")
    if len(command) > MAX_COMMAND_CHARS:
        raise ConfigurationError(
            f"{what} is {len(command)} characters long, more than the {MAX_COMMAND_CHARS} "
            "Linux passes in one argument"
        )
    return command


def parse_node_check_cmd(text: str, what: str = "--node-check-cmd") -> str:
    """Parse ``--node-check-cmd``: a shell command, kept as written.

    Args:
        text: the command.
        what: where it came from, for the message.

    Returns:
        The command.

    Raises:
        ConfigurationError: see :func:`check_node_check_cmd`.
    """
    return check_node_check_cmd(text, what)


def check_min_free_bytes(value: int, what: str = "min_free_bytes") -> int:
    """Check the disk bound: a whole number of bytes in 0..:data:`MAX_MIN_FREE_BYTES`.

    Args:
        value: the bound.
        what: where it came from, for the message.

    Returns:
        ``value``.

    Raises:
        ConfigurationError: not a whole number (a float, NaN, infinity, a bool), negative, or
            above 1 EiB.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigurationError(f"{what} {value} is not a finite number of bytes")
        raise ConfigurationError(f"{what} {shown(value)} is not a whole number of bytes")
    if value < 0:
        raise ConfigurationError(f"{what} {value} must not be negative")
    if value > MAX_MIN_FREE_BYTES:
        number = str(value) if len(str(value)) <= 30 else f"{str(value)[:20]}..."
        raise ConfigurationError(f"{what} {number} is more than 1 EiB, bigger than any disk")
    return value


def parse_min_free_bytes(text: str, what: str = "min_free_bytes") -> int:
    """Parse a disk bound: bytes, or a whole number with a binary unit (``512MiB``, ``1GiB``).

    Units: ``B``, ``K``/``KiB``, ``M``/``MiB``, ``G``/``GiB``, ``T``/``TiB`` (powers of 1024,
    any case).

    Args:
        text: the value.
        what: where it came from, for the message.

    Returns:
        The bound in bytes.

    Raises:
        ConfigurationError: not of that form, or out of range (see :func:`check_min_free_bytes`).
    """
    stripped = text.strip()
    if stripped.startswith("-") and _BYTES_RE.fullmatch(stripped[1:].strip()):
        raise ConfigurationError(f"{what} {shown(text)} must not be negative")
    match = _BYTES_RE.fullmatch(stripped)
    unit = _UNITS.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        raise ConfigurationError(
            f"{what} {shown(text)} is not a number of bytes (such as 1073741824, 512MiB or 1GiB)"
        )
    return check_min_free_bytes(int(match.group(1)) * unit, what)
