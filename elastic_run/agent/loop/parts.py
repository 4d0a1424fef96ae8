"""What the run loop asks of its parts each turn, and the parts an agent has by default.

The loop (``simple.py``) holds three parts and asks each, once a turn, for one frozen record
(``agent/rules/observation.py``):

- a :class:`WorkerPart`: the worker group's :class:`GroupView`. ``LocalElasticAgent`` gives its
  own (``agent/workers/group.py``); any other agent (a torch-style subclass that implements
  torch's ``_monitor_workers``) gets :class:`MonitoredWorkers`, which asks that hook and builds
  the view from its answer once;
- a :class:`ProgressPart`: progress beats and their evidence (``agent/progress/duties.py`` for
  ``LocalElasticAgent``; :class:`NoProgressWatch` otherwise: nothing watched);
- the rendezvous (``rendezvous_part.py``);
- optionally a :class:`NodeCheckPart`: is this node fit to join (asked before the first join
  and before a suspect node rejoins), and a :class:`LinkCheckPart`: are this round's links fast
  (asked after a round of several nodes formed, when its size changed).

The rules decide from those records; the loop applies the action, handing the progress rules'
effects back to the progress part.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from elastic_run.agent.api import RunResult, WorkerGroup, WorkerState
from elastic_run.agent.rules.actions import ProgressEffect
from elastic_run.agent.rules.observation import GroupView, ProgressView, WorkerView
from elastic_run.agent.workers.failures import FailureRecord
from elastic_run.errors import AgentError

__all__ = [
    "Emit",
    "LinkCheckPart",
    "LinkFindings",
    "MonitoredWorkers",
    "NoProgressWatch",
    "NodeCheckPart",
    "NodeFitness",
    "ProgressPart",
    "WorkerPart",
]

Emit = Callable[[str, str, dict[str, Any]], None]


class WorkerPart(Protocol):
    """The worker group, as the loop sees it each turn."""

    def observe(self, group: WorkerGroup) -> GroupView:
        """The group now: each worker, the failures (root cause first), the outcome."""

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to every running worker (a preemption notice)."""

    def failures_after_stop(self, view: GroupView) -> tuple[FailureRecord, ...]:
        """The failures a failed run reports once its workers were stopped (``view``: the
        turn that failed)."""


class ProgressPart(Protocol):
    """Progress beats and their verdicts' evidence, as the loop sees them each turn."""

    def observe(self, group: GroupView, now_ns: int) -> ProgressView:
        """Progress now, given this turn's group view."""

    def apply(self, effect: ProgressEffect, emit: Emit) -> None:
        """Carry out a progress rule's verdict (stop the hung, kill the outlived, note the
        stragglers)."""

    def before_failed_stop(self, alive: Iterable[int]) -> None:
        """The survivors of a failed group (these local ranks) are about to be stopped."""

    def attempt_ended(self, failed: bool) -> None:
        """The attempt's workers are stopped (``failed``: by a worker failure)."""


@dataclass(frozen=True)
class NodeFitness:
    """What a node check found.

    Attributes:
        healthy: the node may join.
        line: the one line to say (the start-up line, or the failure line).
        reason: why it may not ("" when healthy).
        took_s: how long the check took.
        record: the check's facts, for the event.
    """

    healthy: bool
    line: str
    reason: str = ""
    took_s: float = 0.0
    record: Mapping[str, Any] = field(default_factory=dict)


class NodeCheckPart(Protocol):
    """The node check the loop runs before this node's first join, and before a suspect
    node rejoins (``agent/node_check/``)."""

    def check(self) -> NodeFitness:
        """Check this node now (bounded by its own timeout)."""


@dataclass(frozen=True)
class LinkFindings:
    """What a link check found after a round formed.

    Attributes:
        named: one warning line per slow node (every node names the same ones).
        mine: this node's own ``link.slow`` event (message, fields), when it is slow.
        exclude: why this node leaves (``--link-check exclude`` with a spare waiting), or None.
        took_s: how long the check took.
        completed: False when the check did not complete (a peer never came, a helper
            failed: said in a warning); nothing was timed.
    """

    named: tuple[str, ...] = ()
    mine: tuple[str, Mapping[str, Any]] | None = None
    exclude: str | None = None
    took_s: float = 0.0
    completed: bool = True


class LinkCheckPart(Protocol):
    """The link check the loop runs after a round of several nodes formed, before the
    workers start (``agent/link_check/``)."""

    def prepare(self) -> None:
        """This node begins to join: start what the check needs (a helper importing torch)."""

    def measure(
        self,
        rank: int,
        world_size: int,
        addr: str,
        port: int,
        prefix: str,
        spares: int,
        give_up: Callable[[], None],
    ) -> LinkFindings:
        """Time this round's links (every node calls it at once); ``give_up`` raises to stop."""


class NoProgressWatch:
    """The progress part of an agent that watches no beats: an empty view, no effects."""

    def observe(self, group: GroupView, now_ns: int) -> ProgressView:
        """An empty view (no beats, no verdicts)."""
        return ProgressView()

    def apply(self, effect: ProgressEffect, emit: Emit) -> None:
        """Nothing to carry out: no progress rule fires without beats."""

    def before_failed_stop(self, alive: Iterable[int]) -> None:
        """Nothing to take."""

    def attempt_ended(self, failed: bool) -> None:
        """Nothing to count."""


class MonitoredWorkers:
    """The worker group of an agent that implements torch's ``_monitor_workers``.

    Args:
        monitor: the agent's ``_monitor_workers``.
        role: the workers' role (their failure records).
    """

    def __init__(self, monitor: Callable[[WorkerGroup], RunResult], role: str) -> None:
        self._monitor = monitor
        self._role = role
        self._host = socket.gethostname()
        self._records: dict[tuple[int, int, int], FailureRecord] = {}

    def send_signal(self, sig: int) -> None:
        """Nothing: torch's extension points have no way to forward a signal."""

    def failures_after_stop(self, view: GroupView) -> tuple[FailureRecord, ...]:
        """The workers that failed, as ``_monitor_workers`` reported them."""
        return view.failures

    def observe(self, group: WorkerGroup) -> GroupView:
        """Ask ``_monitor_workers`` once; each worker's state is the group's."""
        result = self._monitor(group)
        if result.state is WorkerState.UNKNOWN:  # torch's loop raises: it cannot go on
            raise AgentError(f"[{self._role}] Worker group in {result.state.name} state")
        records = []
        for rank, failure in result.failures.items():
            if isinstance(failure, FailureRecord):
                records.append(failure)
                continue
            key = (rank, failure.pid, failure.exitcode)
            record = self._records.get(key)
            if record is None:  # a torch-style subclass's ProcessFailure: read once
                record = FailureRecord.of(failure, rank, self._role, self._host)
                self._records[key] = record
            records.append(record)
        records.sort(key=lambda f: (f.timestamp, f.global_rank))
        state = result.state.value
        workers = tuple(
            WorkerView(w.local_rank, w.global_rank, w.id if isinstance(w.id, int) else None, state)
            for w in group.workers
        )
        return GroupView.of_state(
            result.state,
            workers=workers,
            failures=tuple(records),
            return_values=dict(result.return_values),
        )
