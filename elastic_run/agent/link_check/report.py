"""What a link check measured: the frozen ``LinkReport`` and the helper's one-line record of it.

The helper process prints one JSON line (schema version ``v``) on its stdout; the agent decodes it
here into numbers it checks (finite, not negative, one per node), never by running anything it
read. Every node's helper prints the same table (gathered by an all-reduce), so every node's
agent gets the same report.

Invariants:
- ``bandwidth_bytes_per_s[r]`` is node r's best exchange with any of its partners (see
  ``schedule.py``): a slow partner never makes a node look slow.
- ``pairs`` holds each measured exchange once, ``(a, b, bytes/s)`` with ``a < b``: the faster
  of the two sides' timings (the slower one also holds its wait for the other to start).
- A report of fewer than two nodes holds no figures (``measured`` is False).

Pure: ``json`` and ``math`` only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LinkReport",
    "Measurement",
    "decode_measurement",
    "encode_measurement",
    "figures_from_table",
]

_VERSION = 1
_MAX_LINE_BYTES = 4 << 20


@dataclass(frozen=True)
class Measurement:
    """What the helpers measured together, as every helper prints it.

    Attributes:
        bandwidth_bytes_per_s: per node rank, its best pairwise exchange (bytes one way / s).
        pairs: every exchange once, ``(a, b, bytes/s)`` with ``a < b``.
        all_reduce_bytes_per_s: the whole group's all-reduce of ``size_bytes`` (size / time), the
            figure the slowest link bounds.
        measure_s: how long the collectives took, process group set-up included.
        rechecked: the nodes measured again alone with the fastest node (see ``measure.py``).
    """

    bandwidth_bytes_per_s: tuple[float, ...]
    pairs: tuple[tuple[int, int, float], ...]
    all_reduce_bytes_per_s: float
    measure_s: float
    rechecked: tuple[int, ...] = ()


@dataclass(frozen=True)
class LinkReport:
    """One link check of one round, as the agent gets it.

    Attributes:
        world_size: the number of nodes of the round.
        backend: the process group's backend (``gloo``, ``nccl``).
        size_bytes: the bytes each exchange moved each way.
        bandwidth_bytes_per_s: per node rank, its best pairwise exchange (empty when nothing
            was measured).
        pairs: every exchange once, ``(a, b, bytes/s)`` with ``a < b``.
        all_reduce_bytes_per_s: the all-reduce's figure (0.0 when nothing was measured).
        measure_s: the collectives' time inside the helper.
        duration_s: the whole check as the agent waited for it (the helper's start included).
        factor: the ``--straggler-factor`` the slow ranks were judged with.
        slow: the ranks under ``1 / factor`` of the median, lowest first.
        rechecked: the ranks that were under it after the passes and were measured again.
    """

    world_size: int
    backend: str
    size_bytes: int
    bandwidth_bytes_per_s: tuple[float, ...]
    pairs: tuple[tuple[int, int, float], ...]
    all_reduce_bytes_per_s: float
    measure_s: float
    duration_s: float
    factor: float
    slow: tuple[int, ...]
    rechecked: tuple[int, ...] = ()

    @property
    def measured(self) -> bool:
        """Whether any link was measured (a round of two nodes or more)."""
        return bool(self.bandwidth_bytes_per_s)

    def by_rank(self) -> dict[int, float]:
        """Node rank -> bytes/s."""
        return dict(enumerate(self.bandwidth_bytes_per_s))


def encode_measurement(m: Measurement) -> str:
    """The helper's one line for ``m`` (no newline)."""
    return json.dumps(
        {
            "v": _VERSION,
            "bandwidth": list(m.bandwidth_bytes_per_s),
            "pairs": [list(p) for p in m.pairs],
            "all_reduce": m.all_reduce_bytes_per_s,
            "measure_s": m.measure_s,
            "rechecked": list(m.rechecked),
        },
        separators=(",", ":"),
    )


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} is not a number")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{what} is not a finite number >= 0")
    return number


def _rank(value: Any, world_size: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < world_size:
        raise ValueError(f"{what} is not a rank of the {world_size} nodes")
    return value


def decode_measurement(line: str, world_size: int) -> Measurement:
    """Decode and check a helper's line.

    Args:
        line: what the helper printed (one JSON object).
        world_size: the round's node count the figures must cover.

    Returns:
        The measurement.

    Raises:
        ValueError: the line is not a record of this version and shape (one line saying what).
    """
    if len(line) > _MAX_LINE_BYTES:
        raise ValueError(f"the helper's record is {len(line)} bytes, more than any check prints")
    try:
        raw = json.loads(line)
    except ValueError:
        raise ValueError(f"the helper printed no JSON record: {line[:80]!r}") from None
    if not isinstance(raw, dict) or raw.get("v") != _VERSION:
        raise ValueError(f"the helper's record is not version {_VERSION}: {line[:80]!r}")
    bandwidth = raw.get("bandwidth")
    pairs = raw.get("pairs")
    if not isinstance(bandwidth, list) or len(bandwidth) != world_size:
        raise ValueError(f"the helper's record holds no bandwidth for each of {world_size} nodes")
    if not isinstance(pairs, list):
        raise ValueError("the helper's record holds no list of pairs")
    figures = tuple(_number(b, f"the bandwidth of node {i}") for i, b in enumerate(bandwidth))
    checked: list[tuple[int, int, float]] = []
    for item in pairs:
        if not isinstance(item, list) or len(item) != 3:
            raise ValueError("a pair of the helper's record is not [a, b, bytes/s]")
        a = _rank(item[0], world_size, "a pair's first rank")
        b = _rank(item[1], world_size, "a pair's second rank")
        if a >= b:
            raise ValueError("a pair of the helper's record is not in order (a < b)")
        checked.append((a, b, _number(item[2], "a pair's bandwidth")))
    rechecked = raw.get("rechecked")
    if not isinstance(rechecked, list):
        raise ValueError("the helper's record holds no list of rechecked nodes")
    return Measurement(
        bandwidth_bytes_per_s=figures,
        pairs=tuple(checked),
        all_reduce_bytes_per_s=_number(raw.get("all_reduce"), "the all-reduce's bandwidth"),
        measure_s=_number(raw.get("measure_s"), "the measuring time"),
        rechecked=tuple(_rank(r, world_size, "a rechecked node") for r in rechecked),
    )


def figures_from_table(
    rows: Sequence[Sequence[float]], world_size: int
) -> tuple[dict[tuple[int, int], float], tuple[float, ...]]:
    """The pairs' and the nodes' figures from the helpers' table.

    Args:
        rows: ``rows[a][b]``: bytes/s node ``a`` timed with partner ``b`` (0: none), one row per
            node (extra columns are ignored).
        world_size: the node count.

    Returns:
        ``({(a, b): bytes/s} with a < b, per node its best pair)``. Both sides timed the same
        exchange; the later starter's time is the transfer's own, the earlier one's also holds
        its wait for the partner: the faster figure is the pair's.
    """
    pair_bw = {
        (a, b): float(max(rows[a][b], rows[b][a]))
        for a in range(world_size)
        for b in range(a + 1, world_size)
        if rows[a][b] > 0 or rows[b][a] > 0
    }
    bandwidth = [0.0] * world_size
    for (a, b), bw in pair_bw.items():
        bandwidth[a] = max(bandwidth[a], bw)
        bandwidth[b] = max(bandwidth[b], bw)
    return pair_bw, tuple(bandwidth)
