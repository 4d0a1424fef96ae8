"""A seal's rank lookups work on its ranges (O(ranges)) and agree with the expanded list."""

from __future__ import annotations

import pytest

from elastic_run.rendezvous.protocol.records import SealRecord


def _seal(admitted: tuple[tuple[int, int], ...]) -> SealRecord:
    n = sum(hi - lo + 1 for lo, hi in admitted)
    return SealRecord(0, 100, admitted, n, "max", ((n, 1, "default"),))


@pytest.mark.parametrize(
    "admitted",
    [((0, 4095),), ((0, 2), (5, 5), (7, 9)), ((9, 9), (0, 3), (5, 6)), ((3, 3),)],
)
def test_rank_lookups_agree_with_the_indices(admitted: tuple[tuple[int, int], ...]) -> None:
    seal = _seal(admitted)
    indices = seal.admitted_indices()
    assert seal.admitted_count() == len(indices)
    for rank, index in enumerate(indices):
        assert seal.rank_of(index) == rank
        assert seal.index_at(rank) == index
    for index in set(range(12)) - set(indices):
        assert seal.rank_of(index) is None
    with pytest.raises(IndexError):
        seal.index_at(len(indices))
