"""The watchdog's pure timer table, driven by a fake clock (plain floats).

The first tests pin arm, re-arm, release and the due split; the last one is a hypothesis state
machine that checks the table against a dict model under random requests, clears and clock
ticks, and that a table never changes once made.
"""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from elastic_run.agent.watchdog import timer_table
from elastic_run.agent.watchdog.timer_table import ArmedTimer, TimerTable
from elastic_run.worker.timer_wire import RELEASE_EXPIRATION, FileTimerRequest


def arm(pid: int, scope: str, at: float, signo: int = 9) -> FileTimerRequest:
    return FileTimerRequest(pid, scope, at, signo)


def release(pid: int, scope: str) -> FileTimerRequest:
    return FileTimerRequest(pid, scope, RELEASE_EXPIRATION, 0)


def test_a_timer_is_due_at_its_expiration_time_not_before() -> None:
    table = TimerTable().apply(arm(10, "step", 100.0))
    assert table.split_due(99.999) == ((), table)
    due, rest = table.split_due(100.0)
    assert due == (ArmedTimer(10, "step", 100.0, 9),)
    assert rest == TimerTable() and len(rest) == 0


def test_release_disarms_the_timer() -> None:
    table = TimerTable().apply(arm(10, "step", 100.0)).apply(release(10, "step"))
    assert table.armed() == ()
    assert table.split_due(now=1e12) == ((), table), "a released timer never comes due"
    assert table.next_expiration() is None


def test_release_touches_only_its_own_pid_and_scope() -> None:
    table = TimerTable().apply(arm(10, "a", 100.0)).apply(arm(10, "b", 50.0))
    table = table.apply(arm(11, "a", 70.0))
    after = table.apply(release(10, "a")).apply(release(12, "a")).apply(release(10, "zzz"))
    assert [(t.pid, t.scope_id) for t in after.armed()] == [(10, "b"), (11, "a")]
    assert after.apply(release(12, "a")) is after, "releasing an unarmed timer changes nothing"


def test_arming_again_moves_the_deadline_and_the_signal() -> None:
    table = TimerTable().apply(arm(10, "step", 100.0, 9)).apply(arm(10, "step", 200.0, 15))
    assert table.armed() == (ArmedTimer(10, "step", 200.0, 15),)
    assert table.split_due(150.0)[0] == ()


def test_due_timers_come_earliest_first_and_the_rest_stay() -> None:
    table = TimerTable()
    for pid, scope, at in [(3, "c", 30.0), (1, "a", 10.0), (2, "b", 10.0), (4, "d", 99.0)]:
        table = table.apply(arm(pid, scope, at))
    due, rest = table.split_due(30.0)
    assert [(t.pid, t.scope_id) for t in due] == [(1, "a"), (2, "b"), (3, "c")]
    assert rest.armed() == (ArmedTimer(4, "d", 99.0, 9),)
    assert rest.next_expiration() == 99.0
    assert len(table) == 4, "split_due leaves the table it was called on as it was"


def test_without_pids_drops_every_timer_of_those_pids() -> None:
    table = TimerTable().apply(arm(1, "a", 10.0)).apply(arm(1, "b", 20.0)).apply(arm(2, "a", 5.0))
    assert table.pids() == {1, 2}
    assert table.without_pids([1]).armed() == (ArmedTimer(2, "a", 5.0, 9),)
    assert table.without_pids([7]) is table


def test_armed_timer_gives_back_its_request() -> None:
    request = arm(10, "step", 100.5, 15)
    [timer] = TimerTable().apply(request).armed()
    assert timer.as_request() == request


def test_the_table_module_is_pure() -> None:
    tree = ast.parse(Path(timer_table.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    }
    assert not imported & {"time", "threading", "os", "psutil", "select", "signal", "subprocess"}


PIDS = st.integers(min_value=1, max_value=4)
SCOPES = st.sampled_from(["a", "b", "c"])


class TableModel(RuleBasedStateMachine):
    """The table against a dict, under random requests, clears and clock ticks."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.table = TimerTable()
        self.model: dict[tuple[int, str], ArmedTimer] = {}
        self.history: list[tuple[TimerTable, tuple[ArmedTimer, ...]]] = []

    def _keep(self, table: TimerTable) -> None:
        self.history.append((self.table, self.table.armed()))
        self.table = table

    @rule(
        pid=PIDS,
        scope=SCOPES,
        after=st.floats(min_value=-5.0, max_value=20.0),
        signo=st.sampled_from([0, 9, 15]),
    )
    def arm_timer(self, pid: int, scope: str, after: float, signo: int) -> None:
        self._keep(self.table.apply(arm(pid, scope, self.now + after, signo)))
        self.model[(pid, scope)] = ArmedTimer(pid, scope, self.now + after, signo)

    @rule(pid=PIDS, scope=SCOPES)
    def release_timer(self, pid: int, scope: str) -> None:
        self._keep(self.table.apply(release(pid, scope)))
        self.model.pop((pid, scope), None)

    @rule(pids=st.sets(PIDS, max_size=2))
    def clear(self, pids: set[int]) -> None:
        self._keep(self.table.without_pids(pids))
        self.model = {k: t for k, t in self.model.items() if t.pid not in pids}

    @rule(step=st.floats(min_value=0.0, max_value=10.0))
    def tick(self, step: float) -> None:
        self.now += step
        due, rest = self.table.split_due(self.now)
        expected = sorted(
            (t for t in self.model.values() if t.expiration_time <= self.now),
            key=lambda t: (t.expiration_time, t.pid, t.scope_id),
        )
        assert list(due) == expected
        self._keep(rest)
        self.model = {k: t for k, t in self.model.items() if t.expiration_time > self.now}

    @invariant()
    def matches_the_model(self) -> None:
        assert set(self.table.armed()) == set(self.model.values())
        assert len(self.table) == len(self.model)
        assert self.table.pids() == {pid for pid, _ in self.model}
        times = [t.expiration_time for t in self.table.armed()]
        assert times == sorted(times)
        assert self.table.next_expiration() == (min(times) if times else None)

    @invariant()
    def old_tables_never_change(self) -> None:
        for table, armed in self.history[-5:]:
            assert table.armed() == armed


TableModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestTableModel = TableModel.TestCase
