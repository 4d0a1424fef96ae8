"""The link check's rule: which nodes are slow, and what the mode does about them.

A node is slow when its bandwidth is under ``1 / factor`` of the median of the round's nodes
(``factor`` is ``--straggler-factor``, the same ratio that names a straggling rank). Fewer than
two figures name nobody. With ``--link-check exclude`` a slow node is excluded only when a spare
waits to take its place, the slowest first, one per waiting spare; otherwise it is only named.

Also the one warning line and the fields of the ``link.slow`` event, so every caller says it the
same way. Pure: numbers in, ranks and text out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from elastic_run.agent.link_check.mode import LinkCheckMode
from elastic_run.agent.link_check.report import LinkReport

__all__ = [
    "LinkVerdict",
    "link_verdict",
    "median_bandwidth",
    "slow_event_fields",
    "slow_message",
    "slow_nodes",
    "slow_ranks",
]


def _check_factor(factor: float) -> None:
    if not (math.isfinite(factor) and factor > 1.0):
        raise ValueError(f"the slow-link factor must be a number above 1, got {factor}")


def median_bandwidth(bandwidth_bytes_per_s: Sequence[float]) -> float:
    """The median of the figures (0.0 for none)."""
    return float(statistics.median(bandwidth_bytes_per_s)) if bandwidth_bytes_per_s else 0.0


def slow_ranks(bandwidth_bytes_per_s: Sequence[float], factor: float) -> tuple[int, ...]:
    """The ranks whose figure is under ``median / factor``, lowest rank first.

    Args:
        bandwidth_bytes_per_s: one figure per node rank.
        factor: ``--straggler-factor`` (finite, above 1).

    Returns:
        The slow ranks; empty for fewer than two figures or a median of 0.

    Raises:
        ValueError: ``factor`` is not finite or not above 1.
    """
    _check_factor(factor)
    if len(bandwidth_bytes_per_s) < 2:
        return ()
    floor = median_bandwidth(bandwidth_bytes_per_s) / factor
    return tuple(rank for rank, bw in enumerate(bandwidth_bytes_per_s) if bw < floor)


def slow_nodes(report: LinkReport, factor: float) -> tuple[int, ...]:
    """The report's slow node ranks judged with ``factor`` (see :func:`slow_ranks`).

    Raises:
        ValueError: ``factor`` is not finite or not above 1.
    """
    return slow_ranks(report.bandwidth_bytes_per_s, factor)


@dataclass(frozen=True)
class LinkVerdict:
    """What to do after a link check.

    Attributes:
        named: the slow ranks, each to be named in a warning and a ``link.slow`` event.
        excluded: those of ``named`` to exclude (``exclude`` mode, one per waiting spare,
            slowest first); always a subset of ``named``.
    """

    named: tuple[int, ...] = ()
    excluded: tuple[int, ...] = ()


def link_verdict(
    report: LinkReport, mode: LinkCheckMode, factor: float, spares_waiting: int
) -> LinkVerdict:
    """Decide from a report: who is named, who is excluded.

    Args:
        report: the round's link check.
        mode: ``--link-check``.
        factor: ``--straggler-factor``.
        spares_waiting: how many spares wait at the door now.

    Returns:
        The verdict (empty with ``off``, or when nobody is slow).

    Raises:
        ValueError: ``factor`` is not finite or not above 1.
    """
    if mode is LinkCheckMode.OFF:
        return LinkVerdict()
    named = slow_nodes(report, factor)
    if mode is not LinkCheckMode.EXCLUDE or spares_waiting <= 0 or not named:
        return LinkVerdict(named=named)
    bw = report.bandwidth_bytes_per_s
    slowest = sorted(named, key=lambda r: (bw[r], r))[: max(0, spares_waiting)]
    return LinkVerdict(named=named, excluded=tuple(sorted(slowest)))


def _mb(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e6:.1f} MB/s"


def slow_message(report: LinkReport, rank: int, host: str | None = None) -> str:
    """The one warning line for slow node ``rank`` (``host``: its address, when known)."""
    median = median_bandwidth(report.bandwidth_bytes_per_s)
    where = f"node {rank}" + (f" ({host})" if host else "")
    return (
        f"link check: {where} moved {_mb(report.bandwidth_bytes_per_s[rank])}, under "
        f"1/{report.factor:g} of the median {_mb(median)} of {report.world_size} nodes "
        f"({report.backend}, {report.size_bytes / (1 << 20):g} MiB exchanges)"
    )


def slow_event_fields(
    report: LinkReport,
    rank: int,
    mode: LinkCheckMode,
    excluded: bool,
    host: str | None = None,
) -> dict[str, Any]:
    """The fields of the ``link.slow`` event for slow node ``rank``.

    Returns:
        ``node``, ``host``, ``bandwidth_bytes_per_s``, ``median_bytes_per_s``, ``ratio`` (the
        median over the node's figure; inf-free: None when the node's figure is 0), ``factor``,
        ``mode``, ``excluded``, ``backend``, ``size_bytes``, ``world_size``.
    """
    bw = report.bandwidth_bytes_per_s[rank]
    median = median_bandwidth(report.bandwidth_bytes_per_s)
    return {
        "node": rank,
        "host": host,
        "bandwidth_bytes_per_s": bw,
        "median_bytes_per_s": median,
        "ratio": round(median / bw, 3) if bw > 0 else None,
        "factor": report.factor,
        "mode": mode.value,
        "excluded": excluded,
        "backend": report.backend,
        "size_bytes": report.size_bytes,
        "world_size": report.world_size,
    }
