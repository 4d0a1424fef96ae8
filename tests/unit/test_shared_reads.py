"""One epoch read shared by a process's nodes of one job (``dynamic/shared_reads.py``)."""

from __future__ import annotations

import uuid

import pytest

from elastic_run.clock.fake import FakeClock
from elastic_run.rendezvous.dynamic.shared_reads import read_shared


class _Counter:
    """The epoch as a store would hold it, and how often it was read."""

    def __init__(self) -> None:
        self.value = 7
        self.reads = 0

    def read(self) -> int:
        self.reads += 1
        return self.value


def _key() -> tuple[str, str, str]:
    return ("c10d", "127.0.0.1:1", f"job-{uuid.uuid4().hex[:8]}")


def test_nodes_of_one_job_take_a_read_younger_than_the_age_and_read_again_after() -> None:
    clock, epoch, key = FakeClock(), _Counter(), _key()
    assert [read_shared(key, epoch.read, 0.5, clock) for _ in range(100)] == [7] * 100
    assert epoch.reads == 1  # a hundred nodes' turns within half an interval: one read
    epoch.value = 8
    clock.advance(0.5)
    assert read_shared(key, epoch.read, 0.5, clock) == 8  # no value older than the age
    assert epoch.reads == 2


def test_another_job_or_store_and_an_age_of_zero_read_for_themselves() -> None:
    clock, epoch, key = FakeClock(), _Counter(), _key()
    read_shared(key, epoch.read, 0.5, clock)
    read_shared((key[0], "127.0.0.1:2", key[2]), epoch.read, 0.5, clock)
    read_shared((key[0], key[1], key[2] + "x"), epoch.read, 0.5, clock)
    read_shared(key, epoch.read, 0.0, clock)
    assert epoch.reads == 4


def test_a_failed_read_is_not_shared() -> None:
    clock, key = FakeClock(), _key()

    def fails() -> int:
        raise ValueError("not a counter")

    with pytest.raises(ValueError, match="not a counter"):
        read_shared(key, fails, 0.5, clock)
    epoch = _Counter()
    assert read_shared(key, epoch.read, 0.5, clock) == 7 and epoch.reads == 1
