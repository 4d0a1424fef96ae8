"""Benchmark one rendezvous round of N nodes built as a user's agent builds them, ours beside torch's.

Every node is one thread holding a handler made exactly as an agent makes it, through the public
registry (ours: ``elastic_run.rendezvous.registry.rendezvous_handler_registry``, torch's:
``torch.distributed.elastic.rendezvous.rendezvous_handler_registry``)::

    create_handler(RendezvousParameters("c10d", endpoint, run_id, N, N, local_addr="127.0.0.1",
                                        is_host="false", join_timeout="120"))

``--procs`` processes (default 4) hold N/procs nodes each; one TCPStore server (this process)
holds the store. Nothing wraps the handler or its backend: store traffic is counted by the
kernel at the server's port (``ss -ti``: data segments and bytes each server-side connection
received between "go" and the last return), so it counts what reached the server, and nothing
the handler sees changes.

Per trial it prints the node return times from "go" (first, median, p90, last), the members
declared gone (the handlers' own "member ... is gone" warnings, counted by a log handler) and
every other warning or error seen, the rounds formed, the threads each node adds to its process
(Python threads and OS threads), the store traffic per node, and the time each node's
``shutdown()`` took (all nodes shut down at once). After the last return every node stays in
its round for ``--hold`` seconds (heartbeating, watching its ring) before the shutdown, so a
false verdict after completion is seen too. ``--load`` keeps one core busy for the whole trial
(a busy-looping process).

Torch's handler runs at each N up to ``--torch-max-n`` with ``--torch-timeout``; a failure is
reported as it came (torch 2.13 fails from about 160 nodes on this machine).

A TCPStore client's reverse DNS lookup stalls for about 5 s under many concurrent connects, so
the script runs itself in a fresh loopback-only network namespace (``unshare -n`` and
``ip link set lo up``) when it is root; ``--no-unshare`` skips that.

    .venv/bin/python scripts/bench_rendezvous.py --n 128,1024,4096
    .venv/bin/python scripts/bench_rendezvous.py --n 1024 --load

No assertions: figures only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench_netns import reexec_in_netns

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

_GONE = re.compile(r"member .* is gone")


class _LogTally(logging.Handler):
    """Counts warnings and errors by their message template; 'is gone' verdicts apart."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.gone = 0
        self.by_msg: dict[str, int] = {}
        self._tally_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        with self._tally_lock:
            if _GONE.search(text):
                self.gone += 1
            key = f"{record.levelname} {record.name}: {str(record.msg)[:90]}"
            self.by_msg[key] = self.by_msg.get(key, 0) + 1


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


# -- one child process: `count` nodes ------------------------------------------------------


def _build(impl: str, args: argparse.Namespace) -> Any:
    conf = {"local_addr": "127.0.0.1", "is_host": "false", "join_timeout": str(int(args.timeout))}
    if args.backend != "c10d":
        del conf["is_host"]  # a c10d key
    if impl == "ours":
        from elastic_run.rendezvous.api import RendezvousParameters
        from elastic_run.rendezvous.registry import rendezvous_handler_registry

        params = RendezvousParameters(
            args.backend, args.endpoint, args.run_id, args.n, args.n, **conf
        )
        return rendezvous_handler_registry.create_handler(params)
    from torch.distributed.elastic.rendezvous import RendezvousParameters as TorchParams
    from torch.distributed.elastic.rendezvous import (
        rendezvous_handler_registry as torch_registry,
    )

    tparams = TorchParams("c10d", args.endpoint, args.run_id, args.n, args.n, **conf)
    return torch_registry.create_handler(tparams)


def _as_the_agent(impl: str, handler: Any) -> None:
    """What an agent tells its handler before joining (ours; torch's agent tells it nothing)."""
    if impl != "ours":
        return
    from elastic_run.rendezvous.api import AgentRendezvous, InterruptibleRendezvous

    if isinstance(handler, AgentRendezvous):
        handler.set_local_info(1, "default")
        handler.set_change_callback(lambda: None)
    if isinstance(handler, InterruptibleRendezvous):
        handler.set_interrupt(lambda: False)


def _exchange(impl: str, handler: Any, info: Any) -> Any:
    """The agent's store exchange after a round, on the round's store; returns a server to keep.

    Ours: ``assign_ranks`` and ``share_workers_store`` as the agent's ``_rendezvous`` calls them
    (node 0 hosts the workers' store, every other node reads where). Torch's:
    ``SimpleElasticAgent._assign_worker_ranks`` of a ``LocalElasticAgent`` built on the handler
    (role infos to the store, node 0 reads them all and writes every node's ranks).
    """
    if impl == "ours":
        from elastic_run.agent.loop.ranks import assign_ranks, share_workers_store
        from elastic_run.elastic.agent.server.api import WorkerGroup, WorkerSpec

        spec = WorkerSpec(role="default", local_world_size=1, rdzv_handler=handler, entrypoint="x")
        group = WorkerGroup(spec)
        group.store, group.group_rank = info.store, info.rank
        group.group_world_size = info.world_size
        assign_ranks(group, handler.assignment, lambda: False)
        if info.bootstrap_store_info is not None:
            return None
        return share_workers_store(info.store, info.rank, "127.0.0.1", lambda: None)[2]
    from torch.distributed.elastic.agent.server.api import WorkerSpec as TorchSpec
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    tspec = TorchSpec(role="default", local_world_size=1, rdzv_handler=handler, entrypoint="x")
    agent = LocalElasticAgent(tspec, DefaultLogsSpecs())
    agent._assign_worker_ranks(info.store, info.rank, info.world_size, tspec)  # noqa: SLF001
    return None


def _preimport(impl: str) -> None:
    """Import what a node's code imports, as an agent has before it builds its handler."""
    if impl == "ours":
        import elastic_run.agent.loop.ranks
        import elastic_run.elastic.agent.server.api
        import elastic_run.rendezvous.registry  # noqa: F401
    else:
        import torch.distributed.elastic.agent.server.local_elastic_agent
        import torch.distributed.elastic.rendezvous  # noqa: F401


def _child(args: argparse.Namespace) -> None:
    from torch.distributed import TCPStore

    _preimport(args.impl)

    tally = _LogTally()
    for name in ("elastic_run", "torch.distributed"):
        logging.getLogger(name).addHandler(tally)
    logging.getLogger().setLevel(logging.WARNING)
    control = TCPStore(
        "127.0.0.1", args.control_port, is_master=False, timeout=timedelta(seconds=900)
    )
    count = args.count
    py0, os0 = threading.active_count(), _os_threads()
    built: list[Any] = [None] * count

    # The start gate is a pipe every node reads one byte of: "go" is one write, and the kernel
    # wakes the readers. A shared Event wakes its waiters one at a time (each takes the
    # Event's lock in turn, behind every busy thread of the process), which put tens of
    # seconds between the first and the last node's start at N=4096; one Event per node, set
    # in turn by this process's main thread, put seconds there when the nodes started first
    # held the GIL (torch's caller: straight into next_rendezvous), as the main thread waited
    # for it between two sets.
    gate_r, gate_w = os.pipe()
    starts: list[float] = [0.0] * count
    ends: list[float] = [0.0] * count
    ranks: list[int] = [-1] * count
    rounds: list[int] = [-1] * count
    connected: list[float] = [0.0] * count
    ready: list[float] = [0.0] * count
    errors: list[str] = []
    keep: list[Any] = []  # node 0's workers' store server, kept for the hold

    as_torch = args.caller == "torch"
    built_ok = [threading.Event() for _ in range(count)]

    def node(i: int) -> None:
        if as_torch:  # torch's call sequence: the handler exists before the clock starts
            try:
                built[i] = _build(args.impl, args)
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                errors.append(f"{type(exc).__name__}: {str(exc)[:160]}")
            built_ok[i].set()
        os.read(gate_r, 1)
        starts[i] = time.monotonic()
        try:
            if as_torch:
                handler = built[i]
                if handler is None:
                    return
                connected[i] = time.monotonic()
                info = handler.next_rendezvous()  # and nothing else
                ends[i] = ready[i] = time.monotonic()
                ranks[i] = info.rank
                rounds[i] = int(getattr(info, "round", -1) or 0)
                return
            built[i] = handler = _build(args.impl, args)  # connecting is part of the figure
            connected[i] = time.monotonic()
            _as_the_agent(args.impl, handler)
            info = handler.next_rendezvous()
            ends[i] = time.monotonic()
            ranks[i] = info.rank
            rounds[i] = int(getattr(info, "round", -1) or 0)
            server = _exchange(args.impl, handler, info)
            if server is not None:
                keep.append(server)
            ready[i] = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            errors.append(f"{type(exc).__name__}: {str(exc)[:160]}")
            ends[i] = ends[i] or time.monotonic()

    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    if as_torch:
        for event in built_ok:
            event.wait()
    control.set(f"ready/{args.child_index}", "1")
    control.wait(["go"])
    os.write(gate_w, b"g" * count)
    for t in threads:
        t.join(args.timeout + 30)
    control.set(
        f"result/{args.child_index}",
        json.dumps(
            {
                "starts": starts,
                "connected": connected,
                "ends": ends,
                "ready": ready,
                "ranks": ranks,
                "rounds": rounds,
                "errors": sorted(set(errors))[:5],
            }
        ),
    )
    control.wait(["hold-over"])
    # Threads each node adds, measured while every node is in its round (callers returned).
    py_per_node = (threading.active_count() - py0) / max(1, count)
    os_per_node = (_os_threads() - os0) / max(1, count)
    gone, by_msg = tally.gone, dict(tally.by_msg)
    control.set(
        f"during/{args.child_index}",
        json.dumps({"gone": gone, "warnings": by_msg, "py": py_per_node, "os": os_per_node}),
    )
    control.wait(["finish"])
    shut: list[float] = [-1.0] * count
    shut_errors: list[str] = []

    def shutdown(i: int) -> None:
        t0 = time.monotonic()
        try:
            built[i].shutdown()
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            shut_errors.append(f"{type(exc).__name__}: {exc}")
        shut[i] = time.monotonic() - t0

    closers = [
        threading.Thread(target=shutdown, args=(i,)) for i in range(count) if built[i] is not None
    ]
    keep.clear()
    for t in closers:
        t.start()
    for t in closers:
        t.join(120)
    control.set(f"shut/{args.child_index}", json.dumps({"shut": shut, "errors": shut_errors[:3]}))
    os._exit(0)


# -- the parent: one trial per (implementation, N) -----------------------------------------


def _server_traffic(ports: list[int]) -> tuple[int, int, int]:
    """(connections, data segments in, bytes in) of the servers' established connections."""
    where = " or ".join(f"sport = :{p}" for p in ports)
    out = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( {where} )"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    conns = sum(1 for line in out.splitlines() if line and not line[0].isspace())
    segs = sum(int(x) for x in re.findall(r"data_segs_in:(\d+)", out))
    nbytes = sum(int(x) for x in re.findall(r"bytes_received:(\d+)", out))
    return conns, segs, nbytes


def _wait_results(
    control: Any, store: Any, run_id: str, procs: int, limit_s: float, progress: bool, t0: float
) -> bool:
    """Wait for every child's result; with ``progress``, say what the store holds every 2 s."""
    from torch.distributed import PrefixStore

    view = PrefixStore(f"elastic-run/{run_id}/", store) if progress else None
    wanted = [f"result/{i}" for i in range(procs)]
    while time.monotonic() - t0 < limit_s:
        if control.check(wanted):
            return True
        try:
            control.wait(wanted, timedelta(seconds=2))
            return True
        except Exception:  # noqa: BLE001, S112 - not yet
            pass
        if view is not None:
            seen = {k: view.get(k).decode() if view.check([k]) else "-" for k in _PROGRESS_KEYS}
            print(f"    {time.monotonic() - t0:6.1f} s: {seen}", flush=True)
    return control.check(wanted)


_PROGRESS_KEYS = ("round", "r0/arrivals", "r0/seal", "r0/lost", "r1/arrivals", "epoch")


def _wait_seal(store: Any, run_id: str, sealed: list[float]) -> None:
    from torch.distributed import PrefixStore, TCPStore

    client = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=300))
    try:
        PrefixStore(f"elastic-run/{run_id}/", client).wait(["r0/seal"])
    except Exception:  # noqa: BLE001 - no seal: nothing to say
        return
    sealed.append(time.monotonic())


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    s = sorted(values)
    p90 = s[min(len(s) - 1, int(0.9 * len(s)))]
    return f"{s[0]:.2f}/{statistics.median(s):.2f}/{p90:.2f}/{s[-1]:.2f}"


def _uptime() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def _sched_line(row: dict[str, Any]) -> str:
    if "store_sched" not in row:
        return ""
    ran, waited, span = row["store_sched"]
    return (
        f"    store server threads, go to last return ({span:.2f} s): ran {ran:.2f} s,"
        f" runnable without a CPU {waited:.2f} s\n"
    )


def _tids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _schedstat(tids: list[str]) -> tuple[float, float]:
    """Seconds ``tids`` ran and waited on a run queue (runnable, no CPU), summed."""
    ran = waited = 0.0
    for tid in tids:
        try:
            fields = Path(f"/proc/self/task/{tid}/schedstat").read_text().split()
        except OSError:
            continue
        ran, waited = ran + int(fields[0]) / 1e9, waited + int(fields[1]) / 1e9
    return ran, waited


def _busy() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _trial(impl: str, caller: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    from torch.distributed import PrefixStore, TCPStore

    timeout_s = args.timeout if impl == "ours" else args.torch_timeout
    control = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    control.set_timeout(timedelta(seconds=timeout_s + 900))  # building 4,096 nodes included
    store: Any = None
    server_tids: list[str] = []
    if args.backend == "c10d":
        tids_before = _tids()
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        store.set_timeout(timedelta(seconds=30))
        endpoint, ports = f"127.0.0.1:{store.port}", [store.port]
        server_tids = sorted(_tids() - tids_before)
    else:  # the cluster started once for every trial (main)
        endpoint, ports = args.endpoint, args.etcd_ports
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    procs = max(1, min(args.procs, n))
    counts = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR")
    load = _busy() if args.load else None
    stderr = tempfile.TemporaryFile()  # the children's own output: shown when a trial fails
    children = []
    for i, count in enumerate(counts):
        command = [sys.executable, __file__, "--child", "--impl", impl, "--endpoint", endpoint]
        command += ["--run-id", run_id, "--n", str(n), "--count", str(count)]
        command += ["--child-index", str(i), "--control-port", str(control.port)]
        command += ["--timeout", str(timeout_s), "--caller", caller, "--backend", args.backend]
        if args.nice:  # the simulated nodes yield the CPU to the store's host (--nice)
            command = ["nice", "-n", str(args.nice), *command]
        children.append(subprocess.Popen(command, env=env, stderr=stderr))
    row: dict[str, Any] = {"impl": impl, "n": n, "caller": caller}
    load_at_start = os.getloadavg()[0]
    try:
        control.wait([f"ready/{i}" for i in range(procs)])
        before = _server_traffic(ports)
        sealed: list[float] = []
        if impl == "ours" and store is not None:  # when round 0's seal reached the store
            threading.Thread(target=_wait_seal, args=(store, run_id, sealed), daemon=True).start()
        sched_at_go = _schedstat(server_tids)
        t0 = time.monotonic()
        control.set("go", "1")
        progress = args.progress and store is not None
        if not _wait_results(control, store, run_id, procs, timeout_s + 40, progress, t0):
            row["error"] = f"no result within {timeout_s + 40:g} s"
            return row
        after = _server_traffic(ports)
        if server_tids:
            ran, waited = (b - a for a, b in zip(sched_at_go, _schedstat(server_tids), strict=True))
            row["store_sched"] = (ran, waited, time.monotonic() - t0)
        results = [json.loads(control.get(f"result/{i}")) for i in range(procs)]
        hold_start = time.monotonic()
        hold_end = hold_start + args.hold
        while time.monotonic() < hold_end:  # the figure: what happens while nodes stay
            time.sleep(0.1)
        held = _server_traffic(ports)  # the steady state: every node in its round, beating
        row["steady"] = (held[1] - after[1]) / n / (time.monotonic() - hold_start)
        raw_round = b""
        if impl == "ours" and store is not None:  # the key as our c10d backend names it
            raw_round = PrefixStore(f"elastic-run/{run_id}/", store).get("round")
        control.set("hold-over", "1")
        control.wait([f"during/{i}" for i in range(procs)])
        during = [json.loads(control.get(f"during/{i}")) for i in range(procs)]
        control.set("finish", "1")
        control.wait([f"shut/{i}" for i in range(procs)], timedelta(seconds=180))
        shuts = [json.loads(control.get(f"shut/{i}")) for i in range(procs)]
    finally:
        control.set("finish", "1")
        control.set("hold-over", "1")
        for child in children:
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if load is not None:
            load.kill()
            load.wait()
        stderr.seek(0)
        row["stderr"] = stderr.read().decode(errors="replace").strip().splitlines()[-5:]
        stderr.close()
    ends = [e - t0 for r in results for e in r["ends"] if e > 0]
    connected = [e - t0 for r in results for e in r["connected"] if e > 0]
    ready = [e - t0 for r in results for e in r["ready"] if e > 0]
    starts = [s - t0 for r in results for s in r["starts"] if s > 0]
    ranks = sorted(x for r in results for x in r["ranks"])
    errors = [e for r in results for e in r["errors"]]
    warnings: dict[str, int] = {}
    for d in during:
        for k, v in d["warnings"].items():
            warnings[k] = warnings.get(k, 0) + v
    rounds = [x for r in results for x in r["rounds"]]
    row.update(
        starts=starts,
        connected=connected,
        ends=ends,
        ready=ready,
        load=load_at_start,
        gone=sum(d["gone"] for d in during),
        warnings=warnings,
        rounds=(max(rounds) + 1) if rounds and max(rounds) >= 0 else None,
        store_round=int(raw_round) if raw_round else None,
        py_threads=statistics.mean(d["py"] for d in during),
        os_threads=statistics.mean(d["os"] for d in during),
        segs=(after[1] - before[1]) / n,
        kb=(after[2] - before[2]) / n / 1000,
        conns=after[0],
        sealed=sealed[0] - t0 if sealed else None,
        shut=[s for d in shuts for s in d["shut"] if s >= 0],
        shut_errors=[e for d in shuts for e in d["errors"]],
    )
    row["errors"] = sorted(set(errors))
    if errors or ranks != list(range(n)):
        missing = [f"ranks are not 0..N-1 ({ranks.count(-1)} missing)"]
        row["error"] = (row["errors"] or missing)[0]
    return row


def _print_row(row: dict[str, Any]) -> None:
    label = f"{row['impl']:5s} --caller {row['caller']:5s} N={row['n']:5d}"
    if "error" in row:
        for line in row.get("stderr", []):
            print(f"    stderr: {line[:200]}", flush=True)
    if "ends" not in row:
        print(f"{label}: FAILED: {row['error']}", flush=True)
        return
    status = f"FAILED: {row['error']}" if "error" in row else "ok"
    sealed = f"; round 0 sealed at {row['sealed']:.2f}" if row.get("sealed") else ""
    print(
        f"{label}: {status} (load average {row['load']:.1f} at the start)\n"
        f"    started s (first/median/p90/last): {_spread(row['starts'])}\n"
        f"    connected s (handler built): {_spread(row['connected'])}\n"
        f"    round returned s: {_spread(row['ends'])}"
        f" ({len(row['ends'])} of {row['n']} ended: returned or raised)"
        f"{sealed}\n"
        f"    READY s (store exchange done, first/median/p90/last): {_spread(row['ready'])}"
        f" ({len(row['ready'])} of {row['n']})\n"
        f"    members declared gone: {row['gone']}; rounds formed: {row['rounds'] or '-'}"
        f" (store round at the end of the hold: {row['store_round']})\n"
        f"    threads per node: {row['py_threads']:.2f} Python, {row['os_threads']:.2f} OS;"
        f" server connections {row['conns']}\n"
        f"    store traffic per node (server side): {row['segs']:.1f} data segments,"
        f" {row['kb']:.2f} KB; in the hold: {row['steady']:.2f} segments per node per s\n"
        f"{_sched_line(row)}"
        f"    shutdown s (first/median/p90/last): {_spread(row['shut'])}"
        f"{'; errors: ' + '; '.join(row['shut_errors']) if row['shut_errors'] else ''}",
        flush=True,
    )
    for error in row.get("errors", [])[1:]:
        print(f"    also raised: {error}", flush=True)
    for msg, count in sorted(row["warnings"].items(), key=lambda kv: -kv[1]):
        print(f"    seen {count}x: {msg}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", default="128,1024", help="comma-separated node counts")
    parser.add_argument("--procs", type=int, default=4, help="processes the nodes spread over")
    parser.add_argument("--timeout", type=float, default=120.0, help="join_timeout (ours), s")
    parser.add_argument("--torch-max-n", type=int, default=256, help="largest N torch runs at")
    parser.add_argument("--torch-timeout", type=float, default=60.0, help="torch's join_timeout")
    parser.add_argument("--no-torch", action="store_true", help="run ours only")
    parser.add_argument("--hold", type=float, default=5.0, help="seconds nodes stay after the last")
    parser.add_argument("--runs", type=int, default=1, help="trials of each N, one after another")
    parser.add_argument("--load", action="store_true", help="keep one core busy meanwhile")
    parser.add_argument("--no-unshare", action="store_true", help="stay in this network")
    parser.add_argument("--progress", action="store_true", help="print store keys every 2 s")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run the node processes at this niceness (the store's process stays at 0): on a "
        "real cluster the nodes are other hosts and do not take the store host's CPU",
    )
    parser.add_argument(
        "--caller",
        default="agent,torch",
        help="who drives the handlers, comma-separated: agent (built after go, the agent's calls "
        "and store exchange) and/or torch (built before go, next_rendezvous only)",
    )
    parser.add_argument(
        "--backend",
        default="c10d",
        choices=("c10d", "etcd"),
        help="c10d: one TCPStore server here; etcd: a 3-member etcd cluster started here",
    )
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
    callers = [c for c in args.caller.split(",") if c]
    if not callers or any(c not in ("agent", "torch") for c in callers):
        parser.error(f"--caller: agent and/or torch, not '{args.caller}'")
    if not args.no_unshare:
        reexec_in_netns(__file__)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
        f"{args.procs} processes; hold {args.hold:g} s; one busy core: {args.load}; node processes nice {args.nice}",
        flush=True,
    )
    cluster = None
    if args.backend == "etcd":
        from elastic_run.rendezvous.etcd.server import EtcdServer

        cluster = EtcdServer(members=3)
        cluster.start(timeout_s=60)
        args.endpoint = ",".join(cluster.endpoints)
        args.etcd_ports = [int(e.rsplit(":", 1)[1]) for e in cluster.endpoints]
        if args.torch_max_n > 0 and not args.no_torch:
            print(
                "torch: not run on etcd (its etcd handlers need the python-etcd v2 client, "
                "not installed; its c10d handler needs a TCPStore)",
                flush=True,
            )
            args.no_torch = True
        print(f"etcd: 3 members at {args.endpoint}", flush=True)
    try:
        _run_all(args, callers)
    finally:
        if cluster is not None:
            cluster.stop()


def _run_all(args: argparse.Namespace, callers: list[str]) -> None:
    for n in (int(x) for x in args.n.split(",") if x):
        for run in range(args.runs):
            if args.runs > 1:
                print(f"-- run {run + 1} of {args.runs}", flush=True)
            for caller in callers:
                print(f"   {time.strftime('%H:%M:%S')} uptime: {_uptime()}", flush=True)
                _print_row(_trial("ours", caller, n, args))
                if not args.no_torch and n <= args.torch_max_n:
                    _print_row(_trial("torch", caller, n, args))


if __name__ == "__main__":
    main()
