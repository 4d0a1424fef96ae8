"""The node check's rows for the settings table: what each of its flags is, said once here.

One concept: the three settings the node check adds to ``elastic-run run``, as plain data the
settings table's owner turns into its own rows (the table makes the click option, the ``PET_``
variable from ``name``, ``--print-config`` and the docs' line). Each row names the
:class:`~elastic_run.agent.node_check.options.NodeCheckOptions` field its value goes to, and a
parser of the table's form ``(text, what) -> value`` (an on/off row uses the table's own
switch). The disk bound (``min_free_bytes``) has no flag: 1 GiB, see ``options``.

Pure: data only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from elastic_run.agent.node_check.options import (
    DEFAULT_TIMEOUT_S,
    parse_node_check_cmd,
    parse_node_check_timeout,
)

__all__ = ["FLAG_ROWS", "FlagRow"]


@dataclass(frozen=True)
class FlagRow:
    """One setting of the node check, for the settings table.

    Attributes:
        name: click's parameter name (``node_check_timeout``; its variable ``PET_`` + upper).
        flag: the long flag.
        form: ``switch`` (``--x/--no-x``) or ``value`` (``--x V``).
        default: the value when nothing gives one.
        takes: what the text may be, for the docs.
        help: one sentence for ``--help``.
        field: the ``NodeCheckOptions`` field the value goes to.
        parse: ``(text, what) -> value`` raising a one-line ``ConfigurationError``; None for a
            switch (the table's own on/off parser).
        metavar: the help's placeholder, for a value.
        unset: words for a default of None.
    """

    name: str
    flag: str
    form: Literal["switch", "value"]
    default: Any
    takes: str
    help: str
    field: str
    parse: Callable[[str, str], Any] | None = None
    metavar: str | None = None
    unset: str = "none"


FLAG_ROWS: tuple[FlagRow, ...] = (
    FlagRow(
        name="node_check",
        flag="--node-check",
        form="switch",
        default=True,
        takes="on | off",
        help=(
            "Check this node (its devices, the log directory's disk, --node-check-cmd) before "
            "it joins; a node that fails does not join and exits 6."
        ),
        field="enabled",
    ),
    FlagRow(
        name="node_check_timeout",
        flag="--node-check-timeout",
        form="value",
        default=DEFAULT_TIMEOUT_S,
        takes="seconds > 0, at most a year",
        help="Seconds the whole node check may take, every check together; past it, it fails.",
        field="timeout_s",
        parse=parse_node_check_timeout,
        metavar="SECONDS",
    ),
    FlagRow(
        name="node_check_cmd",
        flag="--node-check-cmd",
        form="value",
        default=None,
        takes="a shell command",
        help=(
            "A command run (by /bin/sh) in the node check: exit 0 is healthy, otherwise its "
            "first output line is the reason."
        ),
        field="command",
        parse=parse_node_check_cmd,
        metavar="CMD",
        unset="none",
    ),
)
"""The rows, in the order ``--help`` should list them."""
