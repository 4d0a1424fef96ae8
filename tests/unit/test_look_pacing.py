"""A watcher's looks back off with the store's delay (``Coordinator.pace``, issue 38)."""

from __future__ import annotations

import pytest

from elastic_run.clock.fake import FakeClock
from elastic_run.rendezvous.dynamic.coordinator import Coordinator
from elastic_run.rendezvous.memory import InMemoryRendezvousBackend, InMemoryStore
from elastic_run.rendezvous.protocol import decisions as proto
from elastic_run.rendezvous.settings import RendezvousSettings

SETTINGS = RendezvousSettings(keep_alive_interval_s=1.0, keep_alive_max_attempt=5)
ROUND = proto.RoundSettings(
    min_nodes=2, max_nodes=8, last_call_timeout_s=30.0, stale_after_s=SETTINGS.stale_after_s
)


def _arrival(index: int, now: float) -> Coordinator:
    backend = InMemoryRendezvousBackend(InMemoryStore(FakeClock()), "job")
    return Coordinator(
        backend,
        f"node-{index}",
        0,
        index,
        SETTINGS,
        ROUND,
        proto.Heartbeats(min_reads=SETTINGS.keep_alive_max_attempt),
        lambda beats: beats,
        now,
    )


def test_a_slow_look_puts_the_next_one_nine_times_its_length_off() -> None:
    watcher = _arrival(5, now=100.0)
    gap = watcher.look_in(100.0)
    assert 0 < gap <= 4.0  # its usual gap: a few ticks
    watcher.pace(3.0, now=103.0)  # the look took 3 s: the store is saturated
    assert watcher.look_in(103.0) == pytest.approx(27.0)
    assert not watcher.is_due(129.0) and watcher.is_due(130.0)


def test_a_quick_look_keeps_the_usual_gap() -> None:
    watcher = _arrival(5, now=100.0)
    due = 100.0 + watcher.look_in(100.0)
    watcher.pace(0.002, now=100.002)  # milliseconds: nothing changes
    assert watcher.look_in(100.002) == pytest.approx(due - 100.002)


def test_the_coordinator_is_not_paced() -> None:
    first = _arrival(0, now=100.0)  # the first arrival coordinates: it steps every tick
    first.pace(10.0, now=110.0)
    assert first.is_due(110.0) and first.look_in(110.0) == 0.0
