"""The goodput fold: every second from the start to now lies in exactly one cause (fake clock)."""

from __future__ import annotations

import math

import pytest

from elastic_run.agent.loop import goodput as gp


def _parts(acc: gp.GoodputAccount) -> float:
    return acc.training_s + acc.lost_s


def _steps(fold: gp.GoodputFold, start_s: float, count: int, gap_s: float) -> gp.GoodputFold:
    """``count`` beats ``gap_s`` apart, the first at ``start_s``."""
    beats = fold.beats
    for i in range(count):
        fold = gp.beat(fold, beats + i + 1, start_s + i * gap_s)
    return fold


def _first_start(t0: float = 0.0) -> gp.GoodputFold:
    fold = gp.begin(t0)
    fold = gp.on_event(fold, "rendezvous.joining", t0 + 0.5)
    fold = gp.on_event(fold, "rendezvous.complete", t0 + 1.5)
    return gp.on_event(fold, "workers.started", t0 + 2.0)


def test_startup_runs_to_the_first_beat_then_beats_are_training() -> None:
    fold = _steps(_first_start(), 5.0, 11, 1.0)  # beats at 5..15
    acc = gp.account(fold, 15.0)
    assert acc.startup_s == pytest.approx(5.0)
    assert acc.training_s == pytest.approx(10.0)
    assert acc.wall_s == pytest.approx(15.0)
    assert acc.restart_count == 0 and acc.stall_s == 0.0
    assert _parts(acc) == pytest.approx(acc.wall_s)
    assert acc.share == pytest.approx(10.0 / 15.0)


def test_a_failure_is_detected_stopped_rejoined_started_and_beaten_again() -> None:
    fold = _steps(_first_start(), 5.0, 6, 1.0)  # last beat at 10
    fold = gp.on_event(fold, "worker.failed", 10.4, failed_at_s=10.1)
    fold = gp.on_event(fold, "restart", 10.5)
    fold = gp.on_event(fold, "rendezvous.joining", 11.5)
    fold = gp.on_event(fold, "rendezvous.complete", 12.5)
    fold = gp.on_event(fold, "workers.started", 13.0)
    fold = _steps(fold, 16.0, 5, 1.0)  # first beat after the restart at 16, last at 20
    acc = gp.account(fold, 20.0)
    assert acc.restart_count == 1
    (cost,) = acc.restarts
    assert cost.cause == "failure"
    assert cost.detection_s == pytest.approx(0.4)  # 10.1 -> 10.5 (failed, decided)
    assert cost.stop_s == pytest.approx(1.0)
    assert cost.rendezvous_s == pytest.approx(1.0)
    assert cost.worker_start_s == pytest.approx(0.5)
    assert cost.first_beat_s == pytest.approx(3.0)
    assert acc.restart_s["first_beat"] == pytest.approx(3.0)
    assert acc.training_s == pytest.approx(5.0 + 0.1 + 4.0)  # the step in progress counts
    assert _parts(acc) == pytest.approx(acc.wall_s) and acc.wall_s == pytest.approx(20.0)


def test_a_restart_with_no_beat_yet_ends_at_the_next_failure() -> None:
    fold = _steps(_first_start(), 5.0, 3, 1.0)
    fold = gp.on_event(fold, "worker.failed", 8.0, failed_at_s=8.0)
    fold = gp.on_event(fold, "restart", 8.0)
    fold = gp.on_event(fold, "rendezvous.joining", 9.0)
    fold = gp.on_event(fold, "rendezvous.complete", 10.0)
    fold = gp.on_event(fold, "workers.started", 11.0)
    mid = gp.account(fold, 12.0)  # a restart in progress is shown already
    assert mid.restart_count == 1 and mid.restarts[0].first_beat_s == pytest.approx(1.0)
    assert _parts(mid) == pytest.approx(mid.wall_s)
    fold = gp.on_event(fold, "worker.failed", 14.5, failed_at_s=14.0)  # never beat
    fold = gp.on_event(fold, "restart", 14.5)
    fold = gp.on_event(fold, "rendezvous.joining", 15.0)
    fold = gp.on_event(fold, "rendezvous.complete", 15.0)
    fold = gp.on_event(fold, "workers.started", 15.0)
    fold = _steps(fold, 17.0, 4, 1.0)
    acc = gp.account(fold, 20.0)
    assert acc.restart_count == 2
    first, second = acc.restarts
    assert first.first_beat_s == pytest.approx(3.0)  # 11 -> 14, the failure
    assert second.detection_s == pytest.approx(0.5)
    assert second.first_beat_s == pytest.approx(2.0)
    assert all(r.lost_s > 0 for r in acc.restarts)
    assert _parts(acc) == pytest.approx(acc.wall_s)


def test_a_silence_longer_than_the_learned_gap_is_a_stall() -> None:
    fold = _steps(_first_start(), 5.0, 11, 1.0)  # typical gap 1 s, beats 5..15
    fold = gp.beat(fold, fold.beats + 1, 25.0)  # 10 s without a beat
    acc = gp.account(fold, 25.0)
    assert acc.stall_s == pytest.approx(9.0)  # beyond the typical step
    assert acc.training_s == pytest.approx(11.0)
    open_ = gp.account(fold, 31.0)  # silent again, still open at now
    assert open_.stall_s == pytest.approx(9.0 + 5.0)
    assert _parts(open_) == pytest.approx(open_.wall_s)


def test_a_gap_within_the_limit_is_training() -> None:
    fold = _steps(_first_start(), 5.0, 11, 1.0)
    fold = gp.beat(fold, fold.beats + 1, 17.5)  # 2.5 s: under max(3 x 1, 1 + 1)
    assert gp.account(fold, 17.5).stall_s == 0.0


def test_overlapping_phases_never_count_twice() -> None:
    fold = _steps(_first_start(), 5.0, 6, 1.0)  # last beat at 10
    fold = gp.on_event(fold, "rendezvous.joining", 11.0)  # a late phase change
    # a failure dated before the last accounted instant counts from that instant
    fold = gp.on_event(fold, "worker.failed", 12.0, failed_at_s=3.0)
    fold = gp.beat(fold, 99, 11.5)  # beats read after the failure count for nothing
    fold = gp.on_event(fold, "restart", 12.0)
    acc = gp.account(fold, 13.0)
    assert acc.wall_s == pytest.approx(13.0)
    assert _parts(acc) == pytest.approx(13.0)
    assert all(v >= 0 for v in acc.lost_by_cause().values())


def test_the_end_closes_the_account_and_a_final_failure_is_end() -> None:
    fold = _steps(_first_start(), 5.0, 6, 1.0)
    fold = gp.on_event(fold, "worker.failed", 10.5, failed_at_s=10.2)
    fold = gp.on_event(fold, "failed", 11.0)
    fold = gp.on_event(fold, "restart", 11.5)  # after the end: nothing moves
    fold = gp.on_event(fold, "agent.exited", 12.0)  # final
    acc = gp.account(fold, 50.0)
    assert acc.ended and acc.wall_s == pytest.approx(12.0)
    assert acc.end_s == pytest.approx(1.8) and acc.restart_count == 0
    assert _parts(acc) == pytest.approx(acc.wall_s)


def test_success_turns_the_tail_after_the_last_beat_into_end() -> None:
    fold = _steps(_first_start(), 5.0, 6, 1.0)
    fold = gp.on_event(fold, "signal", 10.5, {"forwarded": True})  # forwarded: not the end
    fold = gp.on_event(fold, "succeeded", 13.0)
    acc = gp.account(fold, 20.0)  # the exit barrier is end too, until the agent leaves
    assert acc.end_s == pytest.approx(10.0) and acc.training_s == pytest.approx(5.0)
    assert not acc.ended and _parts(acc) == pytest.approx(20.0)


def test_a_membership_change_is_a_restart_without_detection() -> None:
    fold = _steps(_first_start(), 5.0, 6, 1.0)
    fold = gp.on_event(fold, "membership.changed", 14.0)  # the peer died: 4 s of silence
    fold = gp.on_event(fold, "rendezvous.joining", 15.0)
    acc = gp.account(fold, 16.0)
    assert acc.restart_count == 1 and acc.restarts[0].cause == "membership"
    assert acc.restarts[0].detection_s == 0.0
    assert acc.stall_s == pytest.approx(3.0)
    assert _parts(acc) == pytest.approx(16.0)


def test_the_json_round_trips_and_nodes_merge_as_node_seconds() -> None:
    fold = _steps(_first_start(), 5.0, 6, 1.0)
    fold = gp.on_event(fold, "worker.failed", 10.0)
    fold = gp.on_event(fold, "restart", 10.0)
    one = gp.account(fold, 12.0)
    body = one.to_json(with_restarts=False)
    back = gp.from_json(body)
    assert back.restart_count == 1 and math.isclose(back.wall_s, 12.0)
    assert gp.merge({"a": back}) == back
    both = gp.merge({"a": back, "b": gp.from_json(gp.account(_first_start(), 4.0).to_json())})
    assert both is not None
    assert both.nodes == 2 and both.wall_s == pytest.approx(16.0)
    assert both.restart_count == 1
    assert both.training_s + both.lost_s == pytest.approx(both.wall_s)
    assert "over 2 nodes" in gp.summary_line(both)
    with pytest.raises(ValueError):
        gp.from_json({"v": 99})
