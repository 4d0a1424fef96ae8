"""What one row of the settings table is: a setting's names, how its text is read, its default,
its help and where its value goes.

One concept, gunicorn's: a setting is one entry (:class:`Setting`) that says everything about it
once, and everything else is generated from the entries: the run command's click options, its
``--print-config``, the docs' flag reference, the agent's keyword defaults and the loop that
hands each value to the object that uses it. An entry is plain data and parser functions; no
click inside.

Names, from one ``name`` (click's parameter name, ``nproc_per_node``):

- the flag ``--nproc-per-node``, also spelled ``--nproc_per_node`` (torchrun takes both), and a
  short alias where torchrun has one (``-r``); an on/off setting also ``--no-<flag>``;
- the variable ``PET_NPROC_PER_NODE`` (torchrun reads every flag from one);
- torch's own variable where torch reads one (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``), below the
  flag and its ``PET_`` variable; a setting torch reads only from its variable has no flag;
- the attribute of the launch configuration that holds the value (``name``, with ``_s`` for
  seconds: ``exit_barrier_timeout_s``), and the places it goes to (:class:`Place`).

How text becomes a value: a :class:`Kind` (a parser with the words that say what it takes, for
the docs). Every parser raises ``ConfigurationError`` with one line naming where the text came
from, so a bad value reads the same from a flag or a variable.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from elastic_run.agent.settings.values import (
    check_count,
    parse_int,
    parse_seconds,
    parse_switch,
    shown,
)
from elastic_run.errors import ConfigurationError

__all__ = [
    "Choice",
    "Count",
    "Form",
    "Kind",
    "Place",
    "Seconds",
    "Setting",
    "Switch",
    "Target",
    "Text",
]

T = TypeVar("T")
Form = Literal["value", "flag", "switch"]
"""How the command line gives a setting: ``--x VALUE``, a bare ``--x``, or ``--x/--no-x``."""


class Target(enum.Enum):
    """Who uses a setting's value (the docs' "goes to" column; the run command's builder hands
    the values of the first four to their objects by a loop over the rows)."""

    WORKER_SPEC = "WorkerSpec"
    AGENT = "LocalElasticAgent"
    AGENT_OPTIONS = "AgentOptions"
    PROGRESS = "ProgressOptions"
    RENDEZVOUS = "RendezvousParameters"
    LOGS = "LogsSpecs"
    WORKERS = "the workers' environment"
    CLI = "the CLI"


@dataclass(frozen=True)
class Place:
    """One place a setting's value goes to: an object and its field (or keyword argument)."""

    target: Target
    field: str

    def describe(self) -> str:
        """``WorkerSpec.max_restarts``, ``LocalElasticAgent(exit_barrier_timeout=)``."""
        if self.target is Target.AGENT:
            return f"LocalElasticAgent({self.field}=)"
        if self.target in (Target.CLI, Target.WORKERS):
            return f"{self.target.value}: {self.field}"
        return f"{self.target.value}.{self.field}"


@dataclass(frozen=True)
class Kind(Generic[T]):
    """How a setting's text becomes its value: a parser and the words for what it takes.

    Attributes:
        parse: ``(text, what) -> value``; ``what`` names where the text came from (the flag,
            ``PET_X`` or torch's variable) for the one-line error.
        takes: what the text may be, for the docs (``seconds > 0``, ``0..10000``).
        show: value -> the text that reads back as the same value (help, docs,
            ``--print-config``).
    """

    parse: Callable[[str, str], T]
    takes: str
    show: Callable[[T], str] = str

    def __call__(self, text: str, what: str) -> T:
        """Parse ``text`` (from ``what``).

        Raises:
            ConfigurationError: the text is not a value of this kind.
        """
        return self.parse(text, what)


def Seconds(*, allow_zero: bool = False) -> Kind[float]:  # noqa: N802  (a kind, named as one)
    """Seconds: finite, positive (or zero) and at most a year."""

    def parse(text: str, what: str) -> float:
        return parse_seconds(text, what, allow_zero=allow_zero)

    bounds = "seconds >= 0" if allow_zero else "seconds > 0"
    return Kind(parse, f"{bounds}, at most a year", _show_number)


def Count(low: int, high: int, why: str = "") -> Kind[int]:  # noqa: N802
    """A whole number in ``low..high`` (``why``: the reason for the bound, in the message)."""

    def parse(text: str, what: str) -> int:
        return check_count(parse_int(text, what), what, low, high, why)

    return Kind(parse, f"{low}..{high}")


def Choice(*choices: str) -> Kind[str]:  # noqa: N802
    """One of ``choices`` (as written)."""

    def parse(text: str, what: str) -> str:
        if text not in choices:  # click's wording for its choices, kept
            raise ConfigurationError(
                f"Invalid value for {what!r}: {shown(text)} is not one of "
                f"{', '.join(map(repr, choices))}."
            )
        return text

    return Kind(parse, " | ".join(choices))


def Text(takes: str = "text") -> Kind[str]:  # noqa: N802
    """Any text, as given."""
    return Kind(lambda text, what: text, takes)


def Switch() -> Kind[bool]:  # noqa: N802
    """On or off: the flag itself, or a variable's 1/0, true/false, yes/no, on/off, t/f, y/n."""
    return Kind(parse_switch, "on | off", str)


def _show_number(value: float) -> str:
    return f"{value:g}"


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting of the agent or the launcher: one row of the table.

    Attributes:
        name: click's parameter name and ``--print-config``'s (``nproc_per_node``).
        section: the docs' section it is listed in.
        flag: its long flag (``--nproc-per-node``); None: read only from ``torch_env``.
        kind: how its text becomes its value.
        default: its value when nothing gives one (the Python API's default too).
        help: one sentence for ``--help`` and the docs.
        places: where its value goes.
        form: ``value`` (``--x V``), ``flag`` (``--x``) or ``switch`` (``--x/--no-x``).
        short: a short alias (``-r``), if torchrun has one.
        torch_env: torch's own variable for it, read below the flag and ``PET_``.
        torch_kind: how torch's variable is read, when unlike ``kind``.
        attr: the launch configuration's attribute that holds the value ("": ``name``, with
            ``_s`` for seconds; None: none, the setting is spent while the CLI parses).
        unset: words for a value of None (``a temporary directory``), for help and docs.
        default_text: words for a default that the launcher works out (``warm_start``), shown
            instead of the value.
        metavar: the help's placeholder for the value (default: from the kind).
    """

    name: str
    section: str
    flag: str | None
    kind: Kind[Any]
    default: T
    help: str
    places: tuple[Place, ...]
    form: Form = "value"
    short: str | None = None
    torch_env: str | None = None
    torch_kind: Kind[Any] | None = None
    attr: str | None = ""
    unset: str = "none"
    default_text: str | None = None
    metavar: str | None = None

    @property
    def pet_env(self) -> str | None:
        """``PET_<NAME>`` for a setting with a flag (torchrun reads each flag from one)."""
        return None if self.flag is None else "PET_" + self.name.upper()

    @property
    def spellings(self) -> tuple[str, ...]:
        """The flag's spellings: short alias, dashes, underscores (``-r``, ``--a-b``,
        ``--a_b``)."""
        if self.flag is None:
            return ()
        under = "--" + self.flag[2:].replace("-", "_")
        names = ([self.short] if self.short else []) + [self.flag]
        return tuple(names + ([under] if under != self.flag else []))

    @property
    def off_flag(self) -> str | None:
        """``--no-<flag>`` of an on/off switch."""
        if self.form != "switch" or self.flag is None:
            return None
        return "--no-" + self.flag[2:]

    @property
    def attribute(self) -> str | None:
        """The launch configuration's attribute that holds the value (None: none)."""
        if self.attr is None:
            return None
        if self.attr:
            return self.attr
        return self.name + ("_s" if self.kind.takes.startswith("seconds") else "")

    def show(self, value: object) -> str:
        """The text of a value of this setting (None: the ``unset`` words)."""
        if value is None:
            return self.unset
        return self.kind.show(value)

    @property
    def default_shown(self) -> str:
        """The default as help and the docs show it."""
        return self.default_text if self.default_text is not None else self.show(self.default)

    def parse(self, text: str, what: str, *, torch_env: bool = False) -> T:
        """Parse the text of this setting, from ``what``.

        Args:
            text: the text.
            what: where it came from, for the message (the flag, ``PET_X``, torch's variable).
            torch_env: it came from torch's variable (read by ``torch_kind`` when given).

        Raises:
            ConfigurationError: one line naming ``what`` and the value.
        """
        kind = self.torch_kind if torch_env and self.torch_kind is not None else self.kind
        value: T = kind(text, what)
        return value
