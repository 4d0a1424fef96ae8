"""A round's end told to its members: whom to tell (read from the store), and the line sent.

Every kind of round end is told, by whoever decides it: a member whose workers failed or hung,
a member that judged another lost (its ring watch, or the look before a failure counts), a
member excluded or leaving to rejoin, a node arriving at the door of a round with room, a node
at the door that judged a member lost, an agent that closes the job, and ``elastic-run close``
from outside the job. Best-effort, and only after the store holds the end: one read of the
members' records (and of the round and its seal when the teller is no member), then one line
(``protocol/round_notice.py``) to each member's death-notice port from the process's notice
loop (``liveness/notice_send.py``). A member that is not told finds the end at its next look,
as it would without notices; a member that is told confirms it in the store before it acts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from elastic_run.rendezvous.backend import RendezvousBackend
from elastic_run.rendezvous.errors import RendezvousError, RendezvousStateError
from elastic_run.rendezvous.liveness.notice_send import NoticeTarget
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.protocol.records import NodeRecord, SealRecord, decode, decode_int
from elastic_run.rendezvous.protocol.round_notice import RoundNotice, encode_notice

__all__ = ["Send", "current_seal", "notice_targets", "tell_round"]

log = logging.getLogger(__name__)

Send = Callable[[bytes, Sequence[NoticeTarget], Callable[[int, list[str]], None] | None], None]
"""Sends a line to targets and calls back with (sent, missed) (``DeathNotices.tell``,
``notice_send.send_line``)."""


def notice_targets(
    backend: RendezvousBackend, r: int, indices: Sequence[int], skip_node_id: str
) -> list[NoticeTarget]:
    """The death-notice ports of round ``r``'s arrivals ``indices`` (one read of their records).

    A record missing, unreadable, without a port, or of ``skip_node_id`` is left out.

    Raises:
        RendezvousError: the store failed.
    """
    node_keys = [keys.node(r, i) for i in indices]
    if not node_keys:
        return []
    targets = []
    for key, raw in zip(node_keys, backend.get_many(node_keys), strict=True):
        if raw is None:
            continue
        try:
            record = decode(NodeRecord, key, raw)
        except RendezvousStateError as exc:
            log.warning("round %d: not telling a member: %s", r, exc)
            continue
        if record.alive_port and record.node_id != skip_node_id:
            targets.append(NoticeTarget(record.node_id, record.addr, record.alive_port))
    return targets


def current_seal(backend: RendezvousBackend) -> tuple[int, SealRecord] | None:
    """The job's current round and its seal (one read each), or None while none is sealed.

    Raises:
        RendezvousError: the store failed, or a record is not one.
    """
    (raw_round,) = backend.get_unwaited([keys.ROUND])
    if raw_round is None:
        return None
    r = decode_int(keys.ROUND, raw_round)
    (raw_seal,) = backend.get_unwaited([keys.seal(r)])
    if raw_seal is None:
        return None
    return r, decode(SealRecord, keys.seal(r), raw_seal)


def tell_round(
    backend: RendezvousBackend,
    notice: RoundNotice,
    seal: SealRecord,
    send: Send,
    on_done: Callable[[int, list[str]], None] | None = None,
) -> int:
    """Tell round ``notice.round``'s admitted members but the teller (``notice.by``).

    Args:
        backend: the job's backend (the members' records are read there).
        notice: what to tell (the teller's id and arrival index, -1 when it has none).
        seal: that round's seal (who its members are).
        send: sends the line (returns at once; ``on_done`` is called when every target is done).
        on_done: called with how many got the line and why the others did not.

    Returns:
        How many members the line goes to (0: nobody to tell, or the store failed: logged).
    """
    others = [i for i in seal.admitted_indices() if i != notice.index]
    try:
        targets = notice_targets(backend, notice.round, others, notice.by)
    except RendezvousError as exc:
        log.info(
            "rendezvous '%s': could not tell round %d's members: %s", notice.job, notice.round, exc
        )
        return 0
    if targets:
        send(encode_notice(notice), targets, on_done)
    return len(targets)
