"""Step times and stragglers (``agent/progress/stragglers.py``): windows over counters, the job's
median, and who is reported, when, and only once."""

from __future__ import annotations

import pytest

from elastic_run.agent.rules.progress.step_times import (
    RankTime,
    StepSample,
    StepWindow,
    StragglerWatch,
    summarize,
    watch_stragglers,
)

S = 1_000_000_000


def test_the_step_time_is_the_mean_gap_over_the_window() -> None:
    window = StepWindow()
    for i in range(1, 11):
        window = window.add(StepSample(at_ns=i * S, beats=i * 4, last_beat_ns=i * S))
    assert window.step_s == pytest.approx(0.25)
    assert window.busy_s is None and window.work_s == pytest.approx(0.25)


def test_the_work_time_is_used_when_sync_points_are_reported() -> None:
    window = StepWindow().add(StepSample(S, 10, S, busy_ns=1 * S, busy_count=10))
    window = window.add(StepSample(2 * S, 20, 2 * S, busy_ns=3 * S, busy_count=20))
    assert window.busy_s == pytest.approx(0.2)
    assert window.work_s == pytest.approx(0.2)


def test_the_window_forgets_old_readings_but_keeps_one_to_measure_from() -> None:
    window = StepWindow()
    for i in range(100):
        window = window.add(StepSample(i * S, i + 1, i * S), window_s=10)
    assert window.samples[0].at_ns == 88 * S and len(window.samples) == 12
    assert window.step_s == pytest.approx(1.0)


def test_no_time_before_two_beats() -> None:
    window = StepWindow().add(StepSample(S, 1, S))
    assert window.step_s is None and window.work_s is None


def test_the_summary_has_the_median_and_the_slowest_with_ratios() -> None:
    times = [RankTime(r, 0.1) for r in range(7)] + [RankTime(7, 0.3, host="b")]
    steps = summarize(times, top=2)
    assert steps.median_s == pytest.approx(0.1) and steps.ranks == 8
    (first, ratio), (second, _) = steps.slowest
    assert first.rank == 7 and ratio == pytest.approx(3.0) and second.rank == 0


def test_a_rank_is_reported_after_staying_slow_and_only_once() -> None:
    times = [RankTime(0, 0.1), RankTime(1, 0.1), RankTime(2, 0.16)]
    steps = summarize(times)
    watch = StragglerWatch()
    watch, new = watch_stragglers(watch, steps, times, factor=1.5, now_ns=0, hold_s=5)
    assert new == ()
    watch, new = watch_stragglers(watch, steps, times, factor=1.5, now_ns=5 * S, hold_s=5)
    assert [(t.rank, round(r, 2)) for t, r in new] == [(2, 1.6)]
    watch, new = watch_stragglers(watch, steps, times, factor=1.5, now_ns=9 * S, hold_s=5)
    assert new == ()
    # Back under the factor: forgotten, and reported again if it slows down again.
    fast = [RankTime(0, 0.1), RankTime(1, 0.1), RankTime(2, 0.1)]
    watch, _ = watch_stragglers(watch, summarize(fast), fast, factor=1.5, now_ns=10 * S)
    assert watch.reported == frozenset() and not watch.above_since


def test_a_lone_rank_is_never_a_straggler() -> None:
    times = [RankTime(0, 5.0)]
    _, new = watch_stragglers(StragglerWatch(), summarize(times), times, factor=1.5, now_ns=99 * S)
    assert new == ()
