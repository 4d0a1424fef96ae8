"""The dynamic handler's public behaviour that torch's own dynamic_rendezvous tests check, called
the same way on torch's handler and on ours, each on a real c10d TCPStore of its own.

Equal: ``create_handler`` reads ``join_timeout``/``last_call_timeout``/``close_timeout``;
``local_addr`` becomes the bootstrap ``master_addr``; one node's round is rank 0 of 1 on a
``PrefixStore``; ``use_agent_store`` is True; ``shutdown()`` answers True, twice; ``from_backend``
refuses node counts that are not ``0 < min <= max`` with ValueError. Documented differences
(docs/python-api.md) are held as such: ``settings`` is ours, ``shutdown()`` leaves without
closing, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` is not read.
"""

from __future__ import annotations

import importlib
import uuid
from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest
from side_by_side import OURS, TORCH, outcome, same

pytestmark = pytest.mark.timeout(120)

SIDES = [TORCH, OURS]


def _modules(side: str) -> tuple[ModuleType, ModuleType, ModuleType]:
    return (
        importlib.import_module(f"{side}.rendezvous"),
        importlib.import_module(f"{side}.rendezvous.dynamic_rendezvous"),
        importlib.import_module(f"{side}.rendezvous.c10d_rendezvous_backend"),
    )


def _handler(side: str, **conf: str) -> Any:
    rendezvous, dynamic, c10d = _modules(side)
    params = rendezvous.RendezvousParameters(
        "c10d", "127.0.0.1:0", f"dyn-{uuid.uuid4().hex[:8]}", 1, 1, is_host="true", **conf
    )
    backend, store = c10d.create_backend(params)
    return dynamic.create_handler(store, backend, params)


def _one_round(side: str) -> dict[str, Any]:
    handler = _handler(
        side, join_timeout="50", last_call_timeout="60", close_timeout="70", local_addr="127.0.0.2"
    )
    seen: dict[str, Any] = {
        "backend": handler.get_backend(),
        "use_agent_store": handler.use_agent_store,
    }
    info = handler.next_rendezvous()
    seen["round"] = (info.rank, info.world_size, type(info.store).__name__)
    seen["master_addr"] = info.bootstrap_store_info.master_addr
    seen["shutdown"] = (handler.shutdown(), handler.shutdown())
    return seen


def test_one_node_round_and_shutdown_as_torchs() -> None:
    theirs, ours = (_one_round(side) for side in SIDES)
    assert (
        ours
        == theirs
        == {
            "backend": "c10d",
            "use_agent_store": True,
            "round": (0, 1, "PrefixStore"),
            "master_addr": "127.0.0.2",
            "shutdown": (True, True),
        }
    )


@pytest.mark.parametrize(("min_nodes", "max_nodes"), [(0, 1), (-10, 1), (3, 2)])
def test_from_backend_refuses_node_counts_as_torchs(min_nodes: int, max_nodes: int) -> None:
    got = []
    for side in SIDES:
        rendezvous, dynamic, c10d = _modules(side)
        params = rendezvous.RendezvousParameters(
            "c10d", "127.0.0.1:0", "dyn-counts", 1, 1, is_host="true"
        )
        backend, store = c10d.create_backend(params)
        timeout = dynamic.RendezvousTimeout()
        got.append(
            outcome(
                lambda d=dynamic, s=store, b=backend, t=timeout: (
                    d.DynamicRendezvousHandler.from_backend(
                        "dyn-counts", s, b, min_nodes, max_nodes, timeout=t
                    )
                )
            )
        )
    same(*got)


def test_create_handler_timeouts_as_torchs_in_each_ones_settings() -> None:
    """The same timeouts, read from each one's ``settings`` (torch's a ``RendezvousTimeout``, ours
    seconds: a documented difference)."""
    theirs = _handler(TORCH, join_timeout="50", last_call_timeout="60", close_timeout="70")
    ours = _handler(OURS, join_timeout="50", last_call_timeout="60", close_timeout="70")
    timeout = theirs.settings.timeout
    assert (timeout.join, timeout.last_call, timeout.close) == (
        timedelta(seconds=50),
        timedelta(seconds=60),
        timedelta(seconds=70),
    )
    settings = ours.settings
    assert (settings.join_timeout_s, settings.last_call_timeout_s, settings.close_timeout_s) == (
        50,
        60,
        70,
    )
    assert not hasattr(settings, "timeout")  # the docs' row: ours holds seconds
    theirs.shutdown()
    ours.shutdown()


def test_shutdown_leaves_without_closing_where_torchs_closes() -> None:
    """A documented difference: torch's ``shutdown()`` closes the rendezvous; ours leaves."""
    closed = []
    for side in SIDES:
        handler = _handler(side)
        handler.next_rendezvous()
        handler.shutdown()
        closed.append(handler.is_closed())
    assert closed == [True, False]


def test_torch_disable_share_rdzv_tcp_store_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A documented difference: torch's handler reads the variable, ours does not."""
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    answers = []
    for side in SIDES:
        handler = _handler(side)
        answers.append(handler.use_agent_store)
        handler.shutdown()
    assert answers == [False, True]
