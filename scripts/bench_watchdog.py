"""Benchmark the file-timer watchdog against torch's FileTimerServer on this machine.

Prints, for ours and torch's, side by side:
1. the median delay from a timer's expiry to the worker's death (``--trials`` workers, each
   arming a short timer and hanging), at a 0.1 s poll interval;
2. the server process's CPU use (psutil cpu_times) over ``--idle-s`` seconds while
   ``--idle-workers`` workers each hold an armed long timer.

Each server runs in its own process, so its CPU time is its own; the workers speak the same wire
protocol to both (elastic_run.worker.FileTimerClient). No assertions: figures only.

    PYTHONPATH=. .venv/bin/python scripts/bench_watchdog.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]
POLL_INTERVAL_S = 0.1

WORKER = textwrap.dedent(
    """
    import errno, signal, sys, time
    from elastic_run.worker import FileTimerClient, TimerClientError
    path, after = sys.argv[1], float(sys.argv[2])
    client = FileTimerClient(path)
    deadline = time.monotonic() + 60
    while True:
        expiration = time.time() + after
        try:
            client.acquire("bench", expiration)
            break
        except TimerClientError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)  # the server has not opened the pipe yet
    print(repr(expiration), flush=True)
    signal.pause()
    """
)


def serve(kind: str, fifo: str) -> None:
    """Run one server until stdin closes (the --serve mode of this script)."""
    if kind == "ours":
        from elastic_run.agent.watchdog.server import FileTimerServer

        ours = FileTimerServer(
            fifo,
            "bench",
            max_interval=POLL_INTERVAL_S,
            is_known_pid=lambda pid: True,
            on_expired=lambda expiry: None,
        )
        ours.start()
        print("ready", flush=True)
        sys.stdin.read()
        ours.stop()
    else:
        from torch.distributed.elastic.timer.file_based_local_timer import (
            FileTimerServer as TorchFileTimerServer,
        )

        theirs = TorchFileTimerServer(fifo, run_id="bench", max_interval=POLL_INTERVAL_S)
        theirs.start()
        print("ready", flush=True)
        sys.stdin.read()
        theirs.stop()


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def start_worker(fifo: str, after_s: float) -> tuple[subprocess.Popen[str], float]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, fifo, str(after_s)],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        raise RuntimeError(f"worker exited with {proc.returncode} before arming its timer")
    return proc, float(line)


class ServerProcess:
    """One watchdog server in its own process, on a FIFO in a temporary directory."""

    def __init__(self, kind: str, fifo: str) -> None:
        self.kind = kind
        self.fifo = fifo
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", kind, fifo],
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.stop()
            raise RuntimeError(f"{kind} server did not start")

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def bench(kind: str, trials: int, idle_workers: int, idle_s: float) -> tuple[list[float], float]:
    """Return (each expiry-to-death delay in s, in trial order; server CPU s per idle second).

    torch's FileTimerServer sends the signal to its own process too once it has reaped a worker
    (it expects the agent to go down with the worker), so every trial gets a fresh server, for
    both implementations alike.
    """
    with tempfile.TemporaryDirectory() as tmp:
        fifo = os.path.join(tmp, "timer.fifo")
        workers: list[subprocess.Popen[str]] = []
        server: ServerProcess | None = None
        try:
            delays = []
            for _ in range(trials):
                server = ServerProcess(kind, fifo)
                proc, expiration = start_worker(fifo, 0.3)
                workers.append(proc)
                proc.wait()
                delays.append(time.time() - expiration)
                server.stop()
                server = None

            server = ServerProcess(kind, fifo)
            workers.extend(start_worker(fifo, 3600)[0] for _ in range(idle_workers))
            server_ps = psutil.Process(server.proc.pid)
            before = server_ps.cpu_times()
            start = time.monotonic()
            time.sleep(idle_s)
            after = server_ps.cpu_times()
            elapsed = time.monotonic() - start
            cpu_s = (after.user - before.user) + (after.system - before.system)
            return delays, cpu_s / elapsed
        finally:
            for proc in workers:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            if server is not None:
                server.stop()


def main() -> None:
    """Parse arguments and print the figures (or run one server with --serve)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "FIFO"), help=argparse.SUPPRESS)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--idle-workers", type=int, default=8)
    parser.add_argument("--idle-s", type=float, default=10.0)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], args.serve[1])
        return

    print(
        f"file-timer watchdog, poll {POLL_INTERVAL_S} s, {args.trials} expiry trials, "
        f"{args.idle_workers} idle workers over {args.idle_s:g} s, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at start"
    )
    results = {
        kind: bench(kind, args.trials, args.idle_workers, args.idle_s) for kind in ("ours", "torch")
    }
    print(f"load average {os.getloadavg()[0]:.1f} at end")
    print("expiry->death, ms (first / median / p90 / last):")
    for kind, name in (("ours", "elastic-run"), ("torch", "torch")):
        delays = [d * 1000.0 for d in results[kind][0]]
        ordered = sorted(delays)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        shown = (delays[0], statistics.median(delays), p90, delays[-1])
        print(f"  {name:12} {' / '.join(f'{v:.2f}' for v in shown)}")
    ours, theirs = results["ours"][1] * 100.0, results["torch"][1] * 100.0
    print(f"idle server CPU (% of core): elastic-run {ours:.2f}, torch {theirs:.2f}")
    print(
        "(torch's FileTimerServer sends the expired timer's signal to its own process after it "
        "reaps a worker, so each trial starts a fresh server, for both)"
    )


if __name__ == "__main__":
    main()
