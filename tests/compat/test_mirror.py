"""elastic_run.elastic mirrors torch.distributed.elastic: the same modules, names and calls.

(a) Every public name of each mirrored torch module (its ``__all__``, else the classes and
functions it defines) exists in ours with the same kind and a signature that accepts every
call torch's does; the names left out on purpose are in one table, each with its reason (the
README's "Python API" table says the same). (b) Public calls run side by side on torch's object
and on ours, comparing what comes back: the result, or the exception (ours must be an instance
of torch's type), on real stores, FIFOs and processes.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from side_by_side import OURS, TORCH, both, outcome, same, torch_module

MIRRORED = [
    "rendezvous",
    "rendezvous.api",
    "rendezvous.registry",
    "rendezvous.dynamic_rendezvous",
    "rendezvous.c10d_rendezvous_backend",
    "rendezvous.etcd_rendezvous_backend",
    "rendezvous.etcd_store",
    "rendezvous.etcd_server",
    "rendezvous.static_tcp_rendezvous",
    "rendezvous.utils",
    "agent.server",
    "agent.server.api",
    "agent.server.local_elastic_agent",
    "agent.server.health_check_server",
    "timer",
    "timer.api",
    "timer.file_based_local_timer",
    "multiprocessing",
    "multiprocessing.api",
    "multiprocessing.errors",
    "multiprocessing.errors.error_handler",
    "multiprocessing.errors.handlers",
    "events",
    "events.api",
    "events.handlers",
    "metrics",
    "metrics.api",
]

# torch's modules with no counterpart at all, and why.
MODULES_LEFT_OUT = {
    "rendezvous.etcd_rendezvous": "torch's etcd v2 handler: the v2 API is gone from current etcd; "
    "`etcd`/`etcd-v2` run the dynamic handler on etcd v3",
    "timer.local_timer": "timers over a multiprocessing queue: workers here are separate "
    "processes of the agent, served by the file timer",
    "timer.debug_info_logging": "one logging helper of torch's timer server: the watchdog logs "
    "each expiry and kill itself",
    "multiprocessing.subprocess_handler": "torch's process-launch layer (see start_processes)",
    "multiprocessing.tail_log": "torch's process-launch layer (see start_processes)",
    "multiprocessing.redirects": "torch's process-launch layer (see start_processes)",
    "utils": "torch's internal helpers (macros, free ports, store barriers), not an API of the "
    "launcher",
    "control_plane": "torch's worker-side debug server, independent of the launcher",
}

_LAUNCH = "torch's process-launch layer: the agent supervises its workers itself (sessions, the "
_LAUNCH += "guardian, warm starts) and offers no public process API"
_TIMERS = "the abstract timer server and the multiprocessing-queue timers: only the file timer, "
_TIMERS += "the one torchrun's agent serves, is kept"
# (torch's module, name) -> why ours has no such name.
NAMES_LEFT_OUT: dict[tuple[str, str], str] = {
    **{
        (module, name): _LAUNCH
        for module, extra in (
            ("multiprocessing", "start_processes"),
            ("multiprocessing.api", "get_std_cm"),
        )
        for name in (
            extra,
            "MultiprocessContext",
            "PContext",
            "RunProcsResult",
            "SignalException",
            "SubprocessContext",
            "to_map",
        )
    },
    **{
        (module, name): _TIMERS
        for module, names in (
            ("timer", ("LocalTimerClient", "LocalTimerServer", "TimerRequest", "TimerServer")),
            ("timer.api", ("RequestQueue", "TimerRequest", "TimerServer")),
        )
        for name in names
    },
    ("rendezvous.dynamic_rendezvous", "RendezvousSettings"): "ours holds every --rdzv-conf key "
    "in seconds, parsed once (elastic_run.rendezvous.settings); torch's dataclass of timedeltas "
    "is taken by nothing of ours",
    ("rendezvous.etcd_store", "cas_delay"): "the v2 store's internal back-off",
    ("rendezvous.etcd_server", "find_free_port"): "a helper of torch's tests",
    ("rendezvous.etcd_server", "stop_etcd"): "a helper of torch's tests; EtcdServer.stop",
    ("agent.server.local_elastic_agent", "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT"): "not "
    "read: the agent's shutdown is bounded by --shutdown-timeout",
}

# (torch's module, name) -> why the constructor differs (the class's other calls are torch's).
CONSTRUCTORS_DIFFER = {
    **{
        (module, "DynamicRendezvousHandler"): "built with from_backend or create_handler, as torch "
        "documents; torch's __init__ takes its private node and state holder"
        for module in ("rendezvous.dynamic_rendezvous",)
    },
    **{
        (module, "EtcdRendezvousBackend"): "takes an etcd v3 client; no ttl: liveness is a lease "
        "of the handler's keep-alive budget; torch's takes a v2 client"
        for module in ("rendezvous", "rendezvous.etcd_rendezvous_backend")
    },
}

# (torch's module, name) -> parameters whose default differs on purpose (README's table).
DEFAULTS_DIFFER: dict[tuple[str, str], frozenset[str]] = {
    ("agent.server.local_elastic_agent", "LocalElasticAgent"): frozenset({"logs_specs"}),
    **{
        (module, "RendezvousInfo"): frozenset({"bootstrap_store_info"})
        for module in ("rendezvous", "rendezvous.api")
    },
    **{
        (module, name): frozenset({"filtered_stdout", "filtered_stderr"})
        for module in ("multiprocessing", "multiprocessing.api")
        for name in ("DefaultLogsSpecs", "LogsDest", "LogsSpecs")
    },
}


def _public_names(module: ModuleType) -> list[str]:
    """Its ``__all__``, else the classes and functions defined in it (or, for a package, in
    its submodules)."""
    declared = getattr(module, "__all__", None)
    if declared is not None:
        return list(declared)
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (
            (
                (inspect.isclass(value) or inspect.isfunction(value))
                and getattr(value, "__module__", "").startswith(module.__name__)
            )
            or (name.isupper() and type(value) in (int, str))
        )
    )


def _kind(value: object) -> str:
    if inspect.isclass(value):
        return "class"
    if callable(value):
        return "function"
    return "value"


def _callable_of(value: Any) -> Any:
    return value.__init__ if inspect.isclass(value) else value


def _accepts_every_call(theirs: Any, ours: Any, differ: frozenset[str]) -> list[str]:
    """What keeps a call written against ``theirs`` from binding to ``ours`` the same way."""
    try:
        their_params = inspect.signature(theirs).parameters
        our_params = inspect.signature(ours).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return []
    problems: list[str] = []
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    our_list = list(our_params.values())
    for index, (name, p) in enumerate(their_params.items()):
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            if not any(q.kind is inspect.Parameter.VAR_KEYWORD for q in our_list):
                problems.append("no **kwargs")
            continue
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        q = our_params.get(name)
        if q is None:
            problems.append(f"lacks {name!r}")
            continue
        if p.kind in positional and (our_list.index(q) != index or q.kind not in positional):
            problems.append(f"{name!r} is not positional at {index}")
        if name in differ:
            continue
        if p.default is not inspect.Parameter.empty and q.default is inspect.Parameter.empty:
            problems.append(f"{name!r}: required here, optional in torch's")
        elif p.default is not inspect.Parameter.empty and p.default != q.default:
            problems.append(f"{name!r}: default {q.default!r}, torch's {p.default!r}")
    for name, q in our_params.items():
        if name not in their_params and q.default is inspect.Parameter.empty:
            if q.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL):
                problems.append(f"adds {name!r} without a default")
    return problems


def _pairs() -> Iterator[tuple[str, str]]:
    for rel in MIRRORED:
        try:
            module = importlib.import_module(f"{TORCH}.{rel}")
        except ImportError:
            yield rel, "*"  # skipped at run time with the reason
            continue
        for name in _public_names(module):
            if (rel, name) not in NAMES_LEFT_OUT:
                yield rel, name


@pytest.mark.parametrize(("rel", "name"), list(_pairs()), ids=lambda x: str(x))
def test_every_public_name_of_torch_is_ours_with_its_kind_and_signature(
    rel: str, name: str
) -> None:
    theirs_module = torch_module(rel)
    ours_module = importlib.import_module(f"{OURS}.{rel}")
    assert name in getattr(ours_module, "__all__", ()), f"{OURS}.{rel} does not export {name}"
    theirs, ours = getattr(theirs_module, name), getattr(ours_module, name)
    assert _kind(ours) == _kind(theirs), (name, _kind(ours), _kind(theirs))
    if _kind(theirs) == "value":
        if isinstance(theirs, (str, int, float)):
            assert ours == theirs, (name, ours, theirs)
        else:  # an instance, e.g. the handler registry: of the class of the same name
            assert type(ours).__name__ == type(theirs).__name__, (name, ours, theirs)
        return
    if (rel, name) in CONSTRUCTORS_DIFFER:
        return
    differ = DEFAULTS_DIFFER.get((rel, name), frozenset())
    problems = _accepts_every_call(_callable_of(theirs), _callable_of(ours), differ)
    assert not problems, f"{OURS}.{rel}.{name}: {problems}"


@pytest.mark.parametrize("rel", MIRRORED)
def test_ours_exports_only_torchs_names(rel: str) -> None:
    """Name for name: nothing in a mirror module that torch's lacks, nothing it lacks unlisted."""
    theirs = set(_public_names(torch_module(rel)))
    ours = set(importlib.import_module(f"{OURS}.{rel}").__all__)
    assert ours <= theirs, sorted(ours - theirs)
    left_out = {name for (module, name) in NAMES_LEFT_OUT if module == rel}
    assert theirs - ours == left_out, sorted(theirs - ours ^ left_out)


def _find(name: str) -> object:
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:  # its parent package does not exist
        return None


def test_the_tables_name_only_what_torch_has() -> None:
    for rel in MODULES_LEFT_OUT:
        assert _find(f"{TORCH}.{rel}") is not None, f"torch has no {rel}"
        assert _find(f"{OURS}.{rel}") is None, f"{rel} is mirrored: take it off the table"
    for rel, name in NAMES_LEFT_OUT:
        assert rel in MIRRORED, rel
        try:
            module = importlib.import_module(f"{TORCH}.{rel}")
        except ImportError:
            continue
        assert name in _public_names(module), (rel, name)


def test_importing_the_mirror_is_cheap() -> None:
    code = (
        "import sys, elastic_run.elastic.rendezvous, elastic_run.elastic.agent.server, "
        "elastic_run.elastic.timer, elastic_run.elastic.multiprocessing, "
        "elastic_run.elastic.events, elastic_run.elastic.metrics, "
        "elastic_run.elastic.rendezvous.dynamic_rendezvous, elastic_run.elastic.agent.server.api,"
        " elastic_run.elastic.multiprocessing.errors\n"
        "print(sorted(m for m in ('torch', 'grpc', 'pyetcd') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- (b) side by side


CONF_VALUES = [
    "1",
    "0",
    "true",
    "False",
    "T",
    "f",
    "YES",
    "no",
    "y",
    "N",
    "2",
    "-3",
    "x",
    "1.5",
    " 7 ",
    "",
]


@pytest.mark.parametrize("value", CONF_VALUES)
@pytest.mark.parametrize("getter", ["get_as_bool", "get_as_int", "get"])
def test_rendezvous_parameters_read_values_as_torchs_do(getter: str, value: str) -> None:
    theirs, ours = both("rendezvous")
    results = []
    for side in (theirs, ours):
        params = outcome(
            lambda side=side: side.RendezvousParameters("c10d", "h:1", "r", 1, 2, k=value)
        )
        if params[0] == "raised":
            results.append(params)
            continue
        results.append(outcome(lambda made=params[1]: getattr(made, getter)("k")))
    same(*results)
    missing = [
        getattr(s.RendezvousParameters("c10d", "h:1", "r", 1, 2), getter) for s in (theirs, ours)
    ]
    same(outcome(lambda: missing[0]("absent")), outcome(lambda: missing[1]("absent")))


@pytest.mark.parametrize(
    ("backend", "endpoint", "min_nodes", "max_nodes"),
    [("", "h", 1, 1), ("c10d", "h", 0, 1), ("c10d", "h", 2, 1), ("c10d", "", 1, 1)],
)
def test_rendezvous_parameters_refuse_what_torchs_refuse(
    backend: str, endpoint: str, min_nodes: int, max_nodes: int
) -> None:
    theirs, ours = both("rendezvous")
    same(
        *(
            outcome(
                lambda s=s: (
                    s.RendezvousParameters(backend, endpoint, "r", min_nodes, max_nodes) and None
                )
            )
            for s in (theirs, ours)
        )
    )


ENDPOINTS = [
    None,
    "",
    "  ",
    "host",
    "host:123",
    "10.0.0.1:29400",
    "[::1]:7",
    "[::1]",
    "h:0",
    "h:65535",
    "h:65536",
    "h:-1",
    "h:x",
    "h:",
    "bad host:1",
    "a/b",
    " host:5 ",
]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("default_port", [29400, -1])
def test_parse_rendezvous_endpoint_as_torchs(endpoint: str | None, default_port: int) -> None:
    theirs, ours = both("rendezvous.utils")
    same(
        outcome(lambda: theirs.parse_rendezvous_endpoint(endpoint, default_port)),
        outcome(lambda: ours.parse_rendezvous_endpoint(endpoint, default_port)),
    )


@pytest.mark.parametrize(
    "conf",
    [
        {"is_host": "true"},
        {"is_host": "1", "read_timeout": "7"},
        {"is_host": "true", "read_timeout": "0"},
        {"is_host": "true", "read_timeout": "x"},
        {"is_host": "maybe"},
        {"store_type": "bogus"},
    ],
    ids=str,
)
def test_c10d_create_backend_on_a_real_tcpstore_as_torchs(conf: dict[str, str]) -> None:
    theirs, ours = both("rendezvous.c10d_rendezvous_backend")
    results = []
    for side in (theirs, ours):
        params = importlib.import_module(side.__name__.rsplit(".", 1)[0]).RendezvousParameters(
            "c10d", "127.0.0.1:0", "mirror-c10d", 1, 1, **conf
        )
        got = outcome(lambda side=side, params=params: side.create_backend(params))
        if got[0] == "value":
            backend, store = got[1]
            assert type(backend).__name__ == "C10dRendezvousBackend"
            assert backend.name == "c10d"
            # The store is served: a client of it reads what the returned store wrote.
            from torch.distributed import TCPStore

            store.set("mirror/key", b"v")
            client = TCPStore(
                store.host, store.port, is_master=False, timeout=timedelta(seconds=30)
            )
            assert client.get("mirror/key") == b"v"
            got = ("value", (type(store).__name__, store.host, store.timeout))
        results.append(got)
    same(*results)
    assert theirs.DEFAULT_PORT == ours.DEFAULT_PORT == 29400


def test_c10d_create_backend_on_a_file_store_as_torchs(tmp_path: Path) -> None:
    theirs, ours = both("rendezvous.c10d_rendezvous_backend")
    kinds = []
    for side, path in ((theirs, tmp_path / "theirs"), (ours, tmp_path / "ours")):
        params = importlib.import_module(side.__name__.rsplit(".", 1)[0]).RendezvousParameters(
            "c10d", str(path), "mirror-file", 1, 1, store_type="file"
        )
        backend, store = side.create_backend(params)
        store.set("k", b"v")
        kinds.append((type(store).__name__, store.get("k"), path.exists()))
    assert kinds[0] == kinds[1] == ("FileStore", b"v", True)


@pytest.mark.parametrize("conf", [{}, {"read_timeout": "10"}], ids=str)
def test_c10d_file_store_timeout_as_torchs(tmp_path: Path, conf: dict[str, str]) -> None:
    """torch leaves a FileStore at its own 300 s when no read_timeout is given (its test:
    ``_expected_read_timeout = timedelta(seconds=300)``); a read_timeout torch ignores there is
    honoured by ours (the docs' table)."""
    theirs, ours = both("rendezvous.c10d_rendezvous_backend")
    timeouts = []
    for side, path in ((theirs, tmp_path / "theirs"), (ours, tmp_path / "ours")):
        params = importlib.import_module(side.__name__.rsplit(".", 1)[0]).RendezvousParameters(
            "c10d", str(path), "mirror-file", 1, 1, store_type="file", **conf
        )
        _, store = side.create_backend(params)
        timeouts.append(store.timeout)
    if conf:
        assert timeouts == [timedelta(seconds=300), timedelta(seconds=10)]
    else:
        assert timeouts[0] == timeouts[1] == timedelta(seconds=300)


def test_c10d_create_backend_without_a_port_hosts_on_29400_as_torchs() -> None:
    """An endpoint with no port is that host at port 29400, on both (one at a time)."""
    import gc
    import socket

    from tests.helpers import wait_until

    def port_free() -> bool:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", 29400))
            except OSError:
                return False
            return True

    if not port_free():
        pytest.skip("port 29400 is taken on this host")
    theirs, ours = both("rendezvous.c10d_rendezvous_backend")
    got = []
    for side in (theirs, ours):
        params = importlib.import_module(side.__name__.rsplit(".", 1)[0]).RendezvousParameters(
            "c10d", "127.0.0.1", "mirror-port", 1, 1, is_host="true"
        )
        backend, store = side.create_backend(params)
        got.append((type(store).__name__, store.host, store.port, store.timeout))
        del backend, store
        gc.collect()
        wait_until(port_free, 30, "the store on port 29400 to close")
    assert got[0] == got[1] == ("TCPStore", "127.0.0.1", 29400, timedelta(seconds=60))


@pytest.mark.parametrize(
    ("endpoint", "conf"),
    [
        ("127.0.0.1:29500", {}),  # no rank
        ("", {"rank": "0"}),  # no endpoint
        ("127.0.0.1", {"rank": "0"}),  # no port
        ("127.0.0.1:70000", {"rank": "0"}),  # a bad port
    ],
)
def test_static_rendezvous_refuses_what_torchs_refuses(endpoint: str, conf: dict[str, str]) -> None:
    theirs, ours = both("rendezvous.static_tcp_rendezvous")
    outcomes = []
    for side in (theirs, ours):
        params = importlib.import_module(side.__name__.rsplit(".", 1)[0]).RendezvousParameters(
            "static", endpoint, "mirror-static", 1, 1, **conf
        )
        outcomes.append(outcome(lambda side=side, params=params: side.create_rdzv_handler(params)))
    assert outcomes[0][0] == "raised"
    same(*outcomes)


def test_static_rendezvous_on_one_node_as_torchs() -> None:
    """The handlers agree on every public attribute; the round itself runs on ours only: on
    this host torch 2.13's own static handler times out connecting to the multi-tenant store it
    has just hosted."""
    from tests.helpers import free_port

    theirs, ours = both("rendezvous.static_tcp_rendezvous")
    port = free_port()
    handlers = [
        side.create_rdzv_handler(
            importlib.import_module(side.__name__.rsplit(".", 1)[0]).RendezvousParameters(
                "static", f"127.0.0.1:{port}", "mirror-static", 1, 1, rank="0", timeout="30"
            )
        )
        for side in (theirs, ours)
    ]
    facts = [
        (
            h.get_backend(),
            h.get_run_id(),
            h.use_agent_store,
            # torch keeps the rank as the config string; ours is the int
            (h.master_addr, h.master_port, int(h.rank), h.world_size, h.run_id, h.timeout),
        )
        for h in handlers
    ]
    assert facts[0] == facts[1]
    assert facts[1][3][-1] == timedelta(seconds=30)
    handler = handlers[1]
    info = handler.next_rendezvous()
    info.store.set("k", b"v")
    assert (info.rank, info.world_size, info.store.get("k")) == (0, 1, b"v")
    assert info.bootstrap_store_info is not None
    assert (info.bootstrap_store_info.master_addr, info.bootstrap_store_info.master_port) == (
        "127.0.0.1",
        port,
    )
    assert (handler.num_nodes_waiting(), handler.is_closed()) == (0, False)
    handler.shutdown()


# timers -------------------------------------------------------------------------------------


def test_expires_without_a_client_raises_torchs_runtime_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    theirs, ours = both("timer")
    monkeypatch.delenv("TORCHELASTIC_TIMER_FILE", raising=False)
    theirs.configure(None)
    ours.configure(None)

    def enter(side: ModuleType) -> Callable[[], None]:
        def call() -> None:
            with side.expires(after=5):
                pass

        return call

    same(outcome(enter(theirs)), outcome(enter(ours)))
    assert outcome(enter(ours))[0] == "raised"


@pytest.mark.parametrize("pipe", ["missing", "no reader"])
def test_a_timer_client_with_no_server_raises_torchs_broken_pipe(tmp_path: Path, pipe: str) -> None:
    theirs, ours = both("timer")
    path = tmp_path / "timer.fifo"
    if pipe == "no reader":
        os.mkfifo(path)
    for call in ("acquire", "release"):
        outcomes = []
        for side in (theirs, ours):
            client = side.FileTimerClient(str(path))
            args = ("scope", 1e12) if call == "acquire" else ("scope",)
            method = getattr(client, call)
            outcomes.append(outcome(lambda method=method, args=args: method(*args)))
        assert outcomes[0][0] == "raised" and isinstance(outcomes[0][1], BrokenPipeError)
        same(*outcomes)


def test_timer_requests_serialize_as_torchs() -> None:
    theirs, ours = both("timer")
    made = [s.FileTimerRequest(123, "scope", 1700000000.5, signal.SIGKILL) for s in (theirs, ours)]
    assert made[0].to_json() == made[1].to_json()
    assert made[1] == ours.FileTimerRequest(123, "scope", 1700000000.5, signal.SIGKILL)


def test_file_timer_server_run_once_serves_what_is_written_then_stops(tmp_path: Path) -> None:
    """torch's run_once: process the requests written so far (a due timer's process is killed),
    then stop and remove the FIFO. torch's server signals its own process after a kill, so only
    ours runs here; torch's is run against it in test_timer_api.py."""
    _, ours = both("timer")
    path = tmp_path / "timer.fifo"
    events: list[str] = []
    server = ours.FileTimerServer(
        str(path), "mirror", max_interval=30, log_event=lambda name, request: events.append(name)
    )
    server.start()
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        try:
            due = ours.FileTimerRequest(victim.pid, "due", 1.0, signal.SIGKILL).to_json()
            later = ours.FileTimerRequest(os.getpid(), "later", 4e9, signal.SIGKILL).to_json()
            os.write(fd, (due + "\n" + later + "\n").encode())
        finally:
            os.close(fd)
        server.run_once()
        assert victim.wait(timeout=60) == -signal.SIGKILL
        assert not path.exists()
        assert [(t.pid, t.scope_id) for t in server.armed_timers()] == [(os.getpid(), "later")]
        assert events == ["watchdog started", "timer expired", "kill worker process"]
    finally:
        victim.kill()
        victim.wait()
        server.stop()


# metrics and events -------------------------------------------------------------------------


def _recorder(side: ModuleType, into: list[tuple[str, str, int]]) -> Any:
    class Recorder(side.MetricHandler):  # type: ignore[name-defined,misc]
        def emit(self, metric_data: Any) -> None:
            into.append((metric_data.group_name, metric_data.name, metric_data.value))

    return Recorder()


def test_put_metric_and_prof_reach_the_configured_handler_as_torchs() -> None:
    theirs, ours = both("metrics")
    seen: list[list[tuple[str, str, int]]] = []
    for side in (theirs, ours):
        got: list[tuple[str, str, int]] = []
        side.configure(_recorder(side, got))  # the default handler
        grouped: list[tuple[str, str, int]] = []
        side.configure(_recorder(side, grouped), group="mine")
        side.put_metric("a", 1)
        side.put_metric("b", 2, "mine")
        side.getStream("other").add_value("c", 3)

        @side.prof
        def ok() -> int:
            return 5

        @side.prof(group="mine")
        def bad() -> None:
            raise KeyError("x")

        assert ok() == 5
        with pytest.raises(KeyError):
            bad()
        side.configure(side.NullMetricHandler())
        side.configure(side.NullMetricHandler(), group="mine")
        side.put_metric("dropped", 1)
        # A duration's value is a time: compare that it is a whole number of ms, not the value.
        assert all(v >= 0 for _, n, v in got + grouped if n.endswith(".duration.ms"))
        seen.append([(g, n, -1 if n.endswith(".duration.ms") else v) for g, n, v in got + grouped])
    assert seen[0] == seen[1]
    assert ("torchelastic", "a", 1) in seen[1]


def test_events_serialize_and_log_as_torchs() -> None:
    theirs, ours = both("events")
    made = [
        (
            s.Event("e", s.EventSource.AGENT, 5, {"k": 1, "s": "v", "n": None}),
            s.RdzvEvent("n", "run", "msg", "host", 7, s.NodeState.RUNNING, rank=2),
        )
        for s in (theirs, ours)
    ]
    for (t_event, t_rdzv), (o_event, o_rdzv) in [made]:
        assert o_event.serialize() == t_event.serialize() == str(o_event)
        assert o_rdzv.serialize() == t_rdzv.serialize()
        assert ours.Event.deserialize(t_event.serialize()) == o_event
        assert ours.RdzvEvent.deserialize(t_rdzv.serialize()) == o_rdzv
    for destination in ("null", "dynamic_rendezvous", "console", "no-such"):
        same(
            outcome(lambda d=destination: type(theirs.get_logging_handler(d)).__name__),
            outcome(lambda d=destination: type(ours.get_logging_handler(d)).__name__),
        )
    same(
        outcome(lambda: theirs.record(made[0][0], "no-such")),
        outcome(lambda: ours.record(made[1][0], "no-such")),
    )
    # Recorded to a destination with a handler: one JSON line, the event's serialization.
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    from elastic_run.torch_events import set_logging_handler

    set_logging_handler("mirror-test", Collect())
    ours.record(made[1][0], "mirror-test")
    ours.record(made[1][0])  # null: nowhere
    assert lines == [made[0][0].serialize()]
    # The rendezvous destination is a NullHandler until set: nothing is built or logged.
    ours.construct_and_record_rdzv_event("run", "m", ours.NodeState.INIT)
    set_logging_handler("dynamic_rendezvous", Collect())
    try:
        ours.construct_and_record_rdzv_event("run", "m", ours.NodeState.INIT, rank=1)
    finally:
        set_logging_handler("dynamic_rendezvous", logging.NullHandler())
    event = ours.RdzvEvent.deserialize(lines[-1])
    assert (event.name, event.run_id, event.pid, event.rank) == (
        "test_mirror.py:test_events_serialize_and_log_as_torchs",
        "run",
        os.getpid(),
        1,
    )
