"""Who exchanges with whom in the link check: a few rounds of a round-robin tournament.

In each round the nodes are paired (the circle method: with an odd count, one node sits the
round out), so a node's time in a round depends on one link only, its partner's and its own.
``rounds`` rounds give each node ``rounds`` distinct partners (one fewer when it sits one out):
with three rounds every node of three or more meets at least two partners, so a node whose own
link is slow is slow with every partner while each of its partners is fast with someone else.
That is what lets the check blame a node; an all-reduce alone is bounded by the slowest link and
blames nobody. Two nodes share their one link: they measure it, but cannot tell which end of it
is slow.

Pure: integers in, pairs out.
"""

from __future__ import annotations

__all__ = ["DEFAULT_ROUNDS", "pairings", "partner_in"]

DEFAULT_ROUNDS = 3


def pairings(
    world_size: int, rounds: int = DEFAULT_ROUNDS
) -> tuple[tuple[tuple[int, int], ...], ...]:
    """The pairs of each round, the first ``rounds`` rounds of a round-robin tournament.

    Args:
        world_size: the number of nodes (ranks 0..world_size-1).
        rounds: how many rounds at most (a tournament of n nodes has n - 1 rounds, n if odd).

    Returns:
        One tuple of ``(a, b)`` pairs (``a < b``) per round; empty for fewer than 2 nodes.

    Raises:
        ValueError: ``world_size`` is negative or ``rounds`` below 1.
    """
    if world_size < 0 or rounds < 1:
        raise ValueError(
            f"pairings need world_size >= 0 and rounds >= 1, got {world_size}, {rounds}"
        )
    if world_size < 2:
        return ()
    slots = world_size + (world_size % 2)  # an odd count gets a bye slot
    circle = slots - 1
    out: list[tuple[tuple[int, int], ...]] = []
    for r in range(min(rounds, circle)):
        pairs = [(r, slots - 1)]
        for i in range(1, slots // 2):
            pairs.append(((r + i) % circle, (r - i) % circle))
        kept = tuple((min(a, b), max(a, b)) for a, b in pairs if a < world_size and b < world_size)
        out.append(tuple(sorted(kept)))
    return tuple(out)


def partner_in(pairs: tuple[tuple[int, int], ...], rank: int) -> int | None:
    """``rank``'s partner in one round's pairs, or None when it sits the round out."""
    for a, b in pairs:
        if a == rank:
            return b
        if b == rank:
            return a
    return None
