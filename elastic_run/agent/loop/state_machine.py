"""The agent's decisions: what the run loop observed -> what it does next. Pure.

``decide(observation, now_ns) -> action`` asks the rules of the registry
(``agent/rules/registry.py``) in order; the first that returns an action decides. The run loop
(``simple.py``) observes (one frozen record per part: the worker group, progress, the
rendezvous), calls ``decide``, and applies the action; it sets the worker group's state only
from the action's ``state``. No clock, store, process or signal here.

While joining a round (``Phase.JOINING``), first match wins:

    signal              a terminating signal is pending             -> Stop         STOPPED  128+N
    closed              the rendezvous is closed                    -> End          0, 1 or 3
    rendezvous_failed   the join failed (timeout, unreachable)      -> End          its code
    (none)              the round completed                         -> Start        HEALTHY

While the workers run (``Phase.RUNNING``), first match wins:

    signal              a terminating signal is pending             -> Stop         STOPPED  128+N
    worker_failed       a worker failed, not yet reported           -> ReportFailure FAILED
    node_excluded       this node's failures single it out          -> Exclude      FAILED   6
    no_progress         K failed attempts in a row, no progress     -> NoProgress   FAILED   5
    restart             failed and reported                         -> Fail / Restart
    succeeded           every local worker succeeded                -> Finish       SUCCEEDED 0
    closed_while_running  the rendezvous is closed                  -> End          0, 1 or 3
    liveness_lost       this node's heartbeat failed past budget    -> Rejoin
    round_ended         the round ended (member lost, waiting, ...) -> Rejoin
    nodes_waiting       nodes wait and the round has room           -> Rejoin
    script_outlived     a process outlived its script's end         -> KillOutlived HEALTHY
    hung                a silent worker is judged hung              -> StopHung     HEALTHY
    straggler           a step-time reading to judge (rank 0)       -> NoteStragglers
    (none)                                                          -> Wait         HEALTHY

"Counted": the first node to report a failure of the round ends it, and only that failure
counts against ``max_restarts``. ``Restart`` and ``Rejoin`` both stop the workers and
rendezvous again; only ``Restart(counted=True)`` spends a restart. The restart count is the
job's: every worker of a round sees the same value. Each rule's module says its own reasons
(``agent/rules/``); a test holds this table to the registry.
"""

from __future__ import annotations

from elastic_run.agent.rules.actions import (
    EXIT_CLOSED,
    EXIT_EXCLUDED,
    EXIT_FAILED,
    EXIT_NO_PROGRESS,
    EXIT_SUCCEEDED,
    Action,
    End,
    Exclude,
    Fail,
    Finish,
    KillOutlived,
    NoProgress,
    NoteStragglers,
    ProgressEffect,
    Rejoin,
    ReportFailure,
    Restart,
    Start,
    Stop,
    StopHung,
    Wait,
)
from elastic_run.agent.rules.observation import (
    ClosedReason,
    GroupView,
    NodeView,
    Observation,
    Phase,
    ProgressView,
    RejoinReason,
    RoundView,
    WorkersStatus,
)
from elastic_run.agent.rules.registry import rules_for

__all__ = [
    "EXIT_CLOSED",
    "EXIT_EXCLUDED",
    "EXIT_FAILED",
    "EXIT_NO_PROGRESS",
    "EXIT_SUCCEEDED",
    "Action",
    "ClosedReason",
    "End",
    "Exclude",
    "Fail",
    "Finish",
    "GroupView",
    "KillOutlived",
    "NodeView",
    "NoProgress",
    "NoteStragglers",
    "Observation",
    "Phase",
    "ProgressEffect",
    "ProgressView",
    "Rejoin",
    "RejoinReason",
    "ReportFailure",
    "Restart",
    "RoundView",
    "Start",
    "Stop",
    "StopHung",
    "Wait",
    "WorkersStatus",
    "decide",
]


def decide(obs: Observation, now_ns: int = 0) -> Action:
    """The next action for ``obs`` at ``now_ns``: the first rule of its phase that answers.

    Args:
        obs: this turn's observation.
        now_ns: the monotonic time now (the rules that weigh time read it).

    Returns:
        The action; ``Start`` for a completed join, ``Wait`` while running, when no rule
        answers.
    """
    for rule in rules_for(obs.phase):
        action = rule.judge(obs, now_ns)
        if action is not None:
            return action
    return Start() if obs.phase is Phase.JOINING else Wait()
