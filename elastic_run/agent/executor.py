"""Executing the state machine's actions: the agent's run loop, from start to exit code.

``run_to_end(agent)``: join a round and start the workers (through the agent's
``_initialize_workers``, later ``_restart_workers``, so a torch-style subclass's overrides take
effect), then each turn observe, ``decide`` and apply, until an action ends the run. Every effect of an action lives here (stop the
workers, report a failure, close the rendezvous, emit events, publish state); every decision
lives in ``state_machine.py``. Library errors become actions too: a rendezvous that fails ends
the run with its documented exit code; an agent error (a worker that cannot be spawned) exits 1.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from elastic_run.agent import state_machine as sm
from elastic_run.agent.api import RunResult, WorkerState
from elastic_run.agent.exit_barrier import finished_so_far, peers_finished
from elastic_run.errors import AgentError
from elastic_run.rendezvous.errors import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousInterruptedError,
)

if TYPE_CHECKING:
    from elastic_run.agent.simple import SimpleElasticAgent

__all__ = ["run_to_end"]

log = logging.getLogger(__name__)


def run_to_end(agent: SimpleElasticAgent) -> RunResult:
    """Run ``agent``'s loop until the job ends for this node; return the result."""
    from elastic_run.agent.simple import _RoundEnded

    handler = agent._spec.rdzv_handler
    group = agent._worker_group
    try:
        agent._setup()
        agent._emit(
            "agent.started",
            f"agent up: {agent._spec.local_world_size} workers, "
            f"{handler.get_backend()} rendezvous '{handler.get_run_id()}'",
            run_id=handler.get_run_id(),
            nproc_per_node=agent._spec.local_world_size,
            backend=handler.get_backend(),
            endpoint=agent._rdzv.endpoint if agent._rdzv is not None else "",
        )
        again = False
        while True:
            try:
                action = _join(agent, again)
            except _RoundEnded:
                again = True  # the round ended while it was set up: join the next
                continue
            if not isinstance(action, sm.Start):
                return _apply_end(agent, action, RunResult(WorkerState.INIT))
            again = True
            while True:
                agent._wait_tick()
                result = agent._monitor_workers(group)
                action = _decide_turn(agent, result)
                if isinstance(action, sm.Wait):
                    continue
                if isinstance(action, (sm.Restart, sm.Rejoin)):
                    _apply_again(agent, action, result)
                    break
                return _apply_end(agent, action, result)
    except RendezvousError as exc:
        return _fail(agent, exc.exit_code, str(exc))
    except AgentError as exc:
        return _fail(agent, exc.exit_code, str(exc))


def _join(agent: SimpleElasticAgent, again: bool) -> sm.Action:
    """Rendezvous and start the workers through torch's extension points (a subclass's
    ``_initialize_workers`` / ``_restart_workers`` take effect), then decide."""
    obs = sm.Observation(sm.Phase.JOINING)
    reason = ""
    try:
        if again:
            agent._restart_workers(agent._worker_group)
        else:
            agent._initialize_workers(agent._worker_group)
    except RendezvousInterruptedError:
        pass  # the signal is in the log: decide() stops
    except RendezvousClosedError as exc:
        reason = str(exc)
        obs = replace(obs, closed=_closed_now(agent))
    except RendezvousError as exc:
        reason = str(exc)
        obs = replace(obs, rendezvous_error=exc.exit_code)
    action = sm.decide(replace(obs, signal=agent._signal_log.pending_stop()))
    if isinstance(action, sm.End) and reason and action.closed in (None, "closed"):
        return replace(action, reason=reason)
    return action


def _closed_now(agent: SimpleElasticAgent) -> sm.ClosedReason:
    from elastic_run.agent.simple import _closed_reason

    if agent._rdzv is None:
        return "closed"
    try:
        return _closed_reason(agent._rdzv.closed_reason()) or "closed"
    except RendezvousError:
        return "closed"


def _decide_turn(agent: SimpleElasticAgent, result: RunResult) -> sm.Action:
    obs = agent._observe(result)
    action = sm.decide(obs)
    if isinstance(action, sm.StopHung):
        agent._stop_hung()  # the hung workers die: the next turn sees the group FAILED
        return sm.Wait(action.state)
    if not isinstance(action, sm.ReportFailure):
        return action
    agent._set_state(action.state)
    counted = agent._rdzv.report_failure() if agent._rdzv is not None else True
    failed = sorted(result.failures.values(), key=lambda f: f.timestamp)
    head = failed[0] if failed else None
    agent._emit(
        "worker.failed",
        f"worker rank {head.global_rank} (local {head.local_rank}) failed: {head.how}"
        if head
        else "a worker failed",
        local_rank=head.local_rank if head else -1,
        rank=head.global_rank if head else -1,
        exitcode=head.exitcode if head else None,
        counted=counted,
    )
    finished = peers_finished(agent)
    return sm.decide(replace(obs, failure_counted=counted, peers_finished=finished))


def _apply_again(agent: SimpleElasticAgent, action: sm.Restart | sm.Rejoin, result: Any) -> None:
    """Stop the workers so that the loop can rendezvous again."""
    spec = agent._spec
    if isinstance(action, sm.Restart):
        after = agent._restarts + (1 if action.counted else 0)
        agent._emit(
            "restart",
            f"restarting the workers ({after}/{spec.max_restarts} restarts"
            f"{' spent' if action.counted else ', not counted: another node failed first'})",
            restarts=after,
            max_restarts=spec.max_restarts,
            counted=action.counted,
        )
    else:
        # Cut off from the store: nothing on the way to stopping the workers may wait on it
        # (a read or a publication would wait out the link's deadline, read_timeout on etcd).
        cut_off = action.reason == "liveness_lost"
        fields = {} if cut_off else _round_end_fields(agent)
        waiting = agent._poll.nodes_waiting
        who = ", ".join(fields.get("lost", ())) or fields.get("ended_by", "")
        text = _REJOIN_TEXT(action.reason, waiting)
        if who and action.reason in ("member_lost", "round_ended"):
            text += f" ({who})"
        if cut_off and agent._rdzv is not None:
            report = agent._rdzv.liveness()
            text += f": no successful heartbeat for {report.since_ok_s:.1f} s"
            if report.error:
                text += f" ({report.error})"
        text += ": stopping the workers to re-rendezvous"
        fields.update(reason=action.reason, waiting=waiting)
        agent._emit("membership.changed", text, publish=not cut_off, **fields)
    agent._set_state(action.state)
    if isinstance(action, sm.Restart):
        agent._before_failed_stop()
    agent._stop_workers(agent._worker_group)
    if isinstance(action, sm.Rejoin) and action.reason == "liveness_lost":
        agent._emit(
            "workers.stopped",
            "workers stopped (this node lost its liveness)",
            reason="liveness_lost",
        )
        agent._publish_event("membership.changed", text, fields)
    agent._attempt_ended(failed=isinstance(action, sm.Restart))
    if isinstance(action, sm.Rejoin) and action.reason != "liveness_lost":
        _say_finished(agent)
    if isinstance(action, sm.Rejoin) and agent._rdzv is not None:
        if action.reason in ("nodes_waiting", "liveness_lost"):
            # This node ends the round: record why, so the others tell the same story.
            try:
                agent._rdzv.leave_round(action.reason)
            except RendezvousError as exc:
                log.warning("could not record why this node left the round: %s", exc)


def _say_finished(agent: SimpleElasticAgent) -> None:
    """Warn when nodes of the round being left finished: they wait at the exit barrier and never
    rejoin, so the next round forms without them, or (below the minimum) waits for the join
    timeout. Read once the workers are stopped: the store may be slow to answer now."""
    finished = finished_so_far(agent)
    if finished:
        log.warning(
            "%d node%s of the round this node leaves finished and will not rejoin: the next "
            "round forms without %s, or waits for the join timeout if too few nodes remain",
            finished,
            "s" if finished != 1 else "",
            "them" if finished != 1 else "it",
        )


def _REJOIN_TEXT(reason: sm.RejoinReason, waiting: int) -> str:  # noqa: N802 - a table
    if reason == "nodes_waiting":
        return f"{waiting} node{'s' if waiting != 1 else ''} waiting to join"
    return {
        "liveness_lost": "this node lost its liveness (its heartbeat failed)",
        "member_lost": "a member of the round was lost",
        "round_ended": "the round ended on another node",
    }[reason]


def _round_end_fields(agent: SimpleElasticAgent) -> dict[str, Any]:
    """Who ended this node's round and why (event fields); none when it cannot be read."""
    if agent._rdzv is None:
        return {}
    try:
        end = agent._rdzv.round_end()
    except RendezvousError as exc:
        log.warning("could not read why the round ended: %s", exc)
        return {}
    if end is None:
        return {}
    fields: dict[str, Any] = {"cause": end.cause, "ended_by": end.ended_by}
    if end.lost:
        fields["lost"] = list(end.lost)
    return fields


def _apply_end(agent: SimpleElasticAgent, action: sm.Action, result: RunResult) -> RunResult:
    """Apply an action that ends the run; return the run's result."""
    spec = agent._spec
    if isinstance(action, sm.Stop):
        name = signal.Signals(action.signal).name
        agent._emit("signal", f"received {name}: stopping the workers", signal=name)
        agent._shutdown(signal.Signals(action.signal), int(agent._shutdown_timeout))
        agent._set_state(action.state)
        agent._publish_state("STOPPED", f"received {name}")
        agent._emit("workers.stopped", f"workers stopped ({name})", signal=name, reason="signal")
        return RunResult(action.state, exit_code=action.exit_code, reason=f"stopped by {name}")
    if isinstance(action, (sm.Fail, sm.NoProgress)):
        agent._before_failed_stop()
        agent._stop_workers(agent._worker_group)
        reason = (
            f"worker failure and {spec.max_restarts} restart"
            f"{'' if spec.max_restarts == 1 else 's'} used up"
        )
        if isinstance(action, sm.Fail) and action.finished:
            reason = (
                f"worker failure after {action.finished} node"
                f"{' had' if action.finished == 1 else 's had'} finished the round (a finished "
                "node does not run its workers again: no restart)"
            )
        if isinstance(action, sm.NoProgress):
            reason = (
                f"no progress: {action.restarts} restart{'' if action.restarts == 1 else 's'} "
                "in a row ended without a progress beat (--max-no-progress-restarts)"
            )
        agent._close_rendezvous("failed")
        agent._set_state(action.state)
        agent._publish_state("FAILED", reason)
        agent._emit(
            "failed", f"the job failed: {reason}", reason=reason, exit_code=action.exit_code
        )
        agent._leave_last()  # the store's host waits until the others have read `closed`
        return RunResult(
            action.state, failures=result.failures, exit_code=action.exit_code, reason=reason
        )
    if isinstance(action, sm.Finish):
        agent._set_state(action.state)
        agent._publish_state("SUCCEEDED")
        agent._emit("succeeded", "every local worker succeeded")
        agent._exit_barrier()
        return RunResult(
            action.state, return_values=result.return_values, exit_code=action.exit_code
        )
    if isinstance(action, sm.End):
        agent._stop_workers(agent._worker_group)
        agent._set_state(action.state)
        if action.closed is not None:
            agent._leave_last()
            agent._emit("closed", action.reason, reason=action.closed)
        else:
            agent._emit("failed", action.reason, reason=action.reason, exit_code=action.exit_code)
        return RunResult(action.state, exit_code=action.exit_code, reason=action.reason)
    raise AssertionError(f"not an ending action: {action}")


def _fail(agent: SimpleElasticAgent, exit_code: int, reason: str) -> RunResult:
    agent._stop_workers(agent._worker_group)
    agent._set_state(WorkerState.FAILED)
    agent._emit("failed", reason, reason=reason, exit_code=exit_code)
    return RunResult(WorkerState.FAILED, exit_code=exit_code, reason=reason)
