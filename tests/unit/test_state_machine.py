"""The agent's pure decisions (``agent/loop/state_machine.py``): each row of its tables, then
properties over every observation hypothesis can build."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastic_run.agent.api import WorkerState
from elastic_run.agent.loop import state_machine as sm
from tests.unit.observations import JOINING, RUNNING, flat, flat_observations

# -- the joining table --------------------------------------------------------------------


def test_joining_a_signal_wins_over_everything() -> None:
    obs = flat(JOINING, signal=15, closed="failed", rendezvous_error=4)
    assert sm.decide(obs) == sm.Stop(15)
    assert sm.Stop(15).exit_code == 143


@pytest.mark.parametrize(
    ("reason", "code", "state"),
    [
        ("succeeded", 0, WorkerState.SUCCEEDED),
        ("failed", 1, WorkerState.FAILED),
        ("closed", 3, WorkerState.STOPPED),
    ],
)
def test_joining_a_closed_job_ends_with_its_code(
    reason: sm.ClosedReason, code: int, state: WorkerState
) -> None:
    action = sm.decide(flat(JOINING, closed=reason))
    assert isinstance(action, sm.End)
    assert (action.exit_code, action.state, action.closed) == (code, state, reason)


def test_joining_a_failed_rendezvous_ends_with_its_code() -> None:
    action = sm.decide(flat(JOINING, rendezvous_error=4))
    assert isinstance(action, sm.End) and action.exit_code == 4 and action.closed is None


def test_joining_a_completed_round_starts_the_workers() -> None:
    assert sm.decide(JOINING) == sm.Start()


# -- the running table --------------------------------------------------------------------


def test_running_a_signal_wins_even_over_a_failure() -> None:
    obs = flat(RUNNING, signal=2, workers=sm.WorkersStatus.FAILED, liveness_lost=True)
    assert sm.decide(obs) == sm.Stop(2)


def test_a_failure_is_reported_before_anything_is_decided() -> None:
    obs = flat(RUNNING, workers=sm.WorkersStatus.FAILED, closed="closed", round_over=True)
    assert sm.decide(obs) == sm.ReportFailure()


def test_a_counted_failure_with_restarts_left_restarts_and_spends_one() -> None:
    obs = flat(RUNNING, workers=sm.WorkersStatus.FAILED, failure_counted=True, restarts=2)
    assert sm.decide(obs) == sm.Restart(counted=True)


def test_a_counted_failure_with_restarts_used_up_fails_the_job() -> None:
    obs = flat(RUNNING, workers=sm.WorkersStatus.FAILED, failure_counted=True, restarts=3)
    assert sm.decide(obs) == sm.Fail()


def test_a_failure_after_a_node_of_the_round_finished_fails_the_job() -> None:
    """The finished node never runs its workers again: no round can form for a restart."""
    for counted in (True, False):
        obs = flat(
            RUNNING, workers=sm.WorkersStatus.FAILED, failure_counted=counted, peers_finished=2
        )
        assert sm.decide(obs) == sm.Fail(finished=2)


def test_a_failure_another_node_reported_first_restarts_without_spending() -> None:
    obs = flat(RUNNING, workers=sm.WorkersStatus.FAILED, failure_counted=False, restarts=3)
    assert sm.decide(obs) == sm.Restart(counted=False)


def test_success_finishes_even_when_the_job_closed_meanwhile() -> None:
    obs = flat(RUNNING, workers=sm.WorkersStatus.SUCCEEDED, closed="succeeded")
    assert sm.decide(obs) == sm.Finish()


def test_a_closed_job_ends_the_running_workers() -> None:
    action = sm.decide(flat(RUNNING, closed="closed", liveness_lost=True))
    assert isinstance(action, sm.End) and action.exit_code == 3


def test_lost_liveness_comes_before_the_round_news() -> None:
    obs = flat(RUNNING, liveness_lost=True, round_over=True, member_lost=True, nodes_waiting=2)
    assert sm.decide(obs) == sm.Rejoin("liveness_lost")


@pytest.mark.parametrize(
    ("member_lost", "cause", "reason"),
    [
        (True, "member_lost", "member_lost"),
        (False, "nodes_waiting", "nodes_waiting"),
        (False, "worker_failure", "round_ended"),
        (False, None, "round_ended"),
    ],
)
def test_a_round_that_ended_elsewhere_is_rejoined_with_its_cause(
    member_lost: bool, cause: str | None, reason: sm.RejoinReason
) -> None:
    obs = flat(RUNNING, round_over=True, member_lost=member_lost, end_cause=cause)
    assert sm.decide(obs) == sm.Rejoin(reason)


def test_waiting_nodes_are_admitted_by_a_rejoin() -> None:
    assert sm.decide(flat(RUNNING, nodes_waiting=1)) == sm.Rejoin("nodes_waiting")


def test_nothing_new_waits() -> None:
    assert sm.decide(RUNNING) == sm.Wait()


# -- properties ----------------------------------------------------------------------------

observations = flat_observations(
    phase=st.sampled_from(sm.Phase),
    signal=st.none() | st.sampled_from([1, 2, 3, 15]),
    workers=st.sampled_from(sm.WorkersStatus),
    failure_counted=st.none() | st.booleans(),
    restarts=st.integers(0, 20),
    max_restarts=st.integers(0, 20),
    closed=st.none() | st.sampled_from(["closed", "succeeded", "failed"]),
    rendezvous_error=st.none() | st.sampled_from([3, 4]),
    liveness_lost=st.booleans(),
    round_over=st.booleans(),
    member_lost=st.booleans(),
    end_cause=st.none() | st.sampled_from(["member_lost", "nodes_waiting", "rejoin"]),
    nodes_waiting=st.integers(0, 5),
    peers_finished=st.integers(0, 3),
)


@given(observations)
def test_decide_is_total_and_deterministic(obs: sm.Observation) -> None:
    action = sm.decide(obs)
    assert action == sm.decide(obs)
    assert isinstance(action.state, WorkerState)


@given(observations)
def test_a_pending_signal_always_stops_with_128_plus_n(obs: sm.Observation) -> None:
    action = sm.decide(obs)
    if obs.signal is not None:
        assert action == sm.Stop(obs.signal)
    else:
        assert not isinstance(action, sm.Stop)


@given(observations)
def test_only_a_counted_failure_spends_a_restart_and_never_past_max(obs: sm.Observation) -> None:
    action = sm.decide(obs)
    if isinstance(action, sm.Restart) and action.counted:
        assert obs.failure_counted is True and obs.restarts < obs.max_restarts
    if isinstance(action, sm.Fail) and not action.finished:
        assert obs.failure_counted is True and obs.restarts >= obs.max_restarts
    if isinstance(action, sm.Fail) and action.finished:
        assert action.finished == obs.peers_finished > 0


@given(observations)
def test_failed_workers_are_never_left_running_nor_rejoined_without_a_report(
    obs: sm.Observation,
) -> None:
    action = sm.decide(obs)
    if obs.phase is sm.Phase.RUNNING and obs.workers is sm.WorkersStatus.FAILED:
        assert isinstance(action, (sm.Stop, sm.ReportFailure, sm.Restart, sm.Fail))


@given(observations)
def test_healthy_workers_keep_running_only_when_nothing_changed(obs: sm.Observation) -> None:
    action = sm.decide(obs)
    if isinstance(action, sm.Wait):
        assert obs.phase is sm.Phase.RUNNING and obs.signal is None
        assert obs.workers is sm.WorkersStatus.RUNNING and obs.round.closed is None
        assert not (obs.round.liveness_lost or obs.round.round_over or obs.round.nodes_waiting)
