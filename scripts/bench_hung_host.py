"""Benchmark: how long until a hung host is dropped by its peer, on the default settings.

Two ``elastic-run`` agents (A and B) on 127.0.0.1, c10d (A hosts the TCPStore:
``--rdzv-conf is_host=true``, B ``is_host=false``; the only rendezvous key set, because both
agents share one address), ``--nnodes 1:2``, one idle worker each
(scripts/bench_workers/idle_until_stop.py), every other setting at its default
(``keep_alive_interval`` 1 s, ``keep_alive_max_attempt`` 5). Once both agents have started their
workers in a round of two, the bench waits ``--settle`` s, then SIGSTOPs B's agent process group
(its sockets stay open: no death notice, only the heartbeat can tell). The figure runs from the
SIGSTOP to the ``ts`` of A's ``membership.changed`` event in its ``events.jsonl``. Then B is
SIGKILLed with its workers, the stop file is written, and A must exit 0.

Prints each run, then first / median / p90 / last, every failure, and the load average at the
start and the end. No assertions: figures only.

    PYTHONPATH=. .venv/bin/python scripts/bench_hung_host.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "scripts" / "bench_workers" / "idle_until_stop.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def events(log_root: Path) -> list[dict[str, object]]:
    """Every event of the agent whose ``--log-dir`` is ``log_root`` (a cut last line skipped)."""
    out: list[dict[str, object]] = []
    for path in log_root.glob("*/events.jsonl"):
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def wait_for(predicate: object, bound_s: float) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def both_started(root: Path) -> bool:
    for node in ("A", "B"):
        evs = events(root / "logs" / node)
        complete = [e for e in evs if e.get("kind") == "rendezvous.complete"]
        started = [e for e in evs if e.get("kind") == "workers.started"]
        if not complete or not started:
            return False
        fields = complete[-1].get("fields")
        if not isinstance(fields, dict) or fields.get("group_world_size") != 2:
            return False
    return True


def one_run(settle_s: float, bound_s: float) -> tuple[float | None, list[str]]:
    tmp = Path(tempfile.mkdtemp(prefix="hung-host-"))
    endpoint = f"127.0.0.1:{free_port()}"
    run_id = f"hung-{uuid.uuid4().hex[:8]}"
    stop = tmp / "stop"
    agents: dict[str, subprocess.Popen[bytes]] = {}
    failures: list[str] = []
    took: float | None = None
    b_procs: list[psutil.Process] = []
    try:
        for node, host in (("A", "true"), ("B", "false")):
            command = [
                sys.executable, "-m", "elastic_run", "--nnodes", "1:2",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
                "--rdzv-conf", f"is_host={host}", "--local-addr", "127.0.0.1",
                "--log-dir", str(tmp / "logs" / node), str(WORKER), str(stop),
            ]  # fmt: skip
            with (tmp / f"{node}.out").open("wb") as log:
                agents[node] = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    env=dict(os.environ, PYTHONPATH=str(REPO)),
                )  # fmt: skip
        if not wait_for(lambda: both_started(tmp), bound_s):
            failures.append(f"the two agents did not start workers together in {bound_s:g} s")
            return None, failures
        time.sleep(settle_s)
        b_procs = [psutil.Process(agents["B"].pid)]
        b_procs += b_procs[0].children(recursive=True)
        stopped_at = time.time()
        os.killpg(agents["B"].pid, signal.SIGSTOP)

        def changed() -> list[dict[str, object]]:
            return [
                e
                for e in events(tmp / "logs" / "A")
                if e.get("kind") == "membership.changed" and float(e["ts"]) > stopped_at  # type: ignore[arg-type]
            ]

        if wait_for(lambda: bool(changed()), bound_s):
            event = changed()[0]
            took = float(event["ts"]) - stopped_at  # type: ignore[arg-type]
            fields = event.get("fields")
            reason = fields.get("reason") if isinstance(fields, dict) else None
            if reason != "member_lost":
                failures.append(f"A's membership.changed said reason={reason!r}")
        else:
            failures.append(f"A saw no membership.changed within {bound_s:g} s of the SIGSTOP")
        for p in b_procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        stop.touch()
        try:
            code = agents["A"].wait(timeout=bound_s)
            if code != 0:
                failures.append(f"agent A exited {code}")
        except subprocess.TimeoutExpired:
            failures.append(f"agent A did not exit within {bound_s:g} s of the stop file")
        return took, failures
    finally:
        for proc in agents.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
        if failures:
            print(f"  kept {tmp} (each agent's output and log tree)", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def distribution(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"{values[0]:.2f} / {statistics.median(values):.2f} / {p90:.2f} / {values[-1]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds in the round first")
    parser.add_argument("--bound", type=float, default=120.0, help="seconds for each wait")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    times: list[float] = []
    failures: list[str] = []
    for i in range(args.runs):
        took, failed = one_run(args.settle, args.bound)
        if took is not None:
            times.append(took)
        failures += [f"run {i}: {f}" for f in failed]
        load = os.getloadavg()[0]
        shown = "-" if took is None else f"{took:.2f} s"
        print(f"run {i}: SIGSTOP to A's membership.changed {shown} (load {load:.1f}) {failed}")
    print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"hung host dropped after (first / median / p90 / last): {distribution(times)} s "
          f"({len(times)} of {args.runs} runs)")  # fmt: skip
    print(f"failures: {len(failures)}")
    for text in failures:
        print(f"  {text}")


if __name__ == "__main__":
    main()
