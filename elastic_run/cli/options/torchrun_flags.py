"""torchrun 2.13's further flags, read the way torchrun (argparse) reads them.

One concept: what makes the run command accept exactly what torchrun accepts beyond the core
flags of :mod:`elastic_run.cli.options.run_options`:

- argparse's abbreviations: a long flag may be given by any prefix that names one flag
  (``--redirect=3``, ``--max_r 2``); a prefix of several flags is torchrun's error,
  ``ambiguous option: --n=2 could match --nnodes, --nproc-per-node, ...`` (exit 2). Unlike
  Python 3.11's argparse, a prefix that matches only the two spellings of one flag
  (``--nproc``: ``--nproc-per-node`` and ``--nproc_per_node``) names that flag. Only the
  launcher's own flags are read: everything from SCRIPT on belongs to the script.
- ``--duplicate-stdout-filters`` / ``--duplicate-stderr-filters``: comma separated, ``,,`` is
  a comma in a string (torchrun's ``comma_separated_list``; read by the settings table's
  :func:`~elastic_run.agent.settings.values.parse_filters`).
- ``--logs-specs NAME``: the class registered under NAME in the entry point group
  ``torchrun.logs_specs`` (torch's plugin group), built with torch's keyword arguments.
- ``--event-log-handler NAME``: a handler of torch's event logging (``null``, ``console``,
  ``dynamic_rendezvous``, or one a plugin registered in torch); checked before the job starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from importlib import metadata
from typing import Any

from elastic_run.agent.events import AgentEvent
from elastic_run.agent.settings.values import shown
from elastic_run.errors import ConfigurationError

__all__ = [
    "LOGS_SPECS_GROUP",
    "check_event_log_handler",
    "expand_prefixes",
    "load_logs_specs_class",
    "torch_event_sink",
]

LOGS_SPECS_GROUP = "torchrun.logs_specs"


def _canonical(flag: str) -> str:
    return flag.replace("_", "-")


def expand_prefixes(
    args: Sequence[str], long_flags: Iterable[str], takes_value: Iterable[str]
) -> list[str]:
    """Replace each abbreviated long flag before SCRIPT by the flag it names.

    Args:
        args: the run command's arguments.
        long_flags: every spelling of every long flag of the command (``--nproc-per-node``,
            ``--nproc_per_node``, ...).
        takes_value: the spellings whose flag takes a value (the next argument, unless
            ``--flag=value``); short flags too (``-r``).

    Returns:
        The arguments with every abbreviation spelled out.

    Raises:
        ConfigurationError: a prefix that names more than one flag.
    """
    flags = sorted(set(long_flags))
    valued = set(takes_value)
    out: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--" or not arg.startswith("-") or arg == "-":
            out.extend(args[index - 1 :])
            return out
        name, eq, value = arg.partition("=")
        if name.startswith("--") and name not in flags:
            matches = [f for f in flags if f.startswith(name)]
            if len({_canonical(f) for f in matches}) > 1:
                raise ConfigurationError(
                    f"ambiguous option: {arg} could match {', '.join(matches)}"
                )
            if matches:
                name = next((f for f in matches if "_" not in f[2:]), matches[0])
        out.append(name + eq + value)
        if name in valued and not eq and index < len(args):
            out.append(args[index])
            index += 1
    return out


def load_logs_specs_class(name: str) -> type[Any]:
    """The class registered as ``name`` in the entry point group ``torchrun.logs_specs``.

    Raises:
        ConfigurationError: no such entry point, or it cannot be loaded.
    """
    found = metadata.entry_points().select(group=LOGS_SPECS_GROUP, name=name)
    if not found:
        raise ConfigurationError(
            f"--logs-specs {shown(name)}: no entry point of that name in the group "
            f"{LOGS_SPECS_GROUP}"
        )
    entry = next(iter(found))
    try:
        loaded = entry.load()
    except Exception as exc:  # the plugin's import: anything may escape
        raise ConfigurationError(
            f"--logs-specs {shown(name)}: {entry.value} cannot be loaded: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(loaded, type):
        raise ConfigurationError(f"--logs-specs {shown(name)}: {entry.value} is not a class")
    return loaded


def check_event_log_handler(name: str) -> None:
    """Check that torch's event logging knows the handler ``name``.

    Raises:
        ConfigurationError: it does not.
    """
    from torch.distributed.elastic.events import handlers

    try:
        handlers.get_logging_handler(name)
    except KeyError:
        raise ConfigurationError(
            f"--event-log-handler {shown(name)} is not a handler of torch's event logging "
            "(torch's own: console, dynamic_rendezvous, null)"
        ) from None


def torch_event_sink(handler: str) -> Callable[[AgentEvent], None] | None:
    """An event sink that records each agent event through torch's event logging.

    Each event becomes a ``torch.distributed.elastic.events.Event`` named
    ``elastic_run.<kind>`` (source AGENT; metadata: ``message`` and the event's fields, values
    that are not str/int/float/bool/None as text) recorded to ``handler``. ``null``: None.
    """
    if handler == "null":
        return None
    from torch.distributed.elastic import events
    from torch.distributed.elastic.events.api import Event, EventSource

    def record(event: AgentEvent) -> None:
        metadata: dict[str, str | int | float | bool | None] = {"message": event.message}
        for key, value in event.fields.items():
            plain = value is None or isinstance(value, (str, int, float, bool))
            metadata[key] = value if plain else str(value)
        events.record(
            Event(
                name=f"elastic_run.{event.kind}",
                source=EventSource.AGENT,
                timestamp=int(event.timestamp * 1000),
                metadata=metadata,
            ),
            handler,
        )

    return record
