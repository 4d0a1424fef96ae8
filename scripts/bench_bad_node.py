"""Benchmark a bad node: elastic-run against torchrun, side by side, the defaults but for the flags
named.

Four agents on 127.0.0.1, one worker each, c10d (node A hosts the store): A, B and C start at once
with ``--nnodes 2:3 --max-restarts 3``; C's workers crash (SIGSEGV) at every start (its agent has
``BENCH_BAD=1``: a bad host); D, a spare, starts once C crashed the first time. The workers
(scripts/bench_workers/bad_node_steps.py) take ``--steps`` gloo all_reduce steps and exit 0.

For each run and launcher it prints: whether the job completed (every healthy node exit 0), the
four exit codes, the restarts spent (the highest TORCHELASTIC_RESTART_COUNT any worker saw),
the time from C's second crash to the first step at full world (3) after it ("never" when
none came), node A's goodput line, and what elastic-run's node check and link checks took on A
(their own lines).
Then the distributions (first / median / p90 / last) over the runs. Runs alternate between the
launchers; each gets ``--bound`` seconds. Runs itself in a loopback-only network namespace when
root. No assertions: figures only; the load average is printed with them.

    PYTHONPATH=. .venv/bin/python scripts/bench_bad_node.py --runs 3
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from bench_netns import reexec_in_netns

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "bench_workers" / "bad_node_steps.py"
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Run:
    """What one run of one launcher did."""

    launcher: str
    codes: dict[str, int | None] = field(default_factory=dict)
    restarts: int = 0
    recovery_s: float | None = None
    goodput: str = ""
    node_check: str = ""
    link_checks: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def completed(self) -> bool:
        return all(self.codes.get(n) == 0 for n in ("A", "B", "D"))


def command(
    launcher: str, endpoint: str, run_id: str, host: bool, steps: str, out: str
) -> list[str]:
    rdzv = [
        "--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "3",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
        "--rdzv-conf", f"is_host={'true' if host else 'false'}",
    ]  # fmt: skip
    if launcher == "torchrun":
        return [str(BIN / "python"), "-m", "torch.distributed.run", *rdzv, str(WORKER), out, steps]
    return [str(BIN / "elastic-run"), "--no-live", *rdzv, str(WORKER), out, steps]


def read(path: Path) -> list[list[str]]:
    try:
        return [line.split() for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def run_once(launcher: str, steps: int, bound_s: float, tmp: Path) -> Run:
    out = tmp / f"{launcher}-{uuid.uuid4().hex[:6]}"
    out.mkdir()
    stamps = out / "steps"
    endpoint = f"127.0.0.1:{free_port()}"
    run_id = f"bad-{uuid.uuid4().hex[:8]}"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}
    started = time.monotonic()

    def start(name: str) -> None:
        env = dict(os.environ, BENCH_NODE=name, PYTHONPATH=str(REPO_ROOT))
        if name == "C":
            env["BENCH_BAD"] = "1"
        logs[name] = out / f"{name}.log"
        with logs[name].open("wb") as log:
            procs[name] = subprocess.Popen(
                command(launcher, endpoint, run_id, name == "A", str(steps), str(stamps)),
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                cwd=out,
            )  # fmt: skip

    for name in "ABC":
        start(name)
    deadline = started + bound_s
    while time.monotonic() < deadline and not any(s[0] == "crash" for s in read(stamps)):
        time.sleep(0.05)
    start("D")
    while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
        time.sleep(0.1)
    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    run = Run(launcher, {n: p.returncode for n, p in procs.items()})
    run.wall_s = time.monotonic() - started
    lines = read(stamps)
    run.restarts = max((int(s[3]) for s in lines if s[0] == "start"), default=0)
    crashes = sorted(float(s[1]) for s in lines if s[0] == "crash")
    if len(crashes) >= 2:
        full = [
            float(s[1])
            for s in lines
            if s[0] == "step" and s[3] == "3" and float(s[1]) > crashes[1]
        ]
        run.recovery_s = min(full) - crashes[1] if full else None
    a_log = logs["A"].read_text(errors="replace")
    found = re.search(r"goodput [^\n]*", a_log)
    run.goodput = found.group(0)[:110] if found else "-"
    check = re.search(r"node check [^\n]*", a_log)
    run.node_check = check.group(0)[:110] if check else "-"
    run.link_checks = re.findall(r"link check of (\d+ nodes in [0-9.]+ s)", a_log)
    return run


def spread(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return (
        f"first {values[0]:.2f} s, median {statistics.median(values):.2f} s, "
        f"p90 {p90:.2f} s, last {values[-1]:.2f} s"
    )


def main() -> None:
    reexec_in_netns(__file__)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--bound", type=float, default=240.0)
    parser.add_argument("--only", choices=["elastic-run", "torchrun"], default=None)
    parser.add_argument("--keep", action="store_true", help="keep the nodes' logs; print where")
    args = parser.parse_args()
    launchers = [args.only] if args.only else ["elastic-run", "torchrun"]
    tmp = Path(tempfile.mkdtemp(prefix="bench-bad-node-"))
    results: dict[str, list[Run]] = {name: [] for name in launchers}
    try:
        for i in range(args.runs):
            for launcher in launchers:
                run = run_once(launcher, args.steps, args.bound, tmp)
                results[launcher].append(run)
                load = os.getloadavg()[0]
                back = "never" if run.recovery_s is None else f"{run.recovery_s:.2f} s"
                print(
                    f"run {i + 1} {launcher:11s} completed={run.completed} exits="
                    f"{','.join(f'{n}:{c}' for n, c in sorted(run.codes.items()))} "
                    f"restarts={run.restarts} back at full world after the 2nd crash: {back} "
                    f"(wall {run.wall_s:.1f} s, load {load:.1f})",
                    flush=True,
                )
                print(f"    A: {run.goodput}", flush=True)
                if launcher == "elastic-run":
                    print(f"    A: {run.node_check}", flush=True)
                    links = "; ".join(run.link_checks) or "none ran"
                    print(
                        f"    A: link checks (the default --link-check warn): {links}", flush=True
                    )
        print()
        for launcher, runs in results.items():
            recovered = [r.recovery_s for r in runs if r.recovery_s is not None]
            print(
                f"{launcher}: completed {sum(r.completed for r in runs)} of {len(runs)}; "
                f"back at full world after the bad node's 2nd failure: {spread(recovered)} "
                f"({len(runs) - len(recovered)} never)"
            )
    finally:
        if args.keep:
            print(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
