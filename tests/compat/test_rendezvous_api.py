"""The rendezvous API as torch's rendezvous page documents it, on real c10d stores.

From the docs: ``RendezvousParameters`` rejects an empty backend and node counts that are not
``0 < min <= max`` with ValueError, as ``get_as_bool``/``get_as_int`` do for bad values; the
registry's ``create_handler`` raises ValueError for an unknown backend and RuntimeError when a
creator returns a handler of another backend; ``c10d_rendezvous_backend.create_backend(params)
-> (backend, store)`` takes ``store_type`` (tcp|file), a positive ``read_timeout`` and
``is_host``; ``C10dRendezvousBackend(store, run_id)``; ``DynamicRendezvousHandler.from_backend(
run_id, store, backend, min_nodes, max_nodes, local_addr=None, timeout=None,
keep_alive_interval=5, keep_alive_max_attempt=3)`` with ``RendezvousTimeout(join, last_call,
close, heartbeat)``; ``create_handler(store, backend, params)``; ``RendezvousStoreInfo`` with
``MASTER_ADDR_KEY``/``MASTER_PORT_KEY`` and ``build(rank, store, local_addr, server_port=None)``.
Where torch's own call is cheap to make, it runs beside ours.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import FileStore, TCPStore

from elastic_run.rendezvous.api import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
)
from elastic_run.rendezvous.c10d import backend as c10d
from elastic_run.rendezvous.c10d.backend import C10dRendezvousBackend
from elastic_run.rendezvous.dynamic.handler import DynamicRendezvousHandler, create_handler
from elastic_run.rendezvous.errors import RendezvousConnectionError
from elastic_run.rendezvous.registry import RendezvousHandlerRegistry, get_rendezvous_handler
from elastic_run.rendezvous.settings import RendezvousTimeout
from elastic_run.rendezvous.static import StaticRendezvousHandler
from tests.helpers import free_port, join_into, wait_until

pytestmark = pytest.mark.timeout(120)


def run_id() -> str:
    return f"compat-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def tcp_store() -> Iterator[TCPStore]:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield store


# -- RendezvousParameters --------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "min_nodes", "max_nodes"), [("", 1, 1), ("c10d", 0, 1), ("c10d", 3, 2)]
)
def test_bad_parameters_are_value_errors_as_in_torch(
    backend: str, min_nodes: int, max_nodes: int
) -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters as Theirs

    for cls in (RendezvousParameters, Theirs):
        with pytest.raises(ValueError):
            cls(backend, "localhost:0", "job", min_nodes, max_nodes)


def test_config_values_read_as_bool_and_int_as_in_torch() -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters as Theirs

    for cls in (RendezvousParameters, Theirs):
        params: Any = cls("c10d", "h:1", "job", 1, 2, a="YES", b="0", n="12", bad="maybe")
        assert params.get_as_bool("a") is True and params.get_as_bool("b") is False
        assert params.get_as_bool("absent", True) is True
        assert params.get_as_int("n") == 12 and params.get_as_int("absent") is None
        assert params.get("n") == "12" and params.get("absent", 5) == 5
        with pytest.raises(ValueError):
            params.get_as_bool("bad")
        with pytest.raises(ValueError):
            params.get_as_int("bad")


# -- the registry -------------------------------------------------------------------------


def test_an_unknown_backend_is_a_value_error() -> None:
    params = RendezvousParameters("no-such-backend", "h:1", run_id(), 1, 1)
    with pytest.raises(ValueError, match="no-such-backend"):
        get_rendezvous_handler(params)


def test_a_creator_that_builds_another_backend_is_a_runtime_error() -> None:
    registry = RendezvousHandlerRegistry()

    def creator(params: RendezvousParameters) -> RendezvousHandler:
        return StaticRendezvousHandler(params.run_id, "127.0.0.1", free_port(), 0, 1, 10.0)

    registry.register("mine", creator)
    registry.register("mine", creator)  # the same creator again: fine
    with pytest.raises(ValueError):
        registry.register("mine", lambda p: creator(p))
    with pytest.raises(RuntimeError, match="'static'"):
        registry.create_handler(RendezvousParameters("mine", "", run_id(), 1, 1))
    registry.register("static", creator)
    assert registry.create_handler(RendezvousParameters("static", "", run_id(), 1, 1))


def test_get_rendezvous_handler_builds_a_working_c10d_handler() -> None:
    params = RendezvousParameters("c10d", "127.0.0.1:0", run_id(), 1, 1, join_timeout="30")
    handler = get_rendezvous_handler(params)
    try:
        assert isinstance(handler, DynamicRendezvousHandler)
        assert handler.get_backend() == "c10d" and handler.get_run_id() == params.run_id
        info = handler.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
        assert handler.num_nodes_waiting() == 0 and not handler.is_closed()
        handler.set_closed()
        assert handler.is_closed()
    finally:
        handler.shutdown()


# -- c10d create_backend --------------------------------------------------------------------


def test_c10d_create_backend_returns_the_backend_and_its_whole_store() -> None:
    params = RendezvousParameters("c10d", "127.0.0.1:0", run_id(), 1, 1, is_host="true")
    backend, store = c10d.create_backend(params)
    try:
        assert isinstance(backend, C10dRendezvousBackend) and backend.is_hosting
        assert isinstance(store, TCPStore)
        assert backend.endpoint == f"127.0.0.1:{store.port}"
        store.set("outside/key", "v")  # the whole store, not the backend's prefixed view
        assert store.get("outside/key") == b"v"
    finally:
        backend.close()


def test_c10d_create_backend_on_a_file_store(tmp_path: Path) -> None:
    path = tmp_path / "rdzv"
    params = RendezvousParameters("c10d", str(path), run_id(), 1, 1, store_type="FILE")
    backend, store = c10d.create_backend(params)
    assert isinstance(store, FileStore)
    assert backend.endpoint == f"file:{path}"
    backend.close()


@pytest.mark.parametrize(
    "conf", [{"read_timeout": "0"}, {"read_timeout": "-3"}, {"store_type": "redis"}]
)
def test_c10d_create_backend_rejects_bad_config_with_value_error(conf: dict[str, str]) -> None:
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as theirs

    for create in (c10d.create_backend, theirs.create_backend):
        params = RendezvousParameters(
            "c10d", f"127.0.0.1:{free_port()}", run_id(), 1, 1, is_host="false", **conf
        )
        with pytest.raises(ValueError):
            create(params)


def test_c10d_create_backend_raises_a_connection_error_for_no_store() -> None:
    params = RendezvousParameters(
        "c10d", f"127.0.0.1:{free_port()}", run_id(), 1, 1, is_host="false", read_timeout="2"
    )
    with pytest.raises(RendezvousConnectionError) as caught:
        c10d.create_backend(params)
    assert type(caught.value) is RendezvousConnectionError  # never a raw DistNetworkError


# -- from_backend, create_handler, a real two-node round -----------------------------------


def join_all(handlers: list[DynamicRendezvousHandler]) -> list[RendezvousInfo]:
    results: dict[int, RendezvousInfo] = {}
    errors: list[BaseException] = []

    def join(i: int) -> None:
        try:
            results[i] = handlers[i].next_rendezvous()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(i,)) for i in range(len(handlers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    return [results[i] for i in range(len(handlers))]


def test_two_nodes_meet_through_from_backend_on_a_two_argument_c10d_backend(
    tcp_store: TCPStore,
) -> None:
    job = run_id()
    timeout = RendezvousTimeout(join=timedelta(seconds=60), last_call=timedelta(seconds=1))
    clients = [tcp_store, TCPStore("127.0.0.1", tcp_store.port, is_master=False)]
    handlers = [
        DynamicRendezvousHandler.from_backend(
            job,
            store,
            C10dRendezvousBackend(store, job),
            2,
            2,
            timeout=timeout,
            keep_alive_interval=1,
            keep_alive_max_attempt=3,
        )
        for store in clients
    ]
    try:
        assert handlers[0].backend.endpoint == f"127.0.0.1:{tcp_store.port}"
        infos = join_all(handlers)
        assert sorted(i.rank for i in infos) == [0, 1]
        assert {i.world_size for i in infos} == {2}
        infos[0].store.set("hello", "from 0")
        assert infos[1].store.get("hello") == b"from 0"  # one store per round, shared
        # RendezvousStoreInfo.build agrees on one address over the round's store (rank 0's
        # values replace what the handler published there):
        built = [
            RendezvousStoreInfo.build(i.rank, i.store, "10.0.0.7", server_port=29511)
            for i in sorted(infos, key=lambda i: i.rank)
        ]
        assert built == [RendezvousStoreInfo("10.0.0.7", 29511)] * 2
        handlers[1].set_closed()
        assert handlers[0].is_closed()
    finally:
        for h in handlers:
            h.shutdown()


def _bootstrap_facts(infos: list[Any]) -> tuple[Any, ...]:
    """What a caller of ``next_rendezvous`` may rely on in ``bootstrap_store_info``."""
    where = [i.bootstrap_store_info for i in infos]
    first = where[0]
    published = [
        (bytes(i.store.get("MASTER_ADDR")).decode(), int(bytes(i.store.get("MASTER_PORT"))))
        for i in infos
    ]
    return (
        sorted(i.rank for i in infos),
        type(first).__name__,
        len({(w.master_addr, w.master_port) for w in where}),  # the same on every node
        first.master_addr,
        isinstance(first.master_port, int) and 0 < first.master_port < 65536,
        set(published) == {(first.master_addr, first.master_port)},  # as rank 0 published
    )


def test_next_rendezvous_gives_every_node_rank_0s_bootstrap_address_as_torchs_does(
    tcp_store: TCPStore,
) -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters as TheirParameters
    from torch.distributed.elastic.rendezvous.registry import (
        get_rendezvous_handler as their_handler,
    )

    from elastic_run.elastic.rendezvous import RendezvousParameters as MirrorParameters
    from elastic_run.elastic.rendezvous.registry import get_rendezvous_handler as mirror_handler

    facts = []
    for params, create in ((TheirParameters, their_handler), (MirrorParameters, mirror_handler)):
        job = run_id()
        endpoint = f"127.0.0.1:{tcp_store.port}"
        conf = {"join_timeout": "60", "is_host": "false"}
        handlers = [
            create(params("c10d", endpoint, job, 2, 2, local_addr="127.0.0.1", **conf))
            for _ in range(2)
        ]
        try:
            facts.append(_bootstrap_facts(join_all(handlers)))
        finally:
            for h in handlers:
                h.shutdown()
    assert facts[1] == facts[0], facts


def test_a_node_waiting_for_rank_0s_address_obeys_its_interrupt(tcp_store: TCPStore) -> None:
    """Rank 0 under our agent (a change callback) publishes no bootstrap address; a plain
    handler user of rank 1 waits for it as for anything else: in slices, until its interrupt
    check (or the join deadline) ends the wait, never for the store's own 60 s timeout."""
    from elastic_run.rendezvous.errors import RendezvousInterruptedError

    for _ in range(5):  # until the agent's node arrived first and so holds rank 0
        job, stop = run_id(), threading.Event()
        conf = {"join_timeout": "60", "is_host": "false"}
        params = RendezvousParameters("c10d", f"127.0.0.1:{tcp_store.port}", job, 2, 2, **conf)
        agent, plain = get_rendezvous_handler(params), get_rendezvous_handler(params)
        assert isinstance(agent, DynamicRendezvousHandler)
        assert isinstance(plain, DynamicRendezvousHandler)
        agent.set_change_callback(lambda: None)
        plain.set_interrupt(stop.is_set)
        outcome: dict[str, Any] = {}
        first = threading.Thread(target=join_into, args=(outcome, "agent", agent))
        first.start()
        wait_until(agent.snapshot, 30, message="the agent's node arrived")
        second = threading.Thread(target=join_into, args=(outcome, "plain", plain))
        second.start()
        try:
            first.join(60)
            info = outcome["agent"]
            assert not isinstance(info, BaseException), info
            assert info.bootstrap_store_info is None  # our agent hosts its workers' store
            if info.rank != 0:
                continue  # the plain node holds rank 0 and published: try again
            assert second.is_alive()  # waiting for an address nobody publishes
            stop.set()
            second.join(30)
            assert isinstance(outcome.get("plain"), RendezvousInterruptedError), outcome
            return
        finally:
            stop.set()
            second.join(30)
            agent.shutdown()
            plain.shutdown()
    raise AssertionError("the agent's node never held rank 0 in 5 jobs")


def test_create_handler_takes_torchs_argument_order(tcp_store: TCPStore) -> None:
    job = run_id()
    params = RendezvousParameters("c10d", "", job, 1, 1, join_timeout="45", last_call_timeout="2")
    handler = create_handler(tcp_store, C10dRendezvousBackend(tcp_store, job), params)
    try:
        assert handler.settings.join_timeout_s == 45 and handler.settings.last_call_timeout_s == 2
        assert handler.next_rendezvous().world_size == 1
    finally:
        handler.shutdown()


def test_rendezvous_timeout_defaults_match_torchs() -> None:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        RendezvousTimeout as Theirs,
    )

    ours, theirs = RendezvousTimeout(), Theirs()
    for name in ("join", "last_call", "close", "heartbeat"):
        assert getattr(ours, name) == getattr(theirs, name), name
    custom = RendezvousTimeout(heartbeat=timedelta(seconds=2))
    assert custom.heartbeat == timedelta(seconds=2) and custom.join == timedelta(minutes=10)
    with pytest.raises(ValueError):
        RendezvousTimeout(join=timedelta(0))


# -- a torch-style backend ------------------------------------------------------------------


class TorchStyleBackend:
    """What torch's docs ask of a custom RendezvousBackend: a name and one state blob."""

    name = "mine"

    def get_state(self) -> tuple[bytes, Any] | None:
        return None

    def set_state(self, state: bytes, token: Any = None) -> tuple[bytes, Any, bool] | None:
        return None


def _torchs_own_backend(store: TCPStore) -> Any:
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend as Theirs,
    )

    return Theirs(store, "job")


@pytest.mark.parametrize("make", [lambda s: TorchStyleBackend(), _torchs_own_backend])
def test_a_torch_style_backend_is_a_type_error_naming_what_ours_needs(
    tcp_store: TCPStore, make: Callable[[TCPStore], Any]
) -> None:
    backend = make(tcp_store)
    params = RendezvousParameters("mine", "", "job", 1, 1)
    for build in (
        lambda: DynamicRendezvousHandler.from_backend("job", tcp_store, backend, 1, 1),
        lambda: create_handler(tcp_store, backend, params),
    ):
        with pytest.raises(TypeError) as caught:
            build()
        text = str(caught.value)
        assert "get_state/set_state" in text
        for method in ("compare_set", "wait_for", "heartbeat", "read_heartbeats", "round_store"):
            assert method in text


# -- RendezvousStoreInfo -------------------------------------------------------------------


def test_store_info_keys_and_build_interoperate_with_torchs(tcp_store: TCPStore) -> None:
    from torch.distributed import PrefixStore
    from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo as Theirs

    assert RendezvousStoreInfo.MASTER_ADDR_KEY == Theirs.MASTER_ADDR_KEY == "MASTER_ADDR"
    assert RendezvousStoreInfo.MASTER_PORT_KEY == Theirs.MASTER_PORT_KEY == "MASTER_PORT"

    store = PrefixStore(f"{run_id()}/", tcp_store)
    mine = RendezvousStoreInfo.build(0, store, "node0.example")  # rank 0: a free port here
    theirs = Theirs.build(1, store, "node1.example")  # torch's rank 1 reads what ours wrote
    assert mine.master_addr == theirs.master_addr == "node0.example"
    assert mine.master_port == theirs.master_port and 0 < mine.master_port < 65536
