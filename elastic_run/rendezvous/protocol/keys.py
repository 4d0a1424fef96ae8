"""The key schema of the dynamic rendezvous: every key the protocol reads or writes, in one place.

Keys are relative to the job; a backend adds its own prefix and the run id
(``elastic-run/<run id>/`` on c10d, ``/elastic-run/<run id>/`` on etcd).

    round               the current round r (ASCII digits); advanced by compare-set r -> r+1
    closed              a JSON ClosedRecord once the job is closed (first writer wins)
    restarts            the job's restart count: bumped by the node whose worker failure ended
                        a round first, before the round advances; each seal carries it
    epoch               a counter bumped after every change a member must notice (a round
                        ended, a node waits at the door, the job closed): a member's agent
                        reads only this, once a second, and reads more when it moved
    spares-seen         atomic counter: each node waiting at the door (a spare) adds 1 when it
                        sees the job closed, so the store's host leaves only once they read it
    r<r>/arrivals       atomic counter: each joiner takes arrival index = add(1) - 1
    r<r>/node/<i>       the NodeRecord of arrival i
    r<r>/seal           the SealRecord, written once (compare-set from absent)
    r<r>/lost           why round r ended (LostRecord), written once
    r<r>/shared/        the round's private store (RendezvousInfo.store)
    hb/<node id>        each node's heartbeat counter (a lease-bound key on etcd)
    st/<node id>        the agent's published state (JSON, best-effort, for ``status``)
    ev/count, ev/<k>    a ring of the last EVENT_RING_SIZE events: seq = add(ev/count, 1),
                        slot (seq - 1) % EVENT_RING_SIZE
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = [
    "CLOSED",
    "EPOCH",
    "EVENT_COUNT",
    "EVENT_RING_SIZE",
    "RESTARTS",
    "ROUND",
    "SPARES_SEEN",
    "arrivals",
    "event_slot",
    "heartbeat",
    "lost",
    "node",
    "seal",
    "shared_prefix",
    "state",
]

ROUND = "round"
CLOSED = "closed"
EPOCH = "epoch"
RESTARTS = "restarts"
SPARES_SEEN = "spares-seen"
EVENT_COUNT = "ev/count"
EVENT_RING_SIZE = 64


def _in_round(name: str) -> Callable[[int], str]:
    def key(r: int) -> str:
        return f"r{r}/{name}"

    key.__doc__ = f"The key ``r<r>/{name}``."
    return key


arrivals = _in_round("arrivals")  # the arrival counter of a round
seal = _in_round("seal")  # the seal of a round
lost = _in_round("lost")  # why a round ended
shared_prefix = _in_round("shared/")  # the prefix of a round's private store


def node(r: int, index: int) -> str:
    """The record of arrival ``index`` in round ``r``."""
    return f"r{r}/node/{index}"


def heartbeat(node_id: str) -> str:
    """The heartbeat counter of ``node_id``."""
    return f"hb/{node_id}"


def state(node_id: str) -> str:
    """The published agent state of ``node_id``."""
    return f"st/{node_id}"


def event_slot(seq: int) -> str:
    """The ring slot of event number ``seq`` (1-based)."""
    return f"ev/{(seq - 1) % EVENT_RING_SIZE}"
