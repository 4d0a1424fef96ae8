"""The job's hang picture: every node's stuck ranks, merged into one view. Pure.

When its workers go silent past their hang timeout, a node takes their stacks
(:mod:`elastic_run.agent.progress.hang_watch`) and publishes a small summary in its progress
record, under ``stuck`` (:func:`stuck_record`): a version, the round, and per silent local rank
its global rank, where its main thread is, whether that is inside a collective, how long it has
been silent and whether it was judged hung. Its size is bounded by the node's local world size.

:func:`merge` folds the summaries of every node of the newest round into a :class:`JobHang`,
whose :meth:`JobHang.sentence` reads ``rank 5 (node-b) stuck 42 s in __next__ at data.py:88;
7 ranks wait in all_reduce``: the ranks stuck outside a collective (the ones the others wait
for) first, then the waiting ranks counted by what they wait in. ``elastic-run status`` shows it,
and so does the failure summary of the node that judged the hang.

No clock, store or I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["STUCK_VERSION", "JobHang", "StuckRank", "merge", "parse_stuck", "stuck_record"]

STUCK_VERSION = 1
_NAMED = 3  # culprits named one by one; beyond that, counted


@dataclass(frozen=True)
class StuckRank:
    """One silent rank as its node saw it.

    Attributes:
        rank: the global rank.
        where: where its main thread is (``Event.wait at train.py:27``; ``""``: no stacks).
        function: the innermost frame's function (``all_reduce``).
        in_collective: whether it waits inside a collective (None: no stacks).
        stuck_s: how long it has been silent, seconds.
        hung: whether its node judged it hung.
        host: its node's host (filled in from the node's record).
    """

    rank: int
    where: str
    function: str
    in_collective: bool | None
    stuck_s: float
    hung: bool = False
    host: str = ""


def stuck_record(round_: int, ranks: Sequence[StuckRank]) -> dict[str, Any]:
    """A node's ``stuck`` summary as its progress record carries it (JSON, versioned)."""
    return {
        "v": STUCK_VERSION,
        "round": round_,
        "ranks": [
            {
                "rank": r.rank,
                "where": r.where,
                "function": r.function,
                "in_collective": r.in_collective,
                "stuck_s": round(r.stuck_s, 1),
                "hung": r.hung,
            }
            for r in ranks
        ],
    }


def parse_stuck(record: Mapping[str, Any]) -> tuple[int, tuple[StuckRank, ...]] | None:
    """A node's progress record's ``stuck`` summary: (round, ranks); None when it has none, or
    one of another version or shape (a record is never trusted to be well formed)."""
    stuck = record.get("stuck")
    if not isinstance(stuck, Mapping) or stuck.get("v") != STUCK_VERSION:
        return None
    round_ = stuck.get("round")
    if not isinstance(round_, int):
        return None
    host = str(record.get("host") or "")
    ranks = []
    for entry in stuck.get("ranks") or ():
        if not isinstance(entry, Mapping):
            continue
        rank, stuck_s = entry.get("rank"), entry.get("stuck_s")
        collective = entry.get("in_collective")
        if not isinstance(rank, int) or not isinstance(stuck_s, (int, float)):
            continue
        ranks.append(
            StuckRank(
                rank=rank,
                where=str(entry.get("where") or ""),
                function=str(entry.get("function") or ""),
                in_collective=collective if isinstance(collective, bool) else None,
                stuck_s=float(stuck_s),
                hung=entry.get("hung") is True,
                host=host,
            )
        )
    return round_, tuple(ranks)


def _ranks(count: int) -> str:
    return f"{count} rank waits" if count == 1 else f"{count} ranks wait"


@dataclass(frozen=True)
class JobHang:
    """The job's silent ranks of one round, merged from every node's summary.

    Attributes:
        round: the round.
        stuck: ranks outside a collective (what the others wait for), longest stuck first.
        waiting: ranks waiting inside a collective, by rank.
        unknown: silent ranks whose stacks could not be read, by rank.
    """

    round: int
    stuck: tuple[StuckRank, ...]
    waiting: tuple[StuckRank, ...]
    unknown: tuple[StuckRank, ...]

    def sentence(self) -> str:
        """``rank 5 (node-b) stuck 42 s in __next__ at data.py:88; 7 ranks wait in all_reduce``."""
        parts = [
            f"rank {r.rank} ({r.host}) stuck {r.stuck_s:.0f} s in {r.where or r.function}"
            for r in self.stuck[:_NAMED]
        ]
        if len(self.stuck) > _NAMED:
            parts.append(f"{len(self.stuck) - _NAMED} more ranks stuck outside a collective")
        by_function: dict[str, int] = {}
        for r in self.waiting:
            by_function[r.function] = by_function.get(r.function, 0) + 1
        for function, count in sorted(by_function.items(), key=lambda kv: (-kv[1], kv[0])):
            parts.append(f"{_ranks(count)} in {function or 'a collective'}")
        if self.unknown:
            parts.append(f"{len(self.unknown)} silent without stacks")
        return "; ".join(parts)

    def as_json(self) -> dict[str, Any]:
        """The picture as ``status --json`` shows it (``hang``)."""

        def row(r: StuckRank) -> dict[str, Any]:
            return {
                "rank": r.rank,
                "host": r.host,
                "where": r.where,
                "function": r.function,
                "in_collective": r.in_collective,
                "stuck_s": r.stuck_s,
                "hung": r.hung,
            }

        return {
            "round": self.round,
            "summary": self.sentence(),
            "stuck": [row(r) for r in self.stuck],
            "waiting": [row(r) for r in self.waiting],
            "unknown": [row(r) for r in self.unknown],
        }


def merge(records: Mapping[str, Mapping[str, Any]], round_: int = -1) -> JobHang | None:
    """Merge the nodes' ``stuck`` summaries of one round into the job's picture.

    Args:
        records: node id -> its progress record.
        round_: the round to show (-1: the newest round any node has a summary of).

    Returns:
        The picture, or None when no node of that round has a silent rank.
    """
    parsed = [p for p in (parse_stuck(r) for r in records.values()) if p is not None]
    if not parsed:
        return None
    shown = max(r for r, _ in parsed) if round_ < 0 else round_
    by_rank: dict[int, StuckRank] = {}
    for r, ranks in parsed:
        if r != shown:
            continue
        for rank in ranks:
            known = by_rank.get(rank.rank)
            if known is None or rank.stuck_s > known.stuck_s:
                by_rank[rank.rank] = rank
    if not by_rank:
        return None
    every = sorted(by_rank.values(), key=lambda r: r.rank)
    stuck = [r for r in every if r.in_collective is False or (r.hung and not r.in_collective)]
    waiting = [r for r in every if r.in_collective is True and r not in stuck]
    unknown = [r for r in every if r not in stuck and r not in waiting]
    stuck.sort(key=lambda r: (-r.stuck_s, r.rank))
    return JobHang(shown, tuple(stuck), tuple(waiting), tuple(unknown))
