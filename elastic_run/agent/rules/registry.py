"""The registry: every rule the agent decides by, in the order it is asked. Pure.

The state machine (``agent/loop/state_machine.py``) asks the rules of the loop's phase in this
order; the first that returns an action decides the turn. When none does, a joining node starts
its workers (the round completed) and a running one waits. A rule is one module with its own
tests and one line here: the engine names none of them.

Each entry also says which events its action emits and whether they are published to the
rendezvous backend for ``elastic-run status`` (the loop publishes what the registry says).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from elastic_run.agent.rules import closed, membership, outcome, stop
from elastic_run.agent.rules.actions import Action
from elastic_run.agent.rules.nodes import excluded
from elastic_run.agent.rules.observation import Observation, Phase
from elastic_run.agent.rules.progress import hung, no_progress, outlived, straggler

__all__ = [
    "BOTH",
    "JOINING",
    "RULES",
    "RUNNING",
    "Judge",
    "Rule",
    "published_events",
    "rules_for",
]

JOINING = frozenset({Phase.JOINING})
RUNNING = frozenset({Phase.RUNNING})
BOTH = JOINING | RUNNING

Judge = Callable[[Observation, int], "Action | None"]


@dataclass(frozen=True)
class Rule:
    """One rule of the agent.

    Attributes:
        code: its name (``worker_failed``), in the transition table and in tests.
        phases: the phases it is asked in.
        judge: ``(observation, now_ns) -> action or None``.
        when: one line for the transition table: what it reads, what it returns.
        events: the event kinds its action makes the loop emit -> whether each is published
            to the rendezvous backend.
    """

    code: str
    phases: frozenset[Phase]
    judge: Judge
    when: str
    events: Mapping[str, bool] = field(default_factory=dict)


RULES: tuple[Rule, ...] = (
    Rule("signal", BOTH, stop.judge, "a terminating signal is pending -> Stop (128+N)",
         {"signal": True}),
    Rule("closed", JOINING, closed.judge, "the rendezvous is closed -> End (0, 1 or 3)",
         {"closed": True}),
    Rule("rendezvous_failed", JOINING, closed.failed_join,
         "joining failed (timeout, unreachable) -> End (its code)"),
    Rule("worker_failed", RUNNING, outcome.report,
         "a worker failed, not yet reported -> ReportFailure", {"worker.failed": True}),
    Rule("node_excluded", RUNNING, excluded.judge,
         "this node's counted failures single it out -> Exclude (6)", {"node.excluded": True}),
    Rule("no_progress", RUNNING, no_progress.judge,
         "K failed attempts in a row without progress -> NoProgress (5)"),
    Rule("restart", RUNNING, outcome.restart,
         "failed and reported -> Fail (1: peers finished, restarts used up) or Restart",
         {"restart": True, "failed": True}),
    Rule("succeeded", RUNNING, outcome.succeeded, "every local worker succeeded -> Finish (0)",
         {"succeeded": True}),
    Rule("closed_while_running", RUNNING, closed.judge,
         "the rendezvous is closed -> End (0, 1 or 3)", {"closed": True}),
    Rule("liveness_lost", RUNNING, membership.liveness_lost,
         "this node's heartbeat failed past the budget -> Rejoin", {"membership.changed": True}),
    Rule("round_ended", RUNNING, membership.round_ended,
         "the round ended (member lost, nodes waiting, elsewhere) -> Rejoin",
         {"membership.changed": True}),
    Rule("nodes_waiting", RUNNING, membership.nodes_waiting,
         "nodes wait at the door and the round has room -> Rejoin",
         {"membership.changed": True}),
    Rule("script_outlived", RUNNING, outlived.judge,
         "a process outlived its script's end past the bound -> KillOutlived",
         {"worker.outlived": True, "worker.died_after_script": True}),
    Rule("hung", RUNNING, hung.judge, "a silent worker is judged hung -> StopHung",
         {"worker.hung": True}),
    Rule("straggler", RUNNING, straggler.judge,
         "a step-time reading to judge (rank 0) -> NoteStragglers", {"straggler": True}),
)  # fmt: skip


def rules_for(phase: Phase) -> tuple[Rule, ...]:
    """The rules of ``phase``, in the order they are asked."""
    return tuple(rule for rule in RULES if phase in rule.phases)


def published_events() -> frozenset[str]:
    """The event kinds the rules' actions emit that go to the rendezvous backend too."""
    return frozenset(kind for rule in RULES for kind, published in rule.events.items() if published)
