"""``--link-check off|warn|exclude``: what the agent does with a node whose link is slow.

- ``off``: no link check; the workers start as soon as the round formed.
- ``warn`` (the default): measure, and name each slow node in one warning line, a ``link.slow``
  event and ``status``; nobody is excluded.
- ``exclude``: as ``warn``, and a slow node is excluded when a spare waits to take its place.

A round of one node measures nothing whatever the mode (there is no link to compare). Pure: the
parser and the flag's row (``FLAG_ROW``, for the settings table) only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["DEFAULT_MODE", "FLAG_ROW", "FlagRow", "LinkCheckMode", "parse_link_check_mode"]


class LinkCheckMode(enum.Enum):
    """The values of ``--link-check``."""

    OFF = "off"
    WARN = "warn"
    EXCLUDE = "exclude"

    @property
    def measures(self) -> bool:
        """Whether the link check runs at all in this mode."""
        return self is not LinkCheckMode.OFF


DEFAULT_MODE = LinkCheckMode.WARN


@dataclass(frozen=True)
class FlagRow:
    """One row of the settings table, as its owner lays rows out (name, flag, default, help).

    Attributes:
        name: the setting's name (the config attribute and, upper-cased, its ``PET_`` variable).
        flag: the command-line flag.
        default: the default, as the user writes it.
        choices: the values the flag accepts.
        help: the one-line help text.
    """

    name: str
    flag: str
    default: str
    choices: tuple[str, ...]
    help: str


FLAG_ROW = FlagRow(
    name="link_check",
    flag="--link-check",
    default=DEFAULT_MODE.value,
    choices=tuple(m.value for m in LinkCheckMode),
    help=(
        "after a round of several nodes forms, time a few MB of collectives between the nodes "
        "over the workers' backend and name a node whose bandwidth is under "
        "1/--straggler-factor of the median: off, warn (default), or exclude (a slow node "
        "leaves when a spare waits)"
    ),
)


def parse_link_check_mode(text: str) -> LinkCheckMode:
    """Parse a value of ``--link-check``.

    Args:
        text: the value as given (``off``, ``warn`` or ``exclude``, exactly).

    Returns:
        The mode.

    Raises:
        ValueError: any other value, in one line naming the flag and the choices.
    """
    for mode in LinkCheckMode:
        if text == mode.value:
            return mode
    shown = text if len(text) <= 40 else text[:40] + "..."
    raise ValueError(f"--link-check must be off, warn or exclude, got {shown!r}")
