"""Every documented call of torch.distributed.elastic has our counterpart with its signature.

For each pair, every parameter of torch's (in order, by name and kind) is one of ours with the
same default, so any call written against torch's signature binds to ours the same way. Ours
may add parameters after torch's, with defaults, or keyword-only. The few defaults that differ
on purpose are listed (and in the README's table).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, cast

import pytest

# (torch's module:qualname, ours module:qualname, defaults that differ on purpose)
PAIRS: list[tuple[str, str, frozenset[str]]] = [
    # the agent
    (
        "torch.distributed.elastic.agent.server.local_elastic_agent:LocalElasticAgent.__init__",
        "elastic_run.agent.local:LocalElasticAgent.__init__",
        frozenset({"logs_specs"}),  # optional here: DefaultLogsSpecs() when None
    ),
    (
        "torch.distributed.elastic.agent.server.api:SimpleElasticAgent.__init__",
        "elastic_run.agent.loop.simple:SimpleElasticAgent.__init__",
        frozenset(),
    ),
    *[
        (
            f"torch.distributed.elastic.agent.server.api:SimpleElasticAgent.{name}",
            f"elastic_run.agent.loop.simple:SimpleElasticAgent.{name}",
            frozenset(),
        )
        for name in (
            "_rendezvous",
            "_initialize_workers",
            "_restart_workers",
            "_start_workers",
            "_stop_workers",
            "_monitor_workers",
            "_shutdown",
            "run",
            "get_worker_group",
        )
    ],
    *[
        (
            f"torch.distributed.elastic.agent.server.api:{name}",
            f"elastic_run.agent.api:{name}",
            frozenset(),
        )
        for name in ("WorkerSpec", "Worker", "WorkerGroup", "RunResult")
    ],
    *[
        (
            f"torch.distributed.elastic.multiprocessing:{name}",
            f"elastic_run.agent.workers.logs_specs:{name}",
            frozenset({"filtered_stdout", "filtered_stderr"}),  # "" where torch's factory gives ""
        )
        for name in ("DefaultLogsSpecs", "LogsSpecs", "LogsDest")
    ],
    # multiprocessing.errors
    *[
        (
            f"torch.distributed.elastic.multiprocessing.errors:{name}",
            f"elastic_run.elastic.multiprocessing.errors:{name}",
            frozenset(),
        )
        for name in (
            "record",
            "get_error_handler",
            "ProcessFailure",
            "ProcessFailure.signal_name",
            "ProcessFailure.timestamp_isoformat",
            "ChildFailedError",
            "ChildFailedError.get_first_failure",
            "ChildFailedError.format_msg",
            "ErrorHandler.initialize",
            "ErrorHandler.record_exception",
            "ErrorHandler.dump_error_file",
            "ErrorHandler.override_error_code_in_rootcause_data",
        )
    ],
    # the rendezvous
    (
        "torch.distributed.elastic.rendezvous:RendezvousParameters.__init__",
        "elastic_run.rendezvous.api:RendezvousParameters.__init__",
        frozenset(),
    ),
    *[
        (
            f"torch.distributed.elastic.rendezvous:RendezvousParameters.{name}",
            f"elastic_run.rendezvous.api:RendezvousParameters.{name}",
            frozenset(),
        )
        for name in ("get", "get_as_bool", "get_as_int")
    ],
    *[
        (
            f"torch.distributed.elastic.rendezvous:RendezvousHandlerRegistry.{name}",
            f"elastic_run.rendezvous.registry:RendezvousHandlerRegistry.{name}",
            frozenset(),
        )
        for name in ("register", "create_handler")
    ],
    (
        "torch.distributed.elastic.rendezvous.registry:get_rendezvous_handler",
        "elastic_run.rendezvous.registry:get_rendezvous_handler",
        frozenset(),
    ),
    (
        "torch.distributed.elastic.rendezvous.api:RendezvousStoreInfo.build",
        "elastic_run.rendezvous.api:RendezvousStoreInfo.build",
        frozenset(),
    ),
    (
        "torch.distributed.elastic.rendezvous.api:RendezvousInfo.__init__",
        "elastic_run.rendezvous.api:RendezvousInfo.__init__",
        frozenset({"bootstrap_store_info"}),  # optional here (see the README)
    ),
    (
        "torch.distributed.elastic.rendezvous.dynamic_rendezvous:"
        "DynamicRendezvousHandler.from_backend",
        "elastic_run.rendezvous.dynamic.handler:DynamicRendezvousHandler.from_backend",
        frozenset({"keep_alive_interval", "keep_alive_max_attempt"}),  # ours 1 s and 5 (README)
    ),
    (
        "torch.distributed.elastic.rendezvous.dynamic_rendezvous:create_handler",
        "elastic_run.rendezvous.dynamic.handler:create_handler",
        frozenset(),
    ),
    (
        "torch.distributed.elastic.rendezvous.dynamic_rendezvous:RendezvousTimeout.__init__",
        "elastic_run.rendezvous.settings:RendezvousTimeout.__init__",
        frozenset(),
    ),
    (
        "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend:"
        "C10dRendezvousBackend.__init__",
        "elastic_run.rendezvous.c10d.backend:C10dRendezvousBackend.__init__",
        frozenset(),
    ),
    (
        "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend:create_backend",
        "elastic_run.rendezvous.c10d.backend:create_backend",
        frozenset(),
    ),
    *[
        (
            f"torch.distributed.elastic.rendezvous.etcd_store:EtcdStore.{name}",
            f"elastic_run.rendezvous.etcd.store:EtcdStore.{name}",
            frozenset(),
        )
        for name in ("__init__", "add", "wait")  # torch's names: etcd_client, num, ...
    ],
    *[
        (
            f"torch.distributed.elastic.rendezvous.etcd_server:EtcdServer.{name}",
            f"elastic_run.rendezvous.etcd.server:EtcdServer.{name}",
            frozenset(),
        )
        for name in (
            "__init__",
            "start",
            "stop",
            "get_host",
            "get_port",
            "get_endpoint",
            "get_client",
        )
    ],
]


def _resolve(path: str) -> Callable[..., Any]:
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return cast(Callable[..., Any], obj)


def _missing_default(p: inspect.Parameter) -> bool:
    return p.default is inspect.Parameter.empty


@pytest.mark.parametrize(("theirs_path", "ours_path", "differ"), PAIRS, ids=[p[0] for p in PAIRS])
def test_our_signature_accepts_every_call_torchs_does(
    theirs_path: str, ours_path: str, differ: frozenset[str]
) -> None:
    theirs = inspect.signature(_resolve(theirs_path)).parameters
    ours = inspect.signature(_resolve(ours_path)).parameters
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    our_list = list(ours.values())
    for index, (name, theirs_p) in enumerate(theirs.items()):
        if theirs_p.kind is inspect.Parameter.VAR_KEYWORD:
            assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in our_list), name
            continue
        assert name in ours, f"{ours_path} lacks torch's parameter {name!r}"
        ours_p = ours[name]
        if theirs_p.kind in positional:
            assert our_list.index(ours_p) == index, f"{name!r} is not at position {index}"
            assert ours_p.kind in positional, f"{name!r} must be positional"
        if name in differ:
            continue
        if _missing_default(theirs_p):
            assert _missing_default(ours_p), f"{name!r} has a default here"
        else:
            assert ours_p.default == theirs_p.default, (name, ours_p.default, theirs_p.default)
    for name, ours_p in ours.items():
        if name not in theirs:
            added_ok = (
                not _missing_default(ours_p)
                or ours_p.kind is inspect.Parameter.VAR_KEYWORD
                or ours_p.kind is inspect.Parameter.VAR_POSITIONAL
            )
            assert added_ok, f"{ours_path} adds {name!r} without a default"
