"""One read of a job-wide key shared by a process's nodes of one job (``dynamic/shared_reads.py``)."""

from __future__ import annotations

import threading
import uuid

import pytest

from elastic_run.clock.fake import FakeClock
from elastic_run.rendezvous.dynamic import shared_reads
from elastic_run.rendezvous.dynamic.shared_reads import read_shared
from tests.helpers import wait_until


class _Counter:
    """The epoch as a store would hold it, and how often it was read."""

    def __init__(self) -> None:
        self.value = 7
        self.reads = 0

    def read(self) -> int:
        self.reads += 1
        return self.value


def _key() -> tuple[str, str, str, str]:
    return ("c10d", "127.0.0.1:1", f"job-{uuid.uuid4().hex[:8]}", "epoch")


def test_nodes_of_one_job_take_a_read_younger_than_the_age_and_read_again_after() -> None:
    clock, epoch, key = FakeClock(), _Counter(), _key()
    assert [read_shared(key, epoch.read, 0.5, clock) for _ in range(100)] == [7] * 100
    assert epoch.reads == 1  # a hundred nodes' turns within half an interval: one read
    epoch.value = 8
    clock.advance(0.5)
    assert read_shared(key, epoch.read, 0.5, clock) == 8  # no value older than the age
    assert epoch.reads == 2


def test_another_job_store_or_key_and_an_age_of_zero_read_for_themselves() -> None:
    clock, epoch, key = FakeClock(), _Counter(), _key()
    read_shared(key, epoch.read, 0.5, clock)
    read_shared((key[0], "127.0.0.1:2", key[2], key[3]), epoch.read, 0.5, clock)
    read_shared((key[0], key[1], key[2] + "x", key[3]), epoch.read, 0.5, clock)
    read_shared((key[0], key[1], key[2], "closed"), epoch.read, 0.5, clock)
    read_shared(key, epoch.read, 0.0, clock)
    assert epoch.reads == 5


def test_a_failed_read_is_not_shared() -> None:
    clock, key = FakeClock(), _key()

    def fails() -> int:
        raise ValueError("not a counter")

    with pytest.raises(ValueError, match="not a counter"):
        read_shared(key, fails, 0.5, clock)
    epoch = _Counter()
    assert read_shared(key, epoch.read, 0.5, clock) == 7 and epoch.reads == 1


def test_nodes_that_look_while_a_read_is_under_way_take_it_instead_of_reading() -> None:
    # A slow store: one read under way, and every node whose look comes meanwhile waits for it.
    clock, key, reads = FakeClock(), _key(), []
    release = threading.Event()

    def slow_read() -> int:
        reads.append(1)
        release.wait(30)
        return 9

    values: list[int] = []
    first = threading.Thread(target=lambda: values.append(read_shared(key, slow_read, 0.5, clock)))
    first.start()
    wait_until(lambda: len(reads) == 1, 10, message="the first read under way")
    others = [
        threading.Thread(target=lambda: values.append(read_shared(key, slow_read, 0.5, clock)))
        for _ in range(20)
    ]
    for t in others:
        t.start()
    clock.advance(5.0)  # the store is slow: the read's start is long past the age
    release.set()
    for t in [first, *others]:
        t.join(30)
    assert values == [9] * 21
    assert len(reads) == 1


def test_nodes_that_waited_for_a_failed_read_read_for_themselves() -> None:
    clock, key = FakeClock(), _key()
    started, release = threading.Event(), threading.Event()

    def fails() -> int:
        started.set()
        release.wait(30)
        raise ValueError("the store failed")

    errors: list[BaseException] = []

    def first() -> None:
        try:
            read_shared(key, fails, 0.5, clock)
        except ValueError as exc:
            errors.append(exc)

    t = threading.Thread(target=first)
    t.start()
    assert started.wait(10)
    epoch, got = _Counter(), []
    waiter = threading.Thread(target=lambda: got.append(read_shared(key, epoch.read, 0.5, clock)))
    waiter.start()
    flight = shared_reads._FLIGHTS[key]  # the first read's, still under way
    wait_until(lambda: flight.done._cond._waiters, 10, message="the waiter on the read")  # type: ignore[attr-defined]
    release.set()
    t.join(30)
    waiter.join(30)
    assert [str(e) for e in errors] == ["the store failed"]
    assert got == [7]
    assert epoch.reads == 1  # it waited for the failed read, then read for itself
    assert key not in shared_reads._FLIGHTS


def test_an_interrupted_read_lets_its_waiters_go() -> None:
    clock, key = FakeClock(), _key()

    def interrupted() -> int:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        read_shared(key, interrupted, 0.5, clock)
    assert key not in shared_reads._FLIGHTS  # the next node reads, it does not wait forever
    assert read_shared(key, _Counter().read, 0.5, clock) == 7
