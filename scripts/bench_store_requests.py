"""Store requests per node per second while a job trains: elastic-run against torchrun.

A steady job should cost its rendezvous store almost nothing: that is what decides how many
nodes one store can carry. Both launchers run the same 2-node job (one idle worker per node)
on one TCPStore that this script hosts; each agent reaches it through its own counting TCP
proxy (``tests/tcp_proxy.py``: a TCPStore client waits for each answer, so every burst of client
bytes is one request; a ``set`` gets no answer, so a request sent right after it is counted with
it: the figure is a lower bound). Bytes both ways are counted too: they grow with the job's size
where a node reads state that holds every node. After the job is up and a warm-up, requests
and bytes are counted over a window.

Each launcher runs with ``--monitor-interval 0.1`` (the default) and ``0.01``: a monitor loop
that reads the store on every turn costs 10 times more at 0.01; one that does not, the same.
Default settings otherwise, built by the CLI as a user runs it.

    PYTHONPATH=. .venv/bin/python scripts/bench_store_requests.py
    PYTHONPATH=. .venv/bin/python scripts/bench_store_requests.py --window 20 --launcher ours
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

from bench_netns import reexec_in_netns

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.tcp_proxy import TcpProxy  # noqa: E402

BIN = Path(sys.executable).parent
NODES = 2
WORKER = """\
import os, sys, time
from pathlib import Path
out = Path(sys.argv[1])
(out / f"ready-{os.environ['RANK']}").write_text(str(os.getpid()))
while not (out / "go").exists():
    time.sleep(0.1)
"""


def run(launcher: str, monitor_s: float, store_port: int, window_s: float, warmup_s: float) -> str:
    """One job; return the printed row."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    out = tmp / "out"
    out.mkdir()
    worker = tmp / "worker.py"
    worker.write_text(WORKER)
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    proxies = [TcpProxy(store_port) for _ in range(NODES)]
    exe = "elastic-run" if launcher == "ours" else "torchrun"
    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    agents = []
    for i, proxy in enumerate(proxies):
        command = [
            str(BIN / exe),
            "--nnodes",
            str(NODES),
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            proxy.endpoint,
            "--rdzv-id",
            run_id,
            "--rdzv-conf",
            "is_host=false",
            "--monitor-interval",
            str(monitor_s),
            *(["--no-live"] if launcher == "ours" else []),
            "--log-dir",
            str(tmp / f"logs{i}"),
            str(worker),
            str(out),
        ]
        log = (tmp / f"agent{i}.log").open("wb")
        agents.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        deadline = time.monotonic() + 120
        while len(list(out.glob("ready-*"))) < NODES:
            if time.monotonic() > deadline or any(a.poll() is not None for a in agents):
                return f"{launcher:6} {monitor_s:6}  the job did not start (logs: {tmp})"
            time.sleep(0.1)
        time.sleep(warmup_s)
        before = [(p.stats.requests, p.stats.bytes_up + p.stats.bytes_down) for p in proxies]
        start = time.monotonic()
        time.sleep(window_s)
        elapsed = time.monotonic() - start
        counts = [p.stats.requests - b[0] for p, b in zip(proxies, before, strict=True)]
        volume = [
            p.stats.bytes_up + p.stats.bytes_down - b[1]
            for p, b in zip(proxies, before, strict=True)
        ]
    finally:
        (out / "go").touch()
        for agent in agents:
            try:
                agent.wait(timeout=60)
            except subprocess.TimeoutExpired:
                agent.kill()
        for proxy in proxies:
            proxy.close()
    per_node = [c / elapsed for c in counts]
    shown = ", ".join(f"{r:.2f}" for r in per_node)
    bytes_s = sum(volume) / elapsed / NODES
    return f"{launcher:6} {monitor_s:6}  {sum(per_node) / NODES:8.2f}   {bytes_s:9.0f}   ({shown})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window", type=float, default=10.0, help="seconds counted")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds after start-up")
    parser.add_argument("--launcher", choices=("ours", "torch", "both"), default="both")
    parser.add_argument("--no-unshare", action="store_true", help="do not use a netns")
    args = parser.parse_args()
    if not args.no_unshare:
        reexec_in_netns(__file__)
    import torch.distributed as dist

    server = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    launchers = ("ours", "torch") if args.launcher == "both" else (args.launcher,)
    print(f"store requests per node per second, 2-node job, {args.window:g} s window")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("launcher monitor  req/node/s  bytes/node/s  (req/s of each node)")
    for monitor_s in (0.1, 0.01):
        for launcher in launchers:
            print(run(launcher, monitor_s, server.port, args.window, args.warmup), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
