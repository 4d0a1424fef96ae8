"""The stable-rank rule of ``stable_ranks.py`` and its use by ``protocol.build_seal``.

Examples pin the cases a user meets (a worker failure, a node lost, a newcomer); hypothesis
checks the promises on random worlds: a permutation of the admitted, survivors in their old
relative order, every survivor keeping its rank when the world allows, newcomers in arrival
order, and no order-keeping assignment moving fewer survivors (exhaustive search on small
worlds).
"""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from elastic_run.rendezvous.protocol import decisions as proto
from elastic_run.rendezvous.protocol.records import NodeRecord
from elastic_run.rendezvous.protocol.stable_ranks import NO_CLAIM, RankClaim, stable_order


def _claims(old_ranks: dict[int, int], r: int = 5) -> dict[int, RankClaim]:
    return {i: (r, rank) for i, rank in old_ranks.items()}


def _new_ranks(order: tuple[int, ...]) -> dict[int, int]:
    return {i: rank for rank, i in enumerate(order)}


# -- examples --------------------------------------------------------------------------------


def test_without_claims_the_order_is_arrival_order() -> None:
    assert stable_order([0, 1, 2], {}) == (0, 1, 2)
    assert stable_order([3, 5, 9], {3: NO_CLAIM}) == (3, 5, 9)


def test_every_node_back_after_a_worker_failure_keeps_its_rank() -> None:
    # Nodes arrive in another order than their ranks: arrival 0 held rank 2, and so on.
    order = stable_order([0, 1, 2], _claims({0: 2, 1: 0, 2: 1}))
    assert _new_ranks(order) == {0: 2, 1: 0, 2: 1}


def test_a_lost_middle_node_compacts_the_ranks_above_it() -> None:
    # Ranks 0, 1, 2; rank 1 is gone: rank 0 stays, rank 2 becomes 1.
    assert _new_ranks(stable_order([0, 1], _claims({0: 2, 1: 0}))) == {1: 0, 0: 1}


def test_a_lost_last_node_moves_no_one() -> None:
    assert _new_ranks(stable_order([0, 1], _claims({0: 1, 1: 0}))) == {1: 0, 0: 1}


def test_a_lost_first_node_shifts_every_rank_down_in_order() -> None:
    assert _new_ranks(stable_order([0, 1], _claims({0: 2, 1: 1}))) == {1: 0, 0: 1}


def test_a_newcomer_takes_the_rank_above_the_old_world() -> None:
    order = stable_order([0, 1, 2], {0: NO_CLAIM, 1: (4, 1), 2: (4, 0)})
    assert _new_ranks(order) == {2: 0, 1: 1, 0: 2}


def test_a_newcomer_takes_a_freed_rank_when_the_world_did_not_shrink() -> None:
    # Old ranks 0, 1, 2; rank 1 left and a newcomer came: survivors keep 0 and 2.
    order = stable_order([0, 1, 2], {0: (4, 2), 1: NO_CLAIM, 2: (4, 0)})
    assert _new_ranks(order) == {2: 0, 1: 1, 0: 2}


def test_claims_of_an_older_round_count_as_newcomers() -> None:
    # Arrival 2 held rank 0 two rounds ago (it was judged gone since); rank 0 is arrival 0's now.
    order = stable_order([0, 1, 2], {0: (7, 0), 1: (7, 1), 2: (5, 0)})
    assert _new_ranks(order) == {0: 0, 1: 1, 2: 2}


def test_two_claims_of_one_rank_admit_the_first_arrival() -> None:
    order = stable_order([0, 1], {0: (3, 0), 1: (3, 0)})
    assert order == (0, 1)


def test_build_seal_orders_the_members_by_their_claims() -> None:
    def rec(i: int, rank: int) -> NodeRecord:
        return NodeRecord(f"n{i}", "addr", "host", 1, 2, prev_rank=rank, rank_round=3)

    records = {0: rec(0, 1), 1: rec(1, 2), 2: rec(2, 0)}
    seal = proto.build_seal(4, [0, 1, 2], records, "reform", 3, 2)
    assert seal is not None
    assert seal.admitted_indices() == [2, 0, 1]
    assert proto.assignment_for(seal, 2).rank == 0  # type: ignore[union-attr]
    assert proto.assignment_for(seal, 1).rank == 2  # type: ignore[union-attr]
    assert proto.assignment_for(seal, 1).rank_offset == 4  # type: ignore[union-attr]
    assert proto.assignment_for(seal, 1).successor_index == 2  # type: ignore[union-attr]


# -- properties ------------------------------------------------------------------------------


@st.composite
def worlds(draw: st.DrawFn, max_old: int = 8) -> tuple[list[int], dict[int, RankClaim], int]:
    """(admitted in arrival order, claims, old world size): some survivors of an old world of
    ``old`` ranks, some newcomers (some carrying a stale claim), shuffled into arrival order."""
    old = draw(st.integers(1, max_old))
    survivors = draw(st.lists(st.sampled_from(range(old)), unique=True, max_size=old))
    newcomers = draw(st.integers(0, 4))
    stale = draw(st.lists(st.integers(0, old + 3), min_size=newcomers, max_size=newcomers))
    stale_mask = draw(st.lists(st.booleans(), min_size=newcomers, max_size=newcomers))
    if not survivors and not newcomers:
        newcomers, stale, stale_mask = 1, [0], [False]
    claims_list: list[RankClaim] = [(9, rank) for rank in survivors]
    claims_list += [(4, s) if m else NO_CLAIM for s, m in zip(stale, stale_mask, strict=True)]
    perm = draw(st.permutations(range(len(claims_list))))
    gaps = draw(st.lists(st.integers(0, 2), min_size=len(perm), max_size=len(perm)))
    admitted, claims, at = [], {}, 0
    for p, gap in zip(perm, gaps, strict=True):
        at += gap
        admitted.append(at)
        claims[at] = claims_list[p]
        at += 1
    return admitted, claims, old


def _survivors(admitted: list[int], claims: dict[int, RankClaim]) -> dict[int, int]:
    """The arrivals whose claim counts (newest round; a rank claimed twice: first arrival)."""
    newest = max((r for r, rank in claims.values() if rank >= 0), default=-1)
    found: dict[int, int] = {}
    for i in admitted:
        r, rank = claims[i]
        if r == newest and rank >= 0 and rank not in found.values():
            found[i] = rank
    return found


@given(worlds())
def test_the_order_is_a_permutation_keeping_survivors_and_newcomers_in_order(
    world: tuple[list[int], dict[int, RankClaim], int],
) -> None:
    admitted, claims, _ = world
    order = stable_order(admitted, claims)
    assert sorted(order) == sorted(admitted)
    new = _new_ranks(order)
    surv = _survivors(admitted, claims)
    by_old = sorted(surv, key=lambda i: surv[i])
    assert [new[i] for i in by_old] == sorted(new[i] for i in by_old)
    fresh = [i for i in admitted if i not in surv]
    assert [new[i] for i in fresh] == sorted(new[i] for i in fresh)


@given(worlds())
def test_survivors_keep_their_ranks_when_the_world_allows(
    world: tuple[list[int], dict[int, RankClaim], int],
) -> None:
    admitted, claims, _ = world
    surv = _survivors(admitted, claims)
    if surv and max(surv.values()) < len(admitted):
        new = _new_ranks(stable_order(admitted, claims))
        assert all(new[i] == rank for i, rank in surv.items())


@given(worlds())
def test_newcomers_take_the_ranks_above_an_unbroken_old_world(
    world: tuple[list[int], dict[int, RankClaim], int],
) -> None:
    admitted, claims, _ = world
    surv = _survivors(admitted, claims)
    if sorted(surv.values()) == list(range(len(surv))):
        new = _new_ranks(stable_order(admitted, claims))
        fresh = [i for i in admitted if i not in surv]
        assert sorted(new[i] for i in fresh) == list(range(len(surv), len(admitted)))


@given(worlds(max_old=6))
def test_no_order_keeping_assignment_moves_fewer_survivors(
    world: tuple[list[int], dict[int, RankClaim], int],
) -> None:
    admitted, claims, _ = world
    surv = _survivors(admitted, claims)
    by_old = sorted(surv, key=lambda i: surv[i])
    new = _new_ranks(stable_order(admitted, claims))
    moved = sum(new[i] != surv[i] for i in surv)
    # Every order-keeping choice of ranks for the survivors (the newcomers take the rest).
    best = min(
        sum(rank != surv[i] for rank, i in zip(ranks, by_old, strict=True))
        for ranks in itertools.combinations(range(len(admitted)), len(by_old))
    )
    assert moved == best


def test_a_node_that_avoids_its_rank_trades_with_the_next_one_up() -> None:
    # Arrivals 0..2 held ranks 0..2; arrival 1 (a suspect) avoids rank 1.
    claims = {0: (4, 0), 1: (4, 1), 2: (4, 2)}
    assert stable_order([0, 1, 2], claims, {1: 1}) == (0, 2, 1)
    # The top rank trades with rank 0 (cyclically); a node avoiding another rank stays put.
    assert stable_order([0, 1, 2], claims, {2: 2}) == (2, 1, 0)
    assert stable_order([0, 1, 2], claims, {1: 0}) == (0, 1, 2)


def test_two_nodes_avoiding_their_ranks_never_trade_into_them() -> None:
    claims = {0: (4, 0), 1: (4, 1)}
    order = stable_order([0, 1], claims, {0: 0, 1: 1})
    assert order == (1, 0)
    assert stable_order([5], {5: (4, 0)}, {5: 0}) == (5,)  # a world of one keeps its rank
