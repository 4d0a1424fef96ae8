"""Benchmark a hang: elastic-run against torchrun, side by side; and the cost of progress().

Two agents (nodes A and B) on 127.0.0.1, c10d rendezvous, two gloo workers each, running
scripts/bench_workers/hang_steps.py. On attempt 0 node B's local rank 1 (global rank 3) blocks
forever before the all_reduce of step ``--hang-step``; the other three ranks wait inside it.
From its ``hang`` stamp the bench measures:

- verdict: until the agent's ``worker.hung`` event (elastic-run only: torchrun has none);
- stacks: until the stuck rank's ``stacks.txt`` is on disk (elastic-run only);
- training again: until every worker started after the hang has taken a step in a world of 4.

elastic-run runs with ``--hang-timeout 5`` and with the default ``auto`` (a learned timeout,
30 s floor); torchrun with the same script and flags (``--max-restarts 1``) gets ``--bound``
seconds, then the bench reports what it saw (gloo's own timeout is 30 minutes by default).

Then the per-call cost of ``elastic_run.worker.progress()`` in this process: with a beat file
(a shared-memory slot) and without one (a no-op), the minimum over many repetitions (the
machine is shared: the minimum is the cost, the rest is other work).

    PYTHONPATH=. .venv/bin/python scripts/bench_hang.py
    PYTHONPATH=. .venv/bin/python scripts/bench_hang.py --runs 3 --bound 120 --only ours
"""

from __future__ import annotations

import argparse
import json
import os
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

import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "bench_workers" / "hang_steps.py"
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 240.0
POLL_S = 0.05


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def read_stamps(path: Path) -> list[list[str]]:
    try:
        return [line.split() for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


@dataclass
class Result:
    """One run's figures (None: did not happen within the bound)."""

    verdict_s: float | None = None
    stacks_s: float | None = None
    training_s: float | None = None
    note: str = ""


@dataclass
class Job:
    """Two agents of one launcher, their step file and everything they start."""

    launcher: str  # "ours" or "torchrun"
    hang_timeout: str
    hang_step: int
    tmp: Path
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def step_file(self) -> Path:
        return self.tmp / "steps"

    @property
    def stop_file(self) -> Path:
        return self.tmp / "stop"

    def start(self) -> None:
        port, run_id = free_port(), f"hang-{uuid.uuid4().hex[:8]}"
        for node in ("A", "B"):
            exe = [str(BIN / "elastic-run")] if self.launcher == "ours" else [str(BIN / "torchrun")]
            conf = f"is_host={'true' if node == 'A' else 'false'}"
            command = [
                *exe,
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                run_id,
                "--rdzv-conf",
                conf,
                "--local-addr",
                "127.0.0.1",
                "--max-restarts",
                "1",
                "--log-dir",
                str(self.tmp / f"logs_{node}"),
            ]
            if self.launcher == "ours":
                command += ["--no-live", "--hang-timeout", self.hang_timeout]
            command += [str(WORKER), str(self.step_file), str(self.stop_file), str(self.hang_step)]
            env = dict(os.environ, BENCH_NODE=node, OMP_NUM_THREADS="1")
            env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
            with open(self.tmp / f"agent_{node}.log", "wb") as log:
                self.agents[node] = subprocess.Popen(
                    command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )

    def hang_time(self, deadline: float) -> float:
        while time.monotonic() < deadline:
            for fields in read_stamps(self.step_file):
                if fields[0] == "hang":
                    return float(fields[1])
            if any(a.poll() is not None for a in self.agents.values()):
                raise RuntimeError(f"an agent exited before the hang (see {self.tmp})")
            time.sleep(POLL_S)
        raise RuntimeError(f"no hang within {START_TIMEOUT_S:g} s (see {self.tmp})")

    def measure(self, bound_s: float) -> Result:
        hang = self.hang_time(time.monotonic() + START_TIMEOUT_S)
        result = Result()
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            if self.launcher == "ours":
                result.verdict_s = result.verdict_s or self._verdict(hang)
                result.stacks_s = result.stacks_s or self._stacks(hang)
            stamps = read_stamps(self.step_file)
            starts = {f[3] for f in stamps if f[0] == "start" and float(f[1]) > hang}
            stepped = {}
            for f in stamps:
                if f[0] == "step" and f[3] in starts and f[4] == "4" and f[3] not in stepped:
                    stepped[f[3]] = float(f[1])
            if len(stepped) == 4:
                result.training_s = max(stepped.values()) - hang
                break
            time.sleep(POLL_S)
        if result.training_s is None:
            new = len(
                {
                    f[3]
                    for f in read_stamps(self.step_file)
                    if f[0] == "start" and float(f[1]) > hang
                }
            )
            result.note = (
                f"not training again within {bound_s:g} s ({new} new workers started); "
                f"its workers then: {self.where_workers_are()}"
            )
        self.stop_file.touch()
        return result

    def where_workers_are(self) -> str:
        """Where the running workers are, from their stacks (py-spy), e.g. ``3 in all_reduce``."""
        from elastic_run.agent.progress.stacks import capture_stacks

        pids = {}
        for agent in self.agents.values():
            try:
                for proc in psutil.Process(agent.pid).children(recursive=True):
                    if str(WORKER) in proc.cmdline():
                        pids[proc.pid] = proc.pid
            except psutil.Error:
                continue
        if not pids:
            return "none running"
        counts: dict[str, int] = {}
        for report in capture_stacks(pids).values():
            where = report.where()
            key = where.text() if where is not None else (report.error or "unknown")
            counts[key] = counts.get(key, 0) + 1
        return ", ".join(f"{n} in {key}" for key, n in sorted(counts.items()))

    def _verdict(self, hang: float) -> float | None:
        for path in (self.tmp / "logs_B").glob("*/events.jsonl"):
            for line in path.read_text().splitlines():
                event = json.loads(line)
                if event["kind"] == "worker.hung":
                    return float(event["ts"]) - hang
        return None

    def _stacks(self, hang: float) -> float | None:
        for path in (self.tmp / "logs_B").glob("*/attempt_0/1/stacks.txt"):
            return path.stat().st_mtime - hang
        return None

    def stop(self) -> None:
        procs = []
        for agent in self.agents.values():
            try:
                procs += [psutil.Process(agent.pid), *psutil.Process(agent.pid).children(True)]
            except psutil.NoSuchProcess:
                pass
        for agent in self.agents.values():
            try:
                os.killpg(agent.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in procs:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=30)


def run(launcher: str, hang_timeout: str, args: argparse.Namespace) -> Result:
    with tempfile.TemporaryDirectory(prefix="bench-hang-") as tmp:
        job = Job(launcher, hang_timeout, args.hang_step, Path(tmp))
        job.start()
        try:
            return job.measure(args.bound)
        finally:
            job.stop()


def progress_cost() -> tuple[float, float]:
    """(ns per progress() with a beat file, ns per progress() without one): minimum of repeats."""
    code = (
        "import os, sys, tempfile, timeit\n"
        "from pathlib import Path\n"
        "from elastic_run.worker.beat_file import create_beat_file\n"
        "use = sys.argv[1] == '1'\n"
        "tmp = tempfile.TemporaryDirectory(dir='/dev/shm' if os.path.isdir('/dev/shm') else None)\n"
        "if use:\n"
        "    path = Path(tmp.name)\n"
        "    create_beat_file(path / 'b.beats', 4)\n"
        "    os.environ['ELASTIC_RUN_PROGRESS_FILE'] = str(path / 'b.beats')\n"
        "    os.environ['ELASTIC_RUN_PROGRESS_SLOT'] = '1'\n"
        "from elastic_run.worker import progress\n"
        "progress(0)\n"
        "n = 5000\n"
        "best = min(timeit.repeat('progress(7)', globals=globals(), number=n, repeat=400)) / n\n"
        "loop = min(timeit.repeat('pass', number=n, repeat=400)) / n\n"
        "print((best - loop) * 1e9)\n"
        "tmp.cleanup()\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    env.pop("ELASTIC_RUN_PROGRESS_FILE", None)
    out = []
    for use in ("1", "0"):
        proc = subprocess.run(
            [sys.executable, "-c", code, use], env=env, capture_output=True, text=True, check=True
        )
        out.append(float(proc.stdout.strip()))
    return out[0], out[1]


def _cell(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    text = f"{statistics.median(got):.2f} s"
    if len(got) > 1:
        text += f" ({min(got):.2f}-{max(got):.2f})"
    if len(got) < len(values):
        text += f", {len(values) - len(got)} of {len(values)} never"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs per elastic-run row")
    parser.add_argument("--bound", type=float, default=120.0, help="seconds a run may take")
    parser.add_argument("--hang-step", type=int, default=40)
    parser.add_argument("--only", choices=["ours", "torchrun", "cost"], default=None)
    args = parser.parse_args()
    rows: list[tuple[str, list[Result]]] = []
    if args.only in (None, "ours"):
        for timeout in ("5", "auto"):
            results = [run("ours", timeout, args) for _ in range(args.runs)]
            rows.append((f"elastic-run --hang-timeout {timeout}", results))
    if args.only in (None, "torchrun"):
        rows.append(("torchrun (same flags, no hang timeout exists)", [run("torchrun", "", args)]))
    load = os.getloadavg()[0]
    print(f"hang of rank 3 before an all_reduce, 2 nodes x 2 gloo workers (load {load:.1f})")
    print(
        f"{'launcher':48} {'hang -> verdict':>24} {'hang -> stacks':>24} "
        f"{'hang -> training again':>26}"
    )
    for name, results in rows:
        print(
            f"{name:48} {_cell([r.verdict_s for r in results]):>24} "
            f"{_cell([r.stacks_s for r in results]):>24} "
            f"{_cell([r.training_s for r in results]):>26}"
        )
        for r in results:
            if r.note:
                print(f"{'':48} {r.note}")
    if args.only in (None, "cost"):
        with_file, without = progress_cost()
        print(
            f"progress() per call: {with_file:.0f} ns with a beat file, {without:.0f} ns without "
            "(minimum of 400 x 5000 calls, loop overhead removed)"
        )


if __name__ == "__main__":
    main()
