"""The hang verdict's pure rule (``agent/progress/hang.py``): parsing, folding beats, the learned
timeout, the verdict, who is stopped, and the no-progress streak. Times are nanoseconds
passed in; nothing sleeps."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastic_run.agent.rules.progress import beats as hang

S = 1_000_000_000


def _beats(gaps_s: list[float], start_s: float = 100.0) -> hang.BeatHistory:
    """A history of one beat at ``start_s``, then one after each gap (read at every beat)."""
    history = hang.observe(hang.BeatHistory(), 1, 0, int(start_s * S))
    now = start_s
    for n, gap in enumerate(gaps_s, start=2):
        now += gap
        history = hang.observe(history, n, n - 1, int(now * S), int(gap * S))
    return history


# -- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "mode", "seconds"),
    [
        ("auto", "auto", hang.DEFAULT_FLOOR_S),
        ("AUTO", "auto", hang.DEFAULT_FLOOR_S),
        ("auto:7.5", "auto", 7.5),
        ("5", "fixed", 5.0),
        ("0.25", "fixed", 0.25),
        ("off", "off", None),
        ("0", "off", None),
    ],
)
def test_hang_timeout_values(text: str, mode: str, seconds: float | None) -> None:
    rule = hang.parse_hang_timeout(text)
    assert rule.mode == mode
    if seconds is not None:
        assert rule.timeout_s == seconds


@pytest.mark.parametrize("text", ["", "soon", "-1", "inf", "nan", "auto:", "auto:-3", "5s"])
def test_bad_hang_timeouts_are_one_clear_error(text: str) -> None:
    with pytest.raises(ValueError, match="auto|positive"):
        hang.parse_hang_timeout(text)


def test_the_rule_describes_itself() -> None:
    assert hang.HangRule().describe() == "auto (floor 30 s)"
    assert hang.parse_hang_timeout("5").describe() == "5 s"
    assert hang.parse_hang_timeout("off").describe() == "off"


# -- folding beats ---------------------------------------------------------------------------


def test_one_beat_per_reading_records_each_gap_exactly() -> None:
    history = _beats([0.5, 0.5, 2.0])
    assert history.beats == 4 and history.gaps_seen == 3
    assert history.gaps_s == pytest.approx((0.5, 0.5, 2.0))
    assert history.longest_s == pytest.approx(2.0)


def test_several_beats_between_readings_keep_the_long_first_gap() -> None:
    history = hang.observe(hang.BeatHistory(), 1, 0, 10 * S)
    # 3 beats since: the first after a 9.8 s pause, then two 0.1 s steps (the last measured).
    history = hang.observe(history, 4, 3, 20 * S, int(0.1 * S))
    assert history.gaps_seen == 3
    assert history.longest_s == pytest.approx(9.8)
    assert history.gaps_s[-1] == pytest.approx(0.1)


def test_nothing_new_changes_nothing() -> None:
    history = _beats([1.0])
    assert hang.observe(history, history.beats, 5, 999 * S) is history


# -- the timeout -----------------------------------------------------------------------------


def test_fixed_is_fixed_and_off_is_never() -> None:
    history = _beats([0.1] * 10)
    assert hang.timeout_s(history, hang.parse_hang_timeout("5")) == 5.0
    assert hang.timeout_s(history, hang.parse_hang_timeout("off")) is None


def test_a_worker_that_never_beat_has_no_timeout_to_show() -> None:
    # It is never judged (see judge): a timeout shown for it would be a number nothing uses.
    for text in ("auto", "auto:5", "5"):
        assert hang.timeout_s(hang.BeatHistory(), hang.parse_hang_timeout(text)) is None
    assert hang.timeout_s(_beats([]), hang.parse_hang_timeout("5")) == 5.0  # one beat: judged


def test_auto_during_warm_up_allows_the_long_first_steps() -> None:
    rule = hang.HangRule()
    assert hang.timeout_s(_beats([]), rule) == rule.warmup_allowance_s
    assert hang.timeout_s(_beats([0.1] * (rule.warmup_gaps - 1)), rule) == 600.0


def test_auto_after_warm_up_is_the_floor_for_fast_steps() -> None:
    assert hang.timeout_s(_beats([0.1] * 50), hang.HangRule()) == hang.DEFAULT_FLOOR_S


def test_auto_learns_from_slow_steps_and_long_gaps_seen() -> None:
    rule = hang.HangRule(timeout_s=1.0)
    assert hang.timeout_s(_beats([2.0] * 50), rule) == pytest.approx(10.0)  # 5 x p99
    # A checkpoint every so often: twice the longest gap seen covers the next one.
    with_ckpt = _beats([0.1] * 200 + [30.0] + [0.1] * 100)
    assert hang.timeout_s(with_ckpt, rule) == pytest.approx(60.0)


def test_a_first_step_twenty_times_longer_is_no_hang() -> None:
    rule = hang.HangRule(timeout_s=1.0)
    history = _beats([4.0] + [0.2] * 30)
    assert hang.judge(history, rule, history.last_beat_ns + 4 * S) is None
    assert hang.timeout_s(history, rule) >= 8.0  # at least twice that first step


# -- the verdict -----------------------------------------------------------------------------


def test_silence_past_the_timeout_is_a_verdict() -> None:
    rule = hang.parse_hang_timeout("5")
    history = _beats([0.1] * 3)
    assert hang.judge(history, rule, history.last_beat_ns + 5 * S) is None
    silence = hang.judge(history, rule, history.last_beat_ns + 6 * S)
    assert silence == hang.Silence(6.0, 5.0, learned=False)


def test_a_worker_that_never_beat_is_never_hung() -> None:
    for text in ("auto", "1"):
        assert hang.judge(hang.BeatHistory(), hang.parse_hang_timeout(text), 10**15) is None


def test_an_armed_timer_leaves_the_judgement_to_the_watchdog() -> None:
    history = _beats([0.1] * 3)
    rule = hang.parse_hang_timeout("1")
    assert hang.judge(history, rule, history.last_beat_ns + 60 * S, timer_armed=True) is None


def test_storage_io_extends_auto_up_to_its_allowance() -> None:
    rule = hang.HangRule(timeout_s=5.0, io_allowance_s=100.0)
    history = _beats([0.1] * 30)
    late = history.last_beat_ns + 50 * S
    assert hang.judge(history, rule, late, io_active=True) is None
    assert hang.judge(history, rule, late, io_active=False) is not None
    assert hang.judge(history, rule, history.last_beat_ns + 101 * S, io_active=True) is not None
    # An explicit timeout is explicit.
    fixed = hang.parse_hang_timeout("5")
    assert hang.judge(history, fixed, late, io_active=True) is not None


# A shared, loaded machine: generation may be slow; no timing is asserted.
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.floats(0.001, 100.0), min_size=1, max_size=60), st.floats(0.0, 1000.0))
def test_auto_never_judges_within_twice_the_longest_gap(gaps: list[float], extra: float) -> None:
    rule = hang.HangRule(timeout_s=0.5)
    history = _beats(gaps)
    silent_s = min(2 * history.longest_s, extra)
    assert hang.judge(history, rule, history.last_beat_ns + int(silent_s * S)) is None


# -- who is stopped --------------------------------------------------------------------------


def test_a_worker_stuck_outside_a_collective_is_stopped_at_once() -> None:
    assert hang.hung_now({0: True, 1: False}, since_ns=0, now_ns=1, grace_s=10) == (1,)
    # Unknown stacks are no evidence: they wait for the grace, as collective waiters do.
    assert hang.hung_now({0: None}, since_ns=0, now_ns=1, grace_s=10) == ()
    assert hang.hung_now({0: None}, since_ns=0, now_ns=10 * S, grace_s=10) == (0,)
    assert hang.hung_now({0: None, 1: False}, since_ns=0, now_ns=1, grace_s=10) == (1,)


def test_workers_all_waiting_in_a_collective_get_a_grace() -> None:
    waiting = {0: True, 1: True}
    assert hang.hung_now(waiting, since_ns=0, now_ns=9 * S, grace_s=10) == ()
    assert hang.hung_now(waiting, since_ns=0, now_ns=10 * S, grace_s=10) == (0, 1)


def test_the_grace_is_bounded() -> None:
    rule = hang.HangRule()
    assert rule.collective_grace_s(4.0) == 5.0
    assert rule.collective_grace_s(40.0) == 10.0
    assert rule.collective_grace_s(4000.0) == 60.0


# -- no progress (--max-no-progress-restarts) ------------------------------------------------


def _count(*attempts: tuple[bool, int]) -> hang.NoProgressCount:
    """Count attempts 0, 1, ... given as (failed, reached)."""
    count = hang.NoProgressCount()
    for attempt, (failed, reached) in enumerate(attempts):
        count = hang.count_attempt(count, attempt=attempt, failed=failed, reached=reached)
    return count


def test_a_job_that_hangs_at_the_same_step_every_time_makes_no_progress() -> None:
    # Each attempt beats steps 0-9 (10 beats) and hangs in step 10.
    assert _count((True, 10)) == hang.NoProgressCount(streak=0, best_step=10)
    assert _count((True, 10), (True, 10)).streak == 1
    assert _count((True, 10), (True, 10), (True, 10)).streak == 2


def test_an_attempt_that_gets_further_is_progress_and_ends_the_streak() -> None:
    assert _count((True, 10), (True, 10), (True, 11)) == hang.NoProgressCount(0, 11)
    assert _count((True, 10), (True, 11), (True, 12), (True, 13)).streak == 0


def test_getting_less_far_than_the_best_attempt_is_no_progress() -> None:
    # A resumed attempt that names its global step: best 500, then 300 and 499.
    assert _count((True, 500), (True, 300), (True, 499)) == hang.NoProgressCount(2, 500)


def test_the_streak_counts_failed_attempts_after_restarts_without_a_beat() -> None:
    count = _count((True, -1))
    assert count.streak == 0  # the first attempt follows no restart
    count = _count((True, -1), (True, -1), (False, -1), (True, -1))  # the third: a rejoin
    assert count.streak == 2
    assert hang.count_attempt(count, attempt=4, failed=True, reached=0).streak == 0


def test_a_rejoin_that_got_further_resets_the_streak_and_one_that_did_not_keeps_it() -> None:
    count = _count((True, 5), (True, 5))
    assert count.streak == 1
    assert hang.count_attempt(count, attempt=2, failed=False, reached=5) == count
    assert hang.count_attempt(count, attempt=2, failed=False, reached=6).streak == 0


@given(
    st.lists(st.tuples(st.booleans(), st.integers(-1, 50)), min_size=1, max_size=12),
)
def test_the_streak_is_the_failed_attempts_since_the_last_new_best(
    attempts: list[tuple[bool, int]],
) -> None:
    count = _count(*attempts)
    best = max(reached for _, reached in attempts)
    assert count.best_step == best
    first_new_best = next(
        (n for n, (_, reached) in enumerate(attempts) if reached == best and best > -1), None
    )
    since = 0 if first_new_best is None else first_new_best + 1
    expected = sum(1 for n, (failed, _) in enumerate(attempts) if n >= since and failed and n > 0)
    assert count.streak == expected
