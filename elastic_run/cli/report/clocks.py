"""Putting every node's clock on one: by the rounds they completed together. Pure.

Every member of a round completes it within the rendezvous's own latency (milliseconds to a
second): ``rendezvous.complete`` of round r is one instant seen on each member's clock. The
reference is the node that completed the most rounds (the first in order on a tie); a node
that shares rounds with the nodes aligned so far gets the offset that puts its completions on
theirs (the median of the differences), and its *residual*, the largest difference left, says
how well that holds. A node that shares no round with any aligned node keeps its own clock and
is marked unaligned: its times are never compared with the others' as if they were one clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from elastic_run.cli.report.model import ClockFit

__all__ = ["align_clocks"]


def align_clocks(completions: Sequence[Mapping[int, float]]) -> tuple[tuple[ClockFit, ...], int]:
    """Each node's clock fit, from when it completed each round.

    Args:
        completions: per node, round number -> when it completed it (its clock).

    Returns:
        ``(fits, reference)``: one fit per node, and the reference node's index (-1 when no node
        completed a round: every node keeps its own clock, unaligned, unless there is only one).
    """
    n = len(completions)
    if n == 0:
        return (), -1
    counts = [len(c) for c in completions]
    if max(counts) == 0:
        alone = n == 1
        return tuple(ClockFit(aligned=alone, reference=alone) for _ in completions), (
            0 if alone else -1
        )
    reference = counts.index(max(counts))
    fits: list[ClockFit | None] = [None] * n
    fits[reference] = ClockFit(shared=counts[reference], reference=True)
    round_at: dict[int, float] = dict(completions[reference])
    waiting = [i for i in range(n) if i != reference]
    progress = True
    while waiting and progress:
        progress = False
        still: list[int] = []
        for i in waiting:
            shared = [r for r in completions[i] if r in round_at]
            if not shared:
                still.append(i)
                continue
            gaps = [round_at[r] - completions[i][r] for r in shared]
            offset = statistics.median(gaps)
            residual = max(abs(g - offset) for g in gaps)
            fits[i] = ClockFit(offset_s=offset, residual_s=residual, shared=len(shared))
            for r, at in completions[i].items():
                round_at.setdefault(r, at + offset)
            progress = True
        waiting = still
    for i in waiting:
        fits[i] = ClockFit(aligned=False)
    return tuple(f if f is not None else ClockFit(aligned=False) for f in fits), reference
