"""A node's fault history: the failures charged to it, as it keeps and publishes them. Pure.

Each failure the agent attributes is charged to the node that hosted it: the root cause of a
failed round (the node whose failure ended the round first), a worker judged hung (the node
of the rank that is not waiting in a collective, whose agent acts first), a watchdog expiry, a
failed node check. The node keeps its own history (the truth for its own verdicts: a record in
the store, which anyone who can write there can forge, never decides about a node) and
publishes it as one small record, ``fh/<node id>``: ``{"v": 1, "node", "host", "state",
"faults": [...]}`` with at most ``KEPT`` faults, so it stays O(1) whatever the job's length.

The others' records are read to tell a bad node from a bad script: a failure whose rank failed
on another node before followed the rank (the script's, ``follows_rank``). Reading is
defensive: :func:`from_json` raises ``ValueError`` for anything that is not a record of ours
(a wrong version, a wrong type, a huge count, a node id that is not the key's), and the reader
ignores such a record with one warning.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "FAULT_CAUSES",
    "KEPT",
    "SCHEMA_VERSION",
    "Fault",
    "FaultHistory",
    "follows_rank",
    "from_json",
]

SCHEMA_VERSION = 1
KEPT = 16
FAULT_CAUSES = ("worker_failed", "hung", "watchdog", "node_check", "link_slow")
_MAX_TEXT = 200
_MAX_RANK = 1 << 24


@dataclass(frozen=True)
class Fault:
    """One failure charged to a node.

    Attributes:
        round: the rendezvous round it happened in.
        rank: the global rank of the worker that failed first (-1: none, a node check).
        group_rank: the node's rank in that round (-1: not in a round).
        cause: one of ``FAULT_CAUSES``.
        how: how it failed, for people (``SIGSEGV``, ``exit code 1``, ``hung``).
        step: the step it reached (-1: not known).
    """

    round: int
    rank: int
    group_rank: int
    cause: str
    how: str
    step: int = -1

    def text(self) -> str:
        """``rank 5 SIGSEGV at step 12`` (or the cause alone for a node check)."""
        if self.rank < 0:
            return self.how
        at = f" at step {self.step}" if self.step >= 0 else ""
        return f"rank {self.rank} {self.how}{at}"


@dataclass(frozen=True)
class FaultHistory:
    """The failures charged to one node, oldest first, and its state.

    Attributes:
        node_id: the node (its agent's id in the rendezvous).
        host: its host name.
        faults: the last ``KEPT`` failures charged to it.
        excluded: why it was excluded, once it was (None: it was not).
    """

    node_id: str
    host: str
    faults: tuple[Fault, ...] = ()
    excluded: str | None = None

    def charged(self, fault: Fault) -> FaultHistory:
        """This history with ``fault`` added (the oldest dropped past ``KEPT``)."""
        return replace(self, faults=(*self.faults, fault)[-KEPT:])

    def excluded_for(self, reason: str) -> FaultHistory:
        """This history, the node excluded for ``reason``."""
        return replace(self, excluded=reason)

    def state(self, max_failures: int) -> str:
        """``ok``, ``suspect (1 of 2: rank 5 SIGSEGV at step 12)`` or ``excluded: <reason>``."""
        if self.excluded is not None:
            return f"excluded: {self.excluded}"
        if not self.faults:
            return "ok"
        last = self.faults[-1]
        return f"suspect ({len(self.faults)} of {max_failures}: {last.text()})"

    def to_json(self, max_failures: int) -> dict[str, Any]:
        """The published record (``fh/<node id>``'s ``history``)."""
        return {
            "v": SCHEMA_VERSION,
            "node": self.node_id,
            "host": self.host,
            "state": self.state(max_failures),
            "excluded": self.excluded,
            "faults": [
                {
                    "round": f.round,
                    "rank": f.rank,
                    "group_rank": f.group_rank,
                    "cause": f.cause,
                    "how": f.how,
                    "step": f.step,
                }
                for f in self.faults
            ],
        }


def _int(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} is not an integer in {low}..{high}: {value!r}")
    return value


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise ValueError(f"{name} is not a short text")
    return value


def from_json(node_id: str, body: Any) -> FaultHistory:
    """Read a node's published history back, every field checked.

    Args:
        node_id: the node whose key it was read under (the record must name it).
        body: the record's ``history`` object.

    Raises:
        ValueError: it is not a fault history of ours (version, shape, types, bounds, node).
    """
    if not isinstance(body, Mapping):
        raise ValueError("not a JSON object")
    if body.get("v") != SCHEMA_VERSION:
        raise ValueError(f"unknown version {body.get('v')!r}")
    if body.get("node") != node_id:
        raise ValueError(f"it names node {body.get('node')!r}, not {node_id!r}")
    faults = body.get("faults")
    if not isinstance(faults, list) or len(faults) > KEPT:
        raise ValueError(f"'faults' is not a list of at most {KEPT}")
    read = []
    for item in faults:
        if not isinstance(item, Mapping):
            raise ValueError("a fault is not a JSON object")
        cause = _text(item.get("cause"), "cause")
        if cause not in FAULT_CAUSES:
            raise ValueError(f"unknown cause {cause!r}")
        read.append(
            Fault(
                round=_int(item.get("round"), "round", -1, _MAX_RANK),
                rank=_int(item.get("rank"), "rank", -1, _MAX_RANK),
                group_rank=_int(item.get("group_rank"), "group_rank", -1, _MAX_RANK),
                cause=cause,
                how=_text(item.get("how"), "how"),
                step=_int(item.get("step", -1), "step", -1, 1 << 53),
            )
        )
    excluded = body.get("excluded")
    if excluded is not None:
        excluded = _text(excluded, "excluded")
    return FaultHistory(node_id, _text(body.get("host", ""), "host"), tuple(read), excluded)


def follows_rank(fault: Fault, others: Iterable[FaultHistory]) -> FaultHistory | None:
    """The other node on which ``fault``'s rank failed before, if any: the failure followed the
    rank (a rank-dependent bug in the script), not the node.

    Args:
        fault: a failure charged to this node.
        others: the other nodes' histories.
    """
    if fault.rank < 0:
        return None
    for other in others:
        if any(f.rank == fault.rank and f.round < fault.round for f in other.faults):
            return other
    return None
