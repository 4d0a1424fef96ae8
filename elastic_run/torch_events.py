"""Event records for external sinks, torch's ``torch.distributed.elastic.events`` API.

An :class:`Event` (or a rendezvous :class:`RdzvEvent`) is serialized to one JSON line and
logged to the Python logger of a *destination*; the destination's ``logging.Handler`` decides
where it goes. Destinations known from the start are torch's: ``null`` and
``dynamic_rendezvous`` (a ``NullHandler``: events go nowhere) and ``console`` (a
``StreamHandler`` on stderr). :func:`set_logging_handler` plugs another handler in (torch keeps
its table private).

Invariants: each destination's logger does not propagate, so an event is handled once; an
unknown destination raises :class:`UnknownEventDestinationError` (a ``KeyError``, as torch's
table lookup raises). This is not the agent's own event stream (``elastic_run.agent.events``);
``--event-log-handler`` forwards that one to torch's handlers.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import socket
import traceback
from dataclasses import asdict, dataclass, field
from enum import Enum

from elastic_run.errors import ElasticRunError

__all__ = [
    "RDZV_DESTINATION",
    "Event",
    "EventMetadataValue",
    "EventSource",
    "NodeState",
    "RdzvEvent",
    "UnknownEventDestinationError",
    "construct_and_record_rdzv_event",
    "get_logging_handler",
    "record",
    "record_rdzv_event",
    "set_logging_handler",
]

EventMetadataValue = str | int | float | bool | None
RDZV_DESTINATION = "dynamic_rendezvous"


class UnknownEventDestinationError(ElasticRunError, KeyError):
    """No handler is known for an event destination (also a ``KeyError``, as torch raises)."""


class EventSource(str, Enum):
    """Who produced an event."""

    AGENT = "AGENT"
    WORKER = "WORKER"


class NodeState(str, Enum):
    """Where a node stands in the rendezvous."""

    INIT = "INIT"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


@dataclass
class Event:
    """Something that happened during a job.

    Attributes:
        name: the event's name.
        source: who produced it.
        timestamp: when, in milliseconds (0: not given).
        metadata: more facts, JSON scalars.
    """

    name: str
    source: EventSource
    timestamp: int = 0
    metadata: dict[str, EventMetadataValue] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.serialize()

    @staticmethod
    def deserialize(data: str | Event) -> Event:
        """Read an event back from :meth:`serialize`'s JSON (an Event is returned as is).

        Raises:
            ValueError: not JSON (``json.JSONDecodeError``). KeyError: an unknown source.
        """
        if isinstance(data, Event):
            return data
        fields = json.loads(data)
        fields["source"] = EventSource[fields["source"]]
        return Event(**fields)

    def serialize(self) -> str:
        """Return the event as one JSON object (its fields by name)."""
        return json.dumps(asdict(self))


@dataclass
class RdzvEvent:
    """Something that happened to one node in a rendezvous.

    Attributes:
        name: the event's name (``<file>:<function>`` of the code that recorded it).
        run_id: the job's run id.
        message: what happened.
        hostname: the node's host.
        pid: the node's process id.
        node_state: where the node stands.
        master_endpoint: the rendezvous store's endpoint, when known.
        rank: the node's rank, when known.
        local_id: the node's local id, when known.
        error_trace: the traceback of a failure event.
    """

    name: str
    run_id: str
    message: str
    hostname: str
    pid: int
    node_state: NodeState
    master_endpoint: str = ""
    rank: int | None = None
    local_id: int | None = None
    error_trace: str = ""

    def __str__(self) -> str:
        return self.serialize()

    @staticmethod
    def deserialize(data: str | RdzvEvent) -> RdzvEvent:
        """Read an event back from :meth:`serialize`'s JSON (an RdzvEvent is returned as is).

        Raises:
            ValueError: not JSON (``json.JSONDecodeError``). KeyError: an unknown node state.
        """
        if isinstance(data, RdzvEvent):
            return data
        fields = json.loads(data)
        fields["node_state"] = NodeState[fields["node_state"]]
        return RdzvEvent(**fields)

    def serialize(self) -> str:
        """Return the event as one JSON object (its fields by name)."""
        return json.dumps(asdict(self))


class _Destinations:
    """The process's destinations: a handler each, and the logger built on it."""

    def __init__(self) -> None:
        self.handlers: dict[str, logging.Handler] = {
            "console": logging.StreamHandler(),
            RDZV_DESTINATION: logging.NullHandler(),
            "null": logging.NullHandler(),
        }
        self.loggers: dict[str, logging.Logger] = {}

    def handler(self, destination: str) -> logging.Handler:
        try:
            return self.handlers[destination]
        except KeyError:
            known = ", ".join(sorted(self.handlers))
            raise UnknownEventDestinationError(
                f"no event handler named '{destination}' (known: {known})"
            ) from None

    def logger(self, destination: str) -> logging.Logger:
        found = self.loggers.get(destination)
        if found is None:
            found = logging.getLogger(f"elastic_run.torch_events.{destination}")
            found.setLevel(logging.INFO)
            found.propagate = False
            found.addHandler(self.handler(destination))
            self.loggers[destination] = found
        return found

    def set(self, destination: str, handler: logging.Handler) -> None:
        old = self.handlers.get(destination)
        self.handlers[destination] = handler
        built = self.loggers.get(destination)
        if built is not None:
            if old is not None:
                built.removeHandler(old)
            built.addHandler(handler)


_DESTINATIONS = _Destinations()


def get_logging_handler(destination: str = "null") -> logging.Handler:
    """Return the handler of ``destination``.

    Args:
        destination: ``null``, ``console``, ``dynamic_rendezvous`` or one set with
            :func:`set_logging_handler`.

    Raises:
        UnknownEventDestinationError: no such destination (a ``KeyError``).
    """
    return _DESTINATIONS.handler(destination)


def set_logging_handler(destination: str, handler: logging.Handler) -> None:
    """Send the events of ``destination`` to ``handler`` from now on (ours; torch has no
    public way).

    Args:
        destination: a new or known destination name.
        handler: the handler that takes its events.
    """
    _DESTINATIONS.set(destination, handler)


def record(event: Event, destination: str = "null") -> None:
    """Log ``event`` as one JSON line to ``destination``'s handler (level INFO).

    Raises:
        UnknownEventDestinationError: no such destination (a ``KeyError``).
    """
    _DESTINATIONS.logger(destination).info(event.serialize())


def record_rdzv_event(event: RdzvEvent) -> None:
    """Log a rendezvous event to the ``dynamic_rendezvous`` destination."""
    _DESTINATIONS.logger(RDZV_DESTINATION).info(event.serialize())


def construct_and_record_rdzv_event(
    run_id: str,
    message: str,
    node_state: NodeState,
    name: str = "",
    hostname: str = "",
    pid: int | None = None,
    master_endpoint: str = "",
    local_id: int | None = None,
    rank: int | None = None,
) -> None:
    """Build an :class:`RdzvEvent` with the caller's facts and record it.

    Nothing is built while the ``dynamic_rendezvous`` handler is a ``NullHandler``. The name is
    ``<caller's file>:<name or the caller's function>``; the host defaults to this machine's
    FQDN, the pid to this process's; a ``FAILED`` event carries the traceback of the exception
    being handled.
    """
    if isinstance(get_logging_handler(RDZV_DESTINATION), logging.NullHandler):
        return
    caller = inspect.currentframe()
    caller = caller.f_back if caller is not None else None
    filename = os.path.basename(caller.f_code.co_filename) if caller is not None else "no_file"
    if not name and caller is not None:
        name = caller.f_code.co_name
    del caller
    record_rdzv_event(
        RdzvEvent(
            name=f"{filename}:{name}",
            run_id=run_id,
            message=message,
            hostname=hostname or socket.getfqdn(),
            pid=pid or os.getpid(),
            node_state=node_state,
            master_endpoint=master_endpoint,
            rank=rank,
            local_id=local_id,
            error_trace=traceback.format_exc() if node_state == NodeState.FAILED else "",
        )
    )
