"""Stable node ranks: the order of a new round's members, given the ranks they held before.

A node that stays in the job keeps its GROUP_RANK across rounds when the new world allows it.
Each arrival brings a *claim*: the rank it held and the round it held it in (``NodeRecord``'s
``prev_rank`` and ``rank_round``). Only claims of the newest round among the admitted count
(an older claim may name a rank given to someone else since); the others are newcomers.

The rule (``stable_order``), for ``n`` admitted nodes of which ``k`` are survivors (valid
claims ``s_0 < s_1 < ... < s_{k-1}``) and ``m = n - k`` are newcomers:

    survivors keep their relative order, always
    survivor j keeps s_j  iff  s_j - j <= m          (such j form a prefix: s_j - j never falls)
    the other survivors take the ranks right above the last kept one, in order
    newcomers fill the ranks left free, lowest first, in arrival order

A node may ask not to be given one rank (``avoid``: a node suspected after a failure): when the
rule gives it that rank, it trades places with the member of the next rank up (cyclically) that
does not avoid its own; a world of one keeps its only rank.

So a worker failure (every node back, ``n`` unchanged) keeps every rank; a grown world keeps
every survivor's rank and gives newcomers the ranks above the old world; a shrunk world
compacts the freed ranks, moving as few survivors as any order-keeping assignment can (a
survivor j with ``s_j - j > m`` cannot keep its rank: the ``k - 1 - j`` survivors after it
would not fit above it). A freed rank inside a world that did not shrink goes to a newcomer.

Pure: no store, no clock. Without any claim (the first round) the order is arrival order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["NO_CLAIM", "RankClaim", "stable_order"]

RankClaim = tuple[int, int]
"""(round the rank was held in, the rank); ``NO_CLAIM`` when the node held none."""

NO_CLAIM: RankClaim = (-1, -1)


def stable_order(
    admitted: Sequence[int],
    claims: Mapping[int, RankClaim],
    avoid: Mapping[int, int] | None = None,
) -> tuple[int, ...]:
    """Order ``admitted`` (arrival indices, in arrival order) by the stable-rank rule.

    Args:
        admitted: the arrivals of the new round, in arrival order.
        claims: arrival index -> (round, rank) it held before; missing or ``NO_CLAIM``: none.
        avoid: arrival index -> a rank it must not be given (missing or -1: none).

    Returns:
        The same arrival indices in rank order (position = the node's new rank).
    """
    order = _stable(admitted, claims)
    return _avoiding(order, avoid or {}) if avoid else order


def _avoiding(order: tuple[int, ...], avoid: Mapping[int, int]) -> tuple[int, ...]:
    """``order`` with every node given a rank it avoids traded with the next one up that can
    take that rank (a node that avoids nothing, or avoids another rank)."""
    slots = list(order)
    n = len(slots)
    for rank in range(n):
        node = slots[rank]
        if avoid.get(node, -1) != rank:
            continue
        for step in range(1, n):
            other = (rank + step) % n
            if avoid.get(slots[other], -1) != rank:
                slots[rank], slots[other] = slots[other], slots[rank]
                break
    return tuple(slots)


def _stable(admitted: Sequence[int], claims: Mapping[int, RankClaim]) -> tuple[int, ...]:
    n = len(admitted)
    held = {i: claims.get(i, NO_CLAIM) for i in admitted}
    newest = max((r for r, rank in held.values() if rank >= 0), default=-1)
    survivors: list[tuple[int, int]] = []  # (old rank, arrival index), by old rank
    taken: set[int] = set()
    for i in admitted:
        r, rank = held[i]
        if r == newest and rank >= 0 and rank not in taken:
            taken.add(rank)
            survivors.append((rank, i))
    survivors.sort()
    in_survivors = {i for _, i in survivors}
    newcomers = [i for i in admitted if i not in in_survivors]
    m = len(newcomers)
    slots: list[int | None] = [None] * n
    kept = 0
    while kept < len(survivors) and survivors[kept][0] - kept <= m:
        slots[survivors[kept][0]] = survivors[kept][1]
        kept += 1
    nxt = survivors[kept - 1][0] + 1 if kept else 0
    for _, i in survivors[kept:]:
        slots[nxt] = i
        nxt += 1
    fresh = iter(newcomers)
    return tuple(s if s is not None else next(fresh) for s in slots)
