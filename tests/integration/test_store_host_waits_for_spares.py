"""The store's host of a job that just succeeded waits for the spare at the door to read the end
before it leaves (its leaving takes the c10d store with it): real TCPStore, real handlers.

Found in a whole check: the host closed the job and left at once, because its own flags, read
once a tick, did not yet hold the close it had just written; the spare then found the store gone
and exited 4 ("cannot be reached") for a job that had succeeded.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.dynamic.handler import DynamicRendezvousHandler
from elastic_run.rendezvous.errors import RendezvousClosedError
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.registry import get_rendezvous_handler
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(120)

# 1 s ticks: the spare at the door looks for the close once a tick; the host's own read of the
# store's keys (its flags) runs once a tick too, so an immediate leave would miss both.
_CONF = {"join_timeout": "60", "local_addr": "127.0.0.1", "keep_alive_interval": "1"}


def _handler(endpoint: str, run_id: str, **conf: str) -> DynamicRendezvousHandler:
    params = RendezvousParameters("c10d", endpoint, run_id, 1, 1, **_CONF, **conf)
    handler = get_rendezvous_handler(params)
    assert isinstance(handler, DynamicRendezvousHandler)
    handler.set_change_callback(lambda: None)  # our agent's path
    return handler


def test_the_store_host_of_a_succeeded_job_leaves_after_the_spare_read_the_end() -> None:
    run_id = f"spare-{uuid.uuid4().hex[:8]}"
    host = _handler("127.0.0.1:0", run_id, is_host="true")
    assert host.backend.is_hosting
    host.next_rendezvous()  # a round of one, at MAX
    spare = _handler(host.backend.endpoint, run_id, is_host="false")
    outcome: dict[str, Any] = {}

    def join() -> None:
        try:
            outcome["spare"] = spare.next_rendezvous()
        except BaseException as exc:  # the test reads it
            outcome["spare"] = exc

    thread = threading.Thread(target=join, daemon=True)
    thread.start()
    try:
        # At the door: the round's arrivals count it, and it waits as a spare (no room).
        wait_until(lambda: host.backend.read_counter(keys.arrivals(0)) == 2, 30, "the spare")
        host.set_closed("succeeded")
        host.shutdown()  # at once, as the agent does after its workers succeeded
        # The host waited for the spare's read: it is counted, and the spare saw the end.
        assert host.backend.read_counter(keys.SPARES_SEEN) == 1
        thread.join(30)
        assert isinstance(outcome.get("spare"), RendezvousClosedError), outcome
    finally:
        spare.shutdown()
        thread.join(30)
