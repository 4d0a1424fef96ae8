"""The straggler rule (``agent/rules/progress/straggler.py``): a reading of the job's step times
is judged once; a rank at or above the factor for the hold time is a new straggler."""

from __future__ import annotations

from dataclasses import replace

from elastic_run.agent.rules.actions import NoteStragglers
from elastic_run.agent.rules.observation import Observation, StepsReading
from elastic_run.agent.rules.progress import straggler
from elastic_run.agent.rules.progress.step_times import (
    HOLD_S,
    RankTime,
    StragglerWatch,
    summarize,
)
from tests.unit.observations import RUNNING

S = 1_000_000_000
TIMES = (RankTime(0, 1.0), RankTime(1, 1.0), RankTime(2, 3.0))


def _obs(read_ns: int, watch: StragglerWatch) -> Observation:
    reading = StepsReading(round=4, times=TIMES, steps=summarize(TIMES), read_ns=read_ns)
    progress = replace(RUNNING.progress, steps=reading, stragglers=watch, straggler_factor=1.5)
    return replace(RUNNING, progress=progress)


def test_a_slow_rank_becomes_a_straggler_after_the_hold() -> None:
    first = straggler.judge(_obs(0, StragglerWatch()), 0)
    assert isinstance(first, NoteStragglers) and first.new == () and first.round == 4
    later = straggler.judge(_obs(int(HOLD_S * S), first.watch), 0)
    assert isinstance(later, NoteStragglers)
    assert [(t.rank, round(r, 2)) for t, r in later.new] == [(2, 3.0)]
    again = straggler.judge(_obs(int(2 * HOLD_S * S), later.watch), 0)
    assert isinstance(again, NoteStragglers) and again.new == ()  # said once


def test_no_reading_nothing_to_judge() -> None:
    assert straggler.judge(RUNNING, 0) is None
