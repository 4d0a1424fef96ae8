"""Nodes of one job in one process waiting for a seal share their closed check, and see a close.

Real TCPStore, real handlers through the public registry on the system clock: while a round
that cannot complete forms, the waiting nodes' closed checks go through the process's shared
read (``dynamic/shared_reads.py``), and a close from one node still ends every node's join.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from torch.distributed import TCPStore

from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.dynamic import shared_reads
from elastic_run.rendezvous.dynamic.handler import DynamicRendezvousHandler
from elastic_run.rendezvous.errors import RendezvousClosedError
from elastic_run.rendezvous.protocol import keys
from elastic_run.rendezvous.registry import get_rendezvous_handler
from tests.helpers import join_into, wait_until

pytestmark = pytest.mark.timeout(120)


def test_waiting_nodes_share_the_closed_check_and_all_see_the_close() -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    job = f"closed-{uuid.uuid4().hex[:8]}"
    conf = {"is_host": "false", "local_addr": "127.0.0.1", "keep_alive_interval": "0.2"}
    params = RendezvousParameters("c10d", f"127.0.0.1:{store.port}", job, 5, 5, **conf)
    handlers: list[DynamicRendezvousHandler] = []
    for _ in range(4):  # one short of the round: it keeps forming
        handler = get_rendezvous_handler(params)
        assert isinstance(handler, DynamicRendezvousHandler)
        handlers.append(handler)
    outcome: dict[int, Any] = {}
    threads = [
        threading.Thread(target=join_into, args=(outcome, i, h), daemon=True)
        for i, h in enumerate(handlers)
    ]
    backend = handlers[0].backend
    shared_key = (backend.name, backend.endpoint, job, keys.CLOSED)
    try:
        for thread in threads:
            thread.start()
        wait_until(lambda: shared_key in shared_reads._LAST, 60, message="no shared closed check")
        handlers[0].set_closed()
        for thread in threads:
            thread.join(60)
        assert len(outcome) == 4
        assert all(isinstance(o, RendezvousClosedError) for o in outcome.values()), outcome
    finally:
        for handler in handlers:
            handler.shutdown()
