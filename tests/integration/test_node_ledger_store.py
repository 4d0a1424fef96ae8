"""The node ledger (``agent/loop/node_ledger.py``) on a real TCPStore with three real handlers in
one round: a history one node charged and published is read by another in one batch, and a
record that is not ours (bytes that are not JSON, a record that names another node, a forged
cause) is left out with one warning per node, never raised and never decided by."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from elastic_run.agent.loop.node_ledger import NodeLedger
from elastic_run.agent.rules.nodes.history import Fault
from elastic_run.rendezvous.api import RendezvousParameters
from elastic_run.rendezvous.dynamic.handler import DynamicRendezvousHandler
from elastic_run.rendezvous.dynamic.telemetry import faults_key
from elastic_run.rendezvous.registry import create_backend, rendezvous_handler_registry
from tests.helpers import free_port

CONF = {"last_call_timeout": "0.2", "join_timeout": "30", "is_host": "false"}


def _params(port: int, run_id: str, n: int) -> RendezvousParameters:
    return RendezvousParameters(
        "c10d", f"127.0.0.1:{port}", run_id, n, n, local_addr="127.0.0.1", **CONF
    )


def _handlers(port: int, run_id: str, n: int) -> list[DynamicRendezvousHandler]:
    made = []
    for _ in range(n):
        handler = rendezvous_handler_registry.create_handler(_params(port, run_id, n))
        assert isinstance(handler, DynamicRendezvousHandler)
        made.append(handler)
    return made


def _join_all(handlers: list[DynamicRendezvousHandler]) -> None:
    errors: list[BaseException] = []

    def join(h: DynamicRendezvousHandler) -> None:
        try:
            h.next_rendezvous()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(h,)) for h in handlers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert all(not t.is_alive() for t in threads)


def test_a_published_history_is_read_and_records_not_ours_are_left_out_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30))
    run_id = f"ledger-{uuid.uuid4().hex[:8]}"
    handlers = _handlers(port, run_id, 4)
    try:
        _join_all(handlers)
        a, b, c, d = handlers
        fault = Fault(round=1, rank=3, group_rank=1, cause="worker_failed", how="SIGSEGV", step=7)
        NodeLedger(b, "host-b", 3).charge(fault)

        # c: bytes that are not JSON; d: a well-formed record under d's key naming b.
        store = create_backend(_params(port, run_id, 4), allow_hosting=False)
        keys = {h: faults_key(str(h.node_id)) for h in handlers}
        (raw_b,) = store.get_many([keys[b]])
        assert raw_b is not None
        store.set(keys[c], b"\x00not json{")
        store.set(keys[d], raw_b)

        ledger = NodeLedger(a, "host-a", 3)
        with caplog.at_level(logging.WARNING, logger="elastic_run.agent.loop.node_ledger"):
            first = ledger.read_others()
            second = ledger.read_others()
        for view in (first, second):
            assert [o.node_id for o in view.others] == [str(b.node_id)]
            (read_b,) = view.others
            assert read_b.host == "host-b" and read_b.faults == (fault,)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 2, warnings  # one for c, one for d, not again on the next read
        assert any(str(d.node_id) in w and "names node" in w for w in warnings), warnings

        # A forged cause under b's own key replaces the good record: b is left out from now on.
        forged = json.loads(raw_b)
        forged["history"]["faults"][0]["cause"] = "bribe"
        store.set(keys[b], json.dumps(forged).encode())
        assert ledger.read_others().others == ()
    finally:
        for h in handlers:
            h.shutdown()
        del server
