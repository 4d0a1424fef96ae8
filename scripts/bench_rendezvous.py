"""Benchmark one rendezvous round of N nodes: ours against torch's DynamicRendezvousHandler.

N simulated nodes (threads spread over ``--procs`` processes, each thread with its own
handler and its own store connections) complete one round with min = max = N on one
TCPStore. For each N it prints the seconds from "go" to the last node's return, the store
operations per node during that window, and the ratio of the two times.

- ours: ``elastic_run.rendezvous.dynamic.create_handler`` over ``create_c10d_backend``
  (or over one local etcd with ``--backend etcd``, and then again on c10d beside it);
  operations counted by wrapping our backend (every call of the RendezvousBackend seam is one
  store operation; ``get_many`` and ``set_many`` are one trip each).
- torch: ``torch.distributed.elastic.rendezvous.dynamic_rendezvous.create_handler`` over
  torch's ``C10dRendezvousBackend``; operations counted by wrapping its ``_call_store``
  (the store calls of its state blob). Its bootstrap-store exchange on the round's store is
  not counted. Torch runs up to ``--torch-max-n`` nodes.

A TCPStore client's reverse DNS lookup stalls for about 5 s under many concurrent
connects, so the script runs itself in a fresh network namespace with only loopback
(``unshare -n``) when it is root and ``unshare`` exists; pass ``--no-unshare`` to skip.

    PYTHONPATH=. .venv/bin/python scripts/bench_rendezvous.py
    PYTHONPATH=. .venv/bin/python scripts/bench_rendezvous.py --n 8,128 --backend etcd

No assertions: figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench_netns import reexec_in_netns

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


# -- counting wrappers ---------------------------------------------------------------------


def _counting_backend(inner: Any) -> Any:
    """Wrap one of our RendezvousBackends so that every call of the seam is counted."""
    from elastic_run.rendezvous.backend import RendezvousBackend

    class CountingBackend(RendezvousBackend):
        def __init__(self) -> None:
            self.ops = 0
            self.bytes = 0
            self.by_op: dict[str, list[int]] = {}  # method -> [calls, bytes]
            self._lock = threading.Lock()

        def _count(self, op: str, nbytes: int = 0) -> None:
            with self._lock:
                self.ops += 1
                self.bytes += nbytes
                tally = self.by_op.setdefault(op, [0, 0])
                tally[0] += 1
                tally[1] += nbytes

        @property
        def name(self) -> str:
            return str(inner.name)

        @property
        def endpoint(self) -> str:
            return str(inner.endpoint)

        def get(self, key: str) -> bytes | None:
            value: bytes | None = inner.get(key)
            self._count("get", len(key) + len(value or b""))
            return value

        def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
            values: list[bytes | None] = inner.get_many(keys)
            self._count("get_many", sum(map(len, keys)) + sum(len(v or b"") for v in values))
            return values

        def set(self, key: str, value: bytes) -> None:
            self._count("set", len(key) + len(value))
            inner.set(key, value)

        def set_many(self, items: Mapping[str, bytes]) -> None:
            self._count("set_many", sum(len(k) + len(v) for k, v in items.items()))
            inner.set_many(items)

        def add(self, key: str, delta: int) -> int:
            self._count("add", len(key))
            return int(inner.add(key, delta))

        def compare_set(
            self, key: str, expected: bytes | None, desired: bytes
        ) -> tuple[bytes, bool]:
            stored, written = inner.compare_set(key, expected, desired)
            self._count("compare_set", len(key) + len(expected or b"") + len(desired) + len(stored))
            return stored, written

        def wait_for(self, keys: Sequence[str], timeout_s: float) -> bool:
            self._count("wait_for", sum(map(len, keys)))
            return bool(inner.wait_for(keys, timeout_s))

        def heartbeat(self, node_id: str) -> None:
            self._count("heartbeat", len(node_id))
            inner.heartbeat(node_id)

        def read_heartbeats(self, node_ids: Sequence[str]) -> list[int | None]:
            self._count("read_heartbeats", sum(map(len, node_ids)))
            result: list[int | None] = inner.read_heartbeats(node_ids)
            return result

        def forget_node(self, node_id: str) -> None:
            self._count("forget_node", len(node_id))
            inner.forget_node(node_id)

        def round_store(self, prefix: str) -> Any:
            return inner.round_store(prefix)

        def close(self) -> None:
            inner.close()

    return CountingBackend()


def _counting_torch_backend(store: Any, run_id: str) -> Any:
    """torch's C10dRendezvousBackend with its store calls counted."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )

    class CountingTorchBackend(C10dRendezvousBackend):  # type: ignore[misc]
        ops = 0
        bytes = 0

        def _call_store(self, store_op: str, *args: Any, **kwargs: Any) -> Any:
            result = super()._call_store(store_op, *args, **kwargs)
            self.ops += 1
            sizes = [len(a) for a in (*args, result) if isinstance(a, (bytes, str))]
            self.bytes += sum(sizes)
            return result

    return CountingTorchBackend(store, run_id)


# -- one child process: k simulated nodes --------------------------------------------------


def _child(args: argparse.Namespace) -> None:
    from torch.distributed import TCPStore

    from elastic_run.rendezvous.api import RendezvousParameters

    control = TCPStore(
        "127.0.0.1", args.control_port, is_master=False, timeout=timedelta(seconds=600)
    )
    n, count = args.n, args.count
    # Whole seconds: torch reads join_timeout with get_as_int ("120.0" raises ValueError).
    conf = {"join_timeout": str(int(args.timeout)), "last_call_timeout": "30"}
    handlers: list[Any] = []
    counters: list[Any] = []

    def build(_: int) -> tuple[Any, Any]:
        if args.impl == "ours":
            from elastic_run.rendezvous.dynamic import create_handler
            from elastic_run.rendezvous.registry import create_backend

            params = RendezvousParameters(
                args.backend,
                args.endpoint,
                args.run_id,
                n,
                n,
                local_addr="127.0.0.1",
                is_host="false",
                **conf,
            )
            backend = _counting_backend(create_backend(params))
            return create_handler(backend, params), backend
        from torch.distributed.elastic.rendezvous import RendezvousParameters as TorchParams
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            create_handler as torch_create_handler,
        )

        host, port = args.endpoint.rsplit(":", 1)
        store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=600))
        backend = _counting_torch_backend(store, args.run_id)
        params = TorchParams("c10d", args.endpoint, args.run_id, n, n, "127.0.0.1", **conf)
        return torch_create_handler(store, backend, params), backend

    built: list[tuple[Any, Any] | None] = [None] * count

    def build_into(i: int) -> None:
        built[i] = build(i)

    # Connecting is not part of the figure: build every handler before "go".
    builders = [threading.Thread(target=build_into, args=(i,)) for i in range(count)]
    for t in builders:
        t.start()
    for t in builders:
        t.join()
    for pair in built:
        assert pair is not None
        handlers.append(pair[0])
        counters.append(pair[1])

    go = threading.Event()
    ends: list[float] = [0.0] * count
    ops: list[int] = [0] * count
    nbytes: list[int] = [0] * count
    ranks: list[int] = [-1] * count
    errors: list[str] = []
    start_ops: list[tuple[int, int]] = []
    start_by_op: list[dict[str, list[int]]] = []
    by_op: dict[str, list[int]] = {}
    by_op_lock = threading.Lock()

    def node(i: int) -> None:
        go.wait()
        try:
            info = handlers[i].next_rendezvous()
            ranks[i] = info.rank
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            errors.append(f"{type(exc).__name__}: {exc}")
        ends[i] = time.monotonic()
        ops[i] = counters[i].ops - start_ops[i][0]
        nbytes[i] = counters[i].bytes - start_ops[i][1]
        with by_op_lock:
            for op, (calls, size) in getattr(counters[i], "by_op", {}).items():
                before = start_by_op[i].get(op, [0, 0])
                tally = by_op.setdefault(op, [0, 0])
                tally[0] += calls - before[0]
                tally[1] += size - before[1]

    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    control.set(f"ready/{args.child_index}", "1")
    control.wait(["go"])
    start_ops.extend((c.ops, c.bytes) for c in counters)
    start_by_op.extend({op: list(t) for op, t in getattr(c, "by_op", {}).items()} for c in counters)
    go.set()
    for t in threads:
        t.join(args.timeout + 30)
    result = {
        "ends": ends,
        "ops": ops,
        "bytes": nbytes,
        "ranks": ranks,
        "errors": errors[:3],
        "by_op": by_op,
    }
    control.set(f"result/{args.child_index}", json.dumps(result))
    # Stay in the job until every node returned, so no member leaves a round others still form.
    control.wait(["finish"])
    for h in handlers:
        try:
            h.shutdown()
        except Exception:  # noqa: BLE001, S110 - the figure is taken; leave quietly
            pass
    os._exit(0)


# -- the parent: one trial per (implementation, N) -----------------------------------------


def _trial(
    impl: str, n: int, procs: int, timeout_s: float, backend: str, etcd_endpoint: str
) -> dict[str, Any]:
    from torch.distributed import TCPStore

    control = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    control.set_timeout(timedelta(seconds=timeout_s + 60))
    # "ours" runs on ``backend``; "ours-c10d" (beside an etcd run) and "torch" on a TCPStore.
    child_impl = "torch" if impl == "torch" else "ours"
    child_backend = backend if impl == "ours" else "c10d"
    if child_backend == "c10d":
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        endpoint = f"127.0.0.1:{store.port}"
    else:
        store = None
        endpoint = etcd_endpoint
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    procs = max(1, min(procs, n))
    counts = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    children = []
    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR")
    for i, count in enumerate(counts):
        command = [
            sys.executable,
            __file__,
            "--child",
            "--impl",
            child_impl,
            "--backend",
            child_backend,
            "--endpoint",
            endpoint,
            "--run-id",
            run_id,
            "--n",
            str(n),
            "--count",
            str(count),
            "--child-index",
            str(i),
            "--control-port",
            str(control.port),
            "--timeout",
            str(timeout_s),
        ]
        children.append(subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True))
    try:
        control.wait([f"ready/{i}" for i in range(procs)])
        t0 = time.monotonic()
        control.set("go", "1")
        keys = [f"result/{i}" for i in range(procs)]
        try:
            control.wait(keys, timedelta(seconds=timeout_s + 30))
        except Exception as exc:  # noqa: BLE001
            return {"impl": impl, "n": n, "error": f"no result within {timeout_s:g} s ({exc})"}
        results = [json.loads(control.get(k)) for k in keys]
    finally:
        control.set("finish", "1")
        for child in children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        del store
    ends = [e for r in results for e in r["ends"]]
    ops = [o for r in results for o in r["ops"]]
    nbytes = [b for r in results for b in r["bytes"]]
    ranks = sorted(x for r in results for x in r["ranks"])
    errors = [e for r in results for e in r["errors"]]
    if errors or ranks != list(range(n)):
        return {"impl": impl, "n": n, "error": (errors or ["ranks are not 0..N-1"])[0][:120]}
    by_op: dict[str, list[int]] = {}
    for r in results:
        for op, (calls, size) in r.get("by_op", {}).items():
            tally = by_op.setdefault(op, [0, 0])
            tally[0] += calls
            tally[1] += size
    return {
        "impl": impl,
        "n": n,
        "by_op": {op: (calls / n, size / n / 1000) for op, (calls, size) in by_op.items()},
        "seconds": max(ends) - t0,
        "ops_per_node": sum(ops) / n,
        "kb_per_node": sum(nbytes) / n / 1000,
    }


_LABELS = {"ours": "ours", "ours-c10d": "ours on c10d", "torch": "torch"}


def _table(rows: list[dict[str, Any]], ns: list[int], impls: list[str]) -> str:
    by = {(r["impl"], r["n"]): r for r in rows}
    head = ["   N"]
    for what, unit in (("s", "s"), ("ops/node", "ops"), ("KB/node", "KB")):
        head += [f"{_LABELS[i]} ({unit})" if what == "s" else f"{_LABELS[i]} {what}" for i in impls]
    head.append("torch/ours")
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("-" * (len(h) + 1) + ":" for h in head) + "|",
    ]

    def cell(r: dict[str, Any] | None, key: str, fmt: str) -> str:
        if r is None:
            return "-"
        if "error" in r:
            return "fail"
        return format(r[key], fmt)

    for n in ns:
        found = {i: by.get((i, n)) for i in impls}
        cells = [f"{n:4d}"]
        for key, fmt in (("seconds", ".2f"), ("ops_per_node", ".1f"), ("kb_per_node", ".1f")):
            cells += [cell(found[i], key, fmt) for i in impls]
        ours, theirs = found.get("ours"), found.get("torch")
        ratio = "-"
        if ours and theirs and "error" not in ours and "error" not in theirs:
            ratio = f"{theirs['seconds'] / ours['seconds']:.1f}x"
        cells.append(ratio)
        lines.append(
            "| " + " | ".join(c.rjust(len(h)) for c, h in zip(cells, head, strict=True)) + " |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", default="8,32,128,512,1024", help="comma-separated node counts")
    parser.add_argument("--procs", type=int, default=4, help="processes the nodes spread over")
    parser.add_argument("--torch-max-n", type=int, default=128, help="largest N torch runs at")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per trial")
    parser.add_argument("--backend", choices=["c10d", "etcd"], default="c10d")
    parser.add_argument("--no-unshare", action="store_true", help="stay in this network")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", default="ours", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", default="", help=argparse.SUPPRESS)
    parser.add_argument("--run-id", default="", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--child-index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--control-port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.n = int(args.n)
        _child(args)
        return
    if not args.no_unshare:
        reexec_in_netns(__file__)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    ns = [int(x) for x in args.n.split(",") if x]
    etcd_endpoint = ""
    server = None
    if args.backend == "etcd":
        from elastic_run.rendezvous.etcd_server import EtcdServer

        server = EtcdServer(members=1)
        server.start(timeout_s=60)
        etcd_endpoint = server.endpoint
    impls = ["ours", "ours-c10d", "torch"] if args.backend == "etcd" else ["ours", "torch"]
    rows: list[dict[str, Any]] = []
    try:
        for n in ns:
            for impl in impls:
                if impl == "torch" and n > args.torch_max_n:
                    continue
                row = _trial(impl, n, args.procs, args.timeout, args.backend, etcd_endpoint)
                rows.append(row)
                shown = row.get("error") or (
                    f"{row['seconds']:.2f} s, {row['ops_per_node']:.1f} ops/node"
                )
                print(f"  {impl:9s} N={n:4d}: {shown}", file=sys.stderr, flush=True)
                if row.get("by_op"):
                    parts = ", ".join(
                        f"{op} {calls:.1f} ({kb:.2f} KB)"
                        for op, (calls, kb) in sorted(row["by_op"].items())
                    )
                    print(f"    per node: {parts}", file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.stop()
    print(f"backend: {args.backend} (ours), c10d TCPStore (torch); {os.cpu_count()} CPUs")
    print(_table(rows, ns, impls))


if __name__ == "__main__":
    main()
