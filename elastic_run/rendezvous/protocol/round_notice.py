"""A round's end told to its other members at once: the notice line and what a receiver makes of it.

The store is the truth of a round; a notice only says "look now". The node that ends a round
(its workers failed or hung, it judged a member lost, it saw nodes waiting, it was excluded, it
closed the job) writes the end to the store first, then sends this one line to each other member
over the agents' death-notice ports (``liveness/``). A receiver checks the line here (pure: no
store, no socket) and, when it names this node's current round and is news, looks at the store
once (``RoundState.look``) and acts only on what the store says. So a lost notice costs the
receiver its next periodic look, as before, and a forged or replayed one costs it one read.

Wire format, one line of at most ``MAX_LINE`` bytes::

    elastic-run round-ended {"by":"<node id>","cause":"worker_failure","index":2,"job":"<run id>","round":7,"v":1}\\n

``index`` is the sender's arrival index in that round: a member's (the seal admitted it), or
one beyond the seal (a node waiting at the door: it arrived, or judged a member lost, while
the round ran), or -1 for a sender that never arrived, which is heard only about a close
(``elastic-run close``). A receiver holding the round's seal drops an index the seal considered
and left out. ``cause`` is what the sender wrote as the round's end (for people: the receiver
reads the cause from the store).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Literal

from elastic_run.rendezvous.errors import RendezvousStateError
from elastic_run.rendezvous.protocol.records import SCHEMA_VERSION, SealRecord

__all__ = [
    "MAX_LINE",
    "PREFIX",
    "NoticeSkip",
    "RoundNotice",
    "encode_notice",
    "parse_notice",
    "skip_reason",
]

PREFIX = b"elastic-run round-ended "
MAX_LINE = 1024  # the prefix, the JSON and the newline
_MAX_TEXT = 256  # node ids, run ids and causes are far shorter

NoticeSkip = Literal[
    "other job", "own", "no round", "older round", "later round", "not a member", "known"
]
"""Why a well-formed notice causes no look: it names another job, or this node itself; this
node is between rounds (its join reads the store anyway); it names a round before or after this
node's current one, or an arrival index the round's seal considered and left out (or none, -1,
but about a close); or this node knows of the round's end already."""


@dataclass(frozen=True)
class RoundNotice:
    """One node's word that a round ended (or should end: nodes wait, the job closed).

    Attributes:
        job: the run id.
        round: the round that ended.
        by: the sender's node id.
        index: the sender's arrival index in ``round`` (-1: none; a receiver drops such a
            notice).
        cause: why, as the sender recorded it (``worker_failure``, ``closed``...).
    """

    job: str
    round: int
    by: str
    index: int = -1
    cause: str = ""


def encode_notice(notice: RoundNotice) -> bytes:
    """The line a sender writes (prefix, versioned JSON, newline).

    Raises:
        ValueError: the line would exceed ``MAX_LINE`` (a text field too long).
    """
    body = asdict(notice)
    body["v"] = SCHEMA_VERSION
    line = PREFIX + json.dumps(body, separators=(",", ":"), sort_keys=True).encode() + b"\n"
    if len(line) > MAX_LINE:
        raise ValueError(f"a round notice of {len(line)} bytes exceeds {MAX_LINE}")
    return line


def parse_notice(line: bytes) -> RoundNotice:
    """Decode one line (with or without its newline) as a notice.

    Raises:
        RendezvousStateError: the line is not a notice: another prefix, too long, not JSON, an
            unknown version, a missing or extra field, a field of the wrong type or out of range.
    """
    line = line.removesuffix(b"\n")
    if len(line) >= MAX_LINE:
        raise RendezvousStateError(
            f"not a round notice: {len(line) + 1} bytes or more (at most {MAX_LINE})"
        )
    if not line.startswith(PREFIX):
        raise RendezvousStateError(f"not a round notice: {line[:40]!r}")
    try:
        body = json.loads(line[len(PREFIX) :].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise RendezvousStateError(f"not a round notice (not JSON): {line[:60]!r}") from None
    if not isinstance(body, dict) or body.get("v") != SCHEMA_VERSION:
        raise RendezvousStateError(
            f"not a round notice: unknown schema version (expected v={SCHEMA_VERSION})"
        )
    fields = {k: v for k, v in body.items() if k != "v"}
    expected = {"job": str, "round": int, "by": str, "index": int, "cause": str}
    if set(fields) != set(expected):
        raise RendezvousStateError(
            f"not a round notice: fields {sorted(fields)} (expected {sorted(expected)})"
        )
    for name, kind in expected.items():
        value = fields[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise RendezvousStateError(f"not a round notice: bad field '{name}': {value!r}"[:120])
        if isinstance(value, str) and len(value) > _MAX_TEXT:
            raise RendezvousStateError(f"not a round notice: field '{name}' too long")
    if fields["round"] < 0 or fields["index"] < -1:
        raise RendezvousStateError(
            f"not a round notice: round {fields['round']}, index {fields['index']}"
        )
    return RoundNotice(**fields)


def skip_reason(
    notice: RoundNotice,
    job: str,
    node_id: str,
    current: int | None,
    seal: SealRecord | None,
    known_over: bool,
) -> NoticeSkip | None:
    """Whether a well-formed notice is worth one look at the store (None) or why not.

    Args:
        notice: the notice received.
        job: this node's run id.
        node_id: this node's id.
        current: the round this node is a member of (None: between rounds, no look needed: its
            join reads the store anyway).
        seal: that round's seal (None: not known; then the index is not checked).
        known_over: this node already knows its round ended.

    Returns:
        None to look at the store now, else why the notice is dropped.
    """
    if notice.job != job:
        return "other job"
    if notice.by == node_id:
        return "own"
    if current is None:
        return "no round"
    if notice.round < current:
        return "older round"
    if notice.round > current:
        return "later round"
    if notice.index < 0:
        if notice.cause != "closed":  # anyone may say the job closed: the store says whether
            return "not a member"
    elif (
        seal is not None
        and seal.rank_of(notice.index) is None
        and notice.index < seal.sealed_arrivals
    ):
        return "not a member"  # considered by the seal and left out (higher: at the door)
    if known_over:
        return "known"
    return None
