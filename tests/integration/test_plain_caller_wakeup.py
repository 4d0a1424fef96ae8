"""A handler that is only asked ``next_rendezvous()`` (torch's agent, torchrun, anyone's own agent:
no interrupt check, no change callback) is woken by the write it waits for, not by a poll.

Real TCPStore, real handlers; the plain handler's links go through a counting TCP proxy, so the
requests it makes while it waits are counted, and its own heartbeat counter (read from the
store) is the clock they are counted against: no timed assertion.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from torch.distributed import TCPStore

from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.dynamic.handler import DynamicRendezvousHandler
from elastic_run.rendezvous.registry import get_rendezvous_handler
from tests.helpers import join_into, wait_until
from tests.tcp_proxy import TcpProxy

# A member's liveness turn makes 3 requests (its heartbeat, its successor's, the epoch read).
# Waiting in 0.5 s slices adds 2 a slice (the wait with its cancel, and a check): 4 a turn.
_TURN_REQUESTS = 3
_TURNS = 6


@pytest.fixture
def tcp_store() -> Iterator[TCPStore]:
    yield TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _beat(reader: DynamicRendezvousHandler, node_id: str) -> int:
    (value,) = reader.backend.read_heartbeats([node_id])
    return value or 0


def _beats_reach(reader: DynamicRendezvousHandler, node_id: str, target: int) -> Callable[[], bool]:
    return lambda: _beat(reader, node_id) >= target


def test_a_plain_caller_waiting_for_rank_0s_address_is_woken_by_its_write(
    tcp_store: TCPStore,
) -> None:
    """Rank 0 is our agent's node (a change callback: it publishes no bootstrap address), so the
    plain node of rank 1 waits for the address. While it waits it makes its liveness turns'
    requests and nothing else (one store wait, no slices); the test's write of the address
    then ends its wait, and it returns what was written."""
    for _ in range(5):  # until the agent's node arrived first and so holds rank 0
        job = f"wake-{uuid.uuid4().hex[:8]}"
        proxy = TcpProxy(tcp_store.port)
        conf = {"join_timeout": "120", "is_host": "false", "local_addr": "127.0.0.1"}
        agent = get_rendezvous_handler(
            RendezvousParameters("c10d", f"127.0.0.1:{tcp_store.port}", job, 2, 2, **conf)
        )
        plain = get_rendezvous_handler(
            RendezvousParameters("c10d", proxy.endpoint, job, 2, 2, **conf)
        )
        assert isinstance(agent, DynamicRendezvousHandler)
        assert isinstance(plain, DynamicRendezvousHandler)
        agent.set_change_callback(lambda: None)
        outcome: dict[str, Any] = {}
        first = threading.Thread(target=join_into, args=(outcome, "agent", agent))
        second = threading.Thread(target=join_into, args=(outcome, "plain", plain))
        first.start()
        try:
            wait_until(agent.snapshot, 30, message="the agent's node arrived")
            second.start()
            first.join(60)
            info = outcome["agent"]
            assert not isinstance(info, BaseException), info
            if info.rank != 0:
                continue  # the plain node holds rank 0 and published: try again
            # In its round: the seal is written and its turns run. Two turns more, and it
            # has read the seal and is waiting for rank 0's address.
            beat0 = _beat(agent, plain.node_id)
            wait_until(_beats_reach(agent, plain.node_id, beat0 + 2), 30, message="2 turns")
            requests0, beat1 = proxy.stats.requests, _beat(agent, plain.node_id)
            wait_until(_beats_reach(agent, plain.node_id, beat1 + _TURNS), 60, message="6 turns")
            requests, turns = proxy.stats.requests - requests0, _beat(agent, plain.node_id) - beat1
            assert second.is_alive(), outcome.get("plain")  # still waiting for the address
            assert requests <= (_TURN_REQUESTS + 1) * turns, (requests, turns)
            info.store.set("MASTER_ADDR", "10.1.2.3")
            info.store.set("MASTER_PORT", "29517")
            second.join(60)
            got = outcome.get("plain")
            assert not isinstance(got, BaseException), got
            assert got is not None and got.rank == 1
            where = got.bootstrap_store_info
            assert (where.master_addr, where.master_port) == ("10.1.2.3", 29517)
            return
        finally:
            first.join(60)
            if second.is_alive():
                info_store = outcome.get("agent")
                if info_store is not None and not isinstance(info_store, BaseException):
                    info_store.store.set("MASTER_ADDR", "127.0.0.1")
                    info_store.store.set("MASTER_PORT", "1")
                second.join(60)
            agent.shutdown()
            plain.shutdown()
            proxy.close()
    raise AssertionError("the agent's node never held rank 0 in 5 jobs")
