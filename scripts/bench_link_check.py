"""Benchmark the link check's cost (issue 37, point 6) at 2, 8 and 32 nodes on loopback.

Each simulated node is what an agent would run after its round formed: ``run_link_check`` in a
thread of this process, with that node's own helper process (an interpreter that imports torch,
joins a gloo process group of the N helpers through one real TCPStore on 127.0.0.1, times the
pairwise exchanges and the all-reduce, and prints its record). Every run uses a fresh key
prefix. Two ways to get the helper:

- fresh: ``run_link_check`` starts it, so the round waits for ``import torch`` too;
- early: ``LinkHelper.start`` ran before the round formed (an agent would call it when it starts
  to join) and the helper is ready; the round waits for the collectives only.

Per run it records, over the N nodes:

- check: the longest ``duration_s`` (what a round waits before its workers start);
- collectives: the longest ``measure_s`` (the process group's set-up and the exchanges alone);
- start: the longest ``duration_s - measure_s`` (a fresh helper's interpreter and ``import
  torch``; for an early one, the hand-off only).

and prints first / median / p90 / last of each over the runs, the figures' spread (the slowest
and fastest node's bandwidth), whether anybody was named slow, and the load average before and
after. torchrun has no link check, so there is nothing of torch's to run beside it.

All N helpers share this machine's cores, so the figures are an upper bound for N hosts with a
core each, and a loaded machine (see the load average) stretches every one.

    PYTHONPATH=. .venv/bin/python scripts/bench_link_check.py
    PYTHONPATH=. .venv/bin/python scripts/bench_link_check.py --nodes 2 8 --runs 5 --size-mib 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
import uuid
from datetime import timedelta

from elastic_run.agent.link_check import LinkCheckError, LinkHelper, LinkReport, run_link_check

FACTOR = 1.5  # --straggler-factor's default


def _stats(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (
        f"first {values[0]:7.2f}  median {statistics.median(values):7.2f}  p90 {p90:7.2f}  "
        f"last {values[-1]:7.2f}"
    )


def _one_run(n: int, port: int, size_bytes: int, timeout_s: float, early: bool) -> list[LinkReport]:
    prefix = f"bench-link-check/{uuid.uuid4().hex}"
    results: dict[int, LinkReport | BaseException] = {}
    helpers: dict[int, LinkHelper] = {}
    if early:
        helpers = {r: LinkHelper.start() for r in range(n)}
        deadline = time.monotonic() + timeout_s
        for helper in helpers.values():
            while not helper.is_ready():
                if time.monotonic() > deadline or not helper.is_alive():
                    raise SystemExit("Error: a helper started early never became ready")
                time.sleep(0.05)

    def node(rank: int) -> None:
        try:
            results[rank] = run_link_check(
                rank, n, "127.0.0.1", port, prefix, "gloo", size_bytes, timeout_s,
                factor=FACTOR, helper=helpers.get(rank),
            )  # fmt: skip
        except (LinkCheckError, ValueError) as exc:
            results[rank] = exc

    threads = [threading.Thread(target=node, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [f"node {r}: {v}" for r, v in sorted(results.items()) if isinstance(v, Exception)]
    if errors:
        raise SystemExit("Error: " + "; ".join(errors[:3]))
    return [v for _, v in sorted(results.items()) if isinstance(v, LinkReport)]


def _bench(n: int, way: str, runs: int, port: int, size_bytes: int, timeout_s: float) -> None:
    checks, collectives, starts, named = [], [], [], []
    for _ in range(runs):
        reports = _one_run(n, port, size_bytes, timeout_s, early=way == "early")
        checks.append(max(r.duration_s for r in reports))
        collectives.append(max(r.measure_s for r in reports))
        starts.append(max(r.duration_s - r.measure_s for r in reports))
        bw = reports[0].bandwidth_bytes_per_s
        named.append(reports[0].slow)
        print(
            f"  {n:3d} nodes {way:5s}: check {checks[-1]:6.2f} s, collectives "
            f"{collectives[-1]:5.2f} s, start {starts[-1]:6.2f} s, MB/s {min(bw) / 1e6:.0f}.."
            f"{max(bw) / 1e6:.0f}, all-reduce {reports[0].all_reduce_bytes_per_s / 1e6:.0f} MB/s, "
            f"rechecked {list(reports[0].rechecked)}, slow {list(reports[0].slow)}, "
            f"load {os.getloadavg()[0]:.1f}"
        )
    label = f"{n:3d} nodes {way:5s}"
    print(f"{label}  check (s)        {_stats(checks)}")
    print(f"{label}  collectives (s)  {_stats(collectives)}")
    print(f"{label}  start (s)        {_stats(starts)}")
    print(f"{label}  named slow in {sum(1 for s in named if s)} of {len(named)} runs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size-mib", type=float, default=4.0)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument(
        "--helpers", nargs="+", choices=["fresh", "early"], default=["fresh", "early"]
    )
    args = parser.parse_args()
    from torch.distributed import TCPStore

    store = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=600)
    )
    size_bytes = int(args.size_mib * (1 << 20))
    print(
        f"link check on loopback, gloo, {args.size_mib:g} MiB exchanges, {args.runs} runs, "
        f"{os.cpu_count()} cores; load average before: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    for n in args.nodes:
        for way in args.helpers:
            _bench(n, way, args.runs, int(store.port), size_bytes, args.timeout_s)
    print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print("torchrun: no link check to compare with")


if __name__ == "__main__":
    main()
