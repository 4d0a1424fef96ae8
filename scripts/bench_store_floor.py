"""The floor under bench_rendezvous.py: bare TCPStore clients doing the fewest requests a round needs.

Same shape as ``bench_rendezvous.py`` (``--procs`` processes x N/procs threads, one TCPStore
server, a loopback-only network namespace, two client connections per node, opened before
"go"), but no rendezvous code: after "go" each thread makes ``--before`` one-request reads
(``compare_set`` peeks) and one ``add`` (its arrival), then blocks in ``wait`` for a "seal"
key that the thread whose ``add`` returned N writes, then makes ``--after`` peeks and returns.
What a rendezvous of N nodes on one TCPStore costs at least on this machine, with
N threads per process sharing an interpreter lock.

    .venv/bin/python scripts/bench_store_floor.py --n 1024,4096

Prints first/median/p90/last return and when the seal was written, per N. No assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from bench_netns import reexec_in_netns

_NEVER = b"\x00never\x00"


def _child(args: argparse.Namespace) -> None:
    from torch.distributed import TCPStore

    control = TCPStore(
        "127.0.0.1", args.control_port, is_master=False, timeout=timedelta(seconds=600)
    )

    def client() -> TCPStore:
        return TCPStore("127.0.0.1", args.port, is_master=False, timeout=timedelta(seconds=300))

    with ThreadPoolExecutor(16) as pool:
        pairs = list(pool.map(lambda _: (client(), client()), range(args.count)))
    gates = [threading.Event() for _ in range(args.count)]
    ends = [0.0] * args.count

    def node(i: int) -> None:
        short, waiter = pairs[i]
        gates[i].wait()
        for k in range(args.before):
            short.compare_set(f"k{k}", _NEVER, _NEVER)
        if short.add("arrivals", 1) == args.n:
            short.set("seal", "1")
        waiter.wait(["seal"])
        for k in range(args.after):
            short.compare_set("seal" if k == 0 else f"k{k}", _NEVER, _NEVER)
        ends[i] = time.monotonic()

    threads = [threading.Thread(target=node, args=(i,)) for i in range(args.count)]
    for t in threads:
        t.start()
    control.set(f"ready/{args.index}", "1")
    control.wait(["go"])
    for g in gates:
        g.set()
    for t in threads:
        t.join()
    control.set(f"result/{args.index}", json.dumps(ends))
    os._exit(0)


def _spread(values: list[float]) -> str:
    s = sorted(values)
    p90 = s[min(len(s) - 1, int(0.9 * len(s)))]
    return f"{s[0]:.2f}/{statistics.median(s):.2f}/{p90:.2f}/{s[-1]:.2f}"


def _trial(n: int, args: argparse.Namespace) -> None:
    from torch.distributed import TCPStore

    control = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    control.set_timeout(timedelta(seconds=900))
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    counts = [n // args.procs + (1 if i < n % args.procs else 0) for i in range(args.procs)]
    children = []
    for i, count in enumerate(counts):
        command = [sys.executable, __file__, "--child", "--n", str(n), "--count", str(count)]
        command += ["--index", str(i), "--port", str(store.port)]
        command += ["--control-port", str(control.port)]
        command += ["--before", str(args.before), "--after", str(args.after)]
        children.append(subprocess.Popen(command))
    control.wait([f"ready/{i}" for i in range(args.procs)])
    sealed: list[float] = []

    def watch_seal() -> None:
        waiter = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=600))
        waiter.wait(["seal"])
        sealed.append(time.monotonic())

    threading.Thread(target=watch_seal, daemon=True).start()
    time.sleep(0.5)  # the seal watcher is connected
    t0 = time.monotonic()
    control.set("go", "1")
    control.wait([f"result/{i}" for i in range(args.procs)])
    ends = [e - t0 for i in range(args.procs) for e in json.loads(control.get(f"result/{i}"))]
    for child in children:
        child.wait()
    seal = f"{sealed[0] - t0:.2f}" if sealed else "-"
    print(
        f"floor N={n:5d} ({args.before} reads + add + wait + {args.after} reads a node):"
        f" return s (first/median/p90/last) {_spread(ends)}; sealed at {seal};"
        f" load average {os.getloadavg()[0]:.0f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", default="1024,4096", help="comma-separated node counts")
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--before", type=int, default=4, help="reads before the arrival")
    parser.add_argument("--after", type=int, default=2, help="reads after the seal")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--control-port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.n = int(args.n)
        _child(args)
        return
    reexec_in_netns(__file__)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start", flush=True)
    for n in (int(x) for x in args.n.split(",") if x):
        _trial(n, args)


if __name__ == "__main__":
    main()
