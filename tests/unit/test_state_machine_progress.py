"""The state machine's progress rows (``agent/loop/state_machine.py``): a hung worker and a crash
loop without progress, row by row, then properties over every observation."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastic_run.agent.api import WorkerState
from elastic_run.agent.loop import state_machine as sm
from tests.unit.observations import HUNG, RUNNING, flat, flat_observations

FAILED = flat(RUNNING, workers=sm.WorkersStatus.FAILED, failure_counted=True)


def test_a_hung_worker_is_stopped() -> None:
    action = sm.decide(flat(RUNNING, hung=True))
    assert action == sm.StopHung((HUNG,))
    assert action.state is WorkerState.HEALTHY  # the failure comes next turn, from the kill


def test_the_rendezvous_rows_come_before_a_hang_verdict() -> None:
    # A lost peer silences the workers too: re-rendezvousing is the cure, not a kill.
    obs = flat(RUNNING, hung=True, round_over=True, member_lost=True)
    assert sm.decide(obs) == sm.Rejoin("member_lost")
    assert sm.decide(flat(RUNNING, hung=True, nodes_waiting=1)) == sm.Rejoin("nodes_waiting")
    assert isinstance(sm.decide(flat(RUNNING, hung=True, closed="closed")), sm.End)
    assert sm.decide(flat(RUNNING, hung=True, signal=15)) == sm.Stop(15)


def test_a_failure_outranks_a_hang_verdict() -> None:
    obs = flat(RUNNING, hung=True, workers=sm.WorkersStatus.FAILED)
    assert sm.decide(obs) == sm.ReportFailure()


def test_k_failed_attempts_without_progress_stop_with_exit_5() -> None:
    obs = flat(FAILED, restarts=1, no_progress_restarts=2, max_no_progress_restarts=2)
    action = sm.decide(obs)
    assert action == sm.NoProgress(2)
    assert action.exit_code == sm.EXIT_NO_PROGRESS == 5
    assert action.state is WorkerState.FAILED


def test_no_progress_also_stops_a_node_whose_failure_was_not_counted() -> None:
    obs = flat(FAILED, failure_counted=False, no_progress_restarts=1, max_no_progress_restarts=1)
    assert sm.decide(obs) == sm.NoProgress(1)


def test_fewer_than_k_restarts_without_progress_restart() -> None:
    obs = flat(FAILED, no_progress_restarts=1, max_no_progress_restarts=2)
    assert sm.decide(obs) == sm.Restart(counted=True)


def test_no_progress_is_off_by_default() -> None:
    assert sm.decide(flat(FAILED, no_progress_restarts=50)) == sm.Restart(counted=True)


def test_no_progress_is_decided_only_after_the_failure_was_reported() -> None:
    obs = flat(FAILED, failure_counted=None, no_progress_restarts=9, max_no_progress_restarts=1)
    assert sm.decide(obs) == sm.ReportFailure()


observations = flat_observations(
    phase=st.just(sm.Phase.RUNNING),
    signal=st.none() | st.sampled_from([2, 15]),
    workers=st.sampled_from(sm.WorkersStatus),
    failure_counted=st.none() | st.booleans(),
    restarts=st.integers(0, 5),
    max_restarts=st.integers(0, 5),
    closed=st.none() | st.sampled_from(["closed", "succeeded", "failed"]),
    liveness_lost=st.booleans(),
    round_over=st.booleans(),
    member_lost=st.booleans(),
    nodes_waiting=st.integers(0, 2),
    hung=st.booleans(),
    no_progress_restarts=st.integers(0, 5),
    max_no_progress_restarts=st.integers(0, 5),
)


# A shared, loaded machine: generation may be slow; no timing is asserted.
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(observations)
def test_stop_hung_only_for_running_workers_with_nothing_else_to_do(obs: sm.Observation) -> None:
    action = sm.decide(obs)
    if isinstance(action, sm.StopHung):
        assert (
            bool(obs.progress.suspects)
            and obs.signal is None
            and obs.workers is sm.WorkersStatus.RUNNING
        )
        assert obs.round.closed is None and not obs.round.round_over and not obs.round.nodes_waiting
        assert not obs.round.liveness_lost
    elif bool(obs.progress.suspects) and sm.decide(flat(obs, hung=False)) == sm.Wait():
        raise AssertionError(f"a hung worker was left running: {obs}")


# A shared, loaded machine: generation may be slow; no timing is asserted.
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(observations)
def test_no_progress_only_after_a_reported_failure_and_k_restarts(obs: sm.Observation) -> None:
    action = sm.decide(obs)
    if isinstance(action, sm.NoProgress):
        assert obs.workers is sm.WorkersStatus.FAILED and obs.failure_counted is not None
        assert 0 < obs.progress.max_no_progress_restarts <= obs.progress.no_progress_restarts
        assert action.exit_code == 5
