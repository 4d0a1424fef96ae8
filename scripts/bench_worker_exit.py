"""The floor under "every node's workers stopped": how long training workers take to die, no launcher.

N workers of bench_restart_notice.py (scripts/bench_workers/ddp_steps.py: a small DDP model over
gloo, one world of N ranks on 127.0.0.1, started here with torch's environment variables and no
launcher) train until each has taken a step; then all get SIGTERM at once, as the agents of a
restart stop theirs, and each one's exit is timed from the signal (a pidfd turning readable).
bench_restart_notice.py's ``stopped`` column for N nodes cannot be lower than the last exit
here, whatever the launcher does.

Runs itself in a fresh network namespace with only loopback (``unshare -n``) when it is root;
``--no-unshare`` skips it. No assertions: per N, the first and the last exit of each run, as
first / median / p90 / last over the runs, and every run that failed (a worker that died before
its first step or outlived SIGTERM by 30 s), counted as missing.

    PYTHONPATH=. .venv/bin/python scripts/bench_worker_exit.py
    PYTHONPATH=. .venv/bin/python scripts/bench_worker_exit.py --procs 1 2 7 --runs 10
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_netns import reexec_in_netns
from bench_restart_notice import WORKER, distribution, free_port, read_stamps

STEP_BOUND_S = 120.0  # for every worker's first step


def one_run(n: int, work: Path) -> list[float]:
    """Start n ranks, wait for a step of each, SIGTERM them all; each one's exit, in seconds."""
    steps, stop = work / "steps", work / "stop"
    steps.unlink(missing_ok=True)
    port = free_port()
    procs = []
    for rank in range(n):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(n),
            BENCH_NODE=f"n{rank}",
            OMP_NUM_THREADS="1",
            TORCH_CPP_LOG_LEVEL="ERROR",
        )
        procs.append(
            subprocess.Popen([sys.executable, str(WORKER), str(steps), str(stop)], env=env)
        )
    try:
        deadline = time.monotonic() + STEP_BOUND_S
        while {s.pid for s in read_stamps(steps) if s.kind == "step"} != {p.pid for p in procs}:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"not every one of {n} workers took a step")
            time.sleep(0.05)
        pidfds = {os.pidfd_open(p.pid): p for p in procs}
        start = time.monotonic()
        for p in procs:
            os.kill(p.pid, signal.SIGTERM)
        ends: list[float] = []
        while pidfds:
            ready, _, _ = select.select(list(pidfds), [], [], 30)
            if not ready:
                raise RuntimeError("a worker outlived SIGTERM by 30 s")
            for fd in ready:
                ends.append(time.monotonic() - start)
                os.close(fd)
                del pidfds[fd]
        return sorted(ends)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--procs", type=int, nargs="+", default=[2, 7])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--no-unshare", action="store_true", help="stay in this network")
    args = parser.parse_args()
    if not args.no_unshare:
        reexec_in_netns(__file__)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    print("seconds from SIGTERM to each worker's exit; each cell: first / median / p90 / last")
    with tempfile.TemporaryDirectory(prefix="bench-exit-") as tmp:
        for n in args.procs:
            firsts: list[float | None] = []
            lasts: list[float | None] = []
            for run in range(1, args.runs + 1):
                try:
                    ends = one_run(n, Path(tmp))
                except RuntimeError as exc:  # said, and counted as missing
                    print(f"  {n} workers, run {run}: FAILED: {exc}")
                    firsts.append(None)
                    lasts.append(None)
                    continue
                firsts.append(ends[0])
                lasts.append(ends[-1])
            print(
                f"  {n} workers: first exit {distribution(firsts)}; last exit {distribution(lasts)}"
            )
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
