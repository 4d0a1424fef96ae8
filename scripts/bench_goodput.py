"""Benchmark the goodput account against clocks read from outside the job.

Runs a real training job under elastic-run (its defaults, ``--standalone``, two workers,
``--max-restarts 2``): ``scripts/bench_workers/steady_failures.py`` steps at a steady rate and
its rank 1 raises after step ``--fail-step`` on each of the first two attempts. From outside:

- the run's wall time: from just before the launcher's process starts to its exit;
- each injected failure's time (the worker's ``FAIL`` stamp) and the first step after each
  restart (the earliest ``STAMP`` of the next attempt), from the workers' stdout;
- so the lost time outside: start-up (launch to the first step), each restart (its failure to
  the first step after it) and the end (the last step to the exit).

It then prints them beside the account the agent wrote last in ``events.jsonl`` (the ``goodput``
event; the same as the summary line) and the difference, for each run and as first / median /
p90 / last over the runs, with the command. The outside wall time includes the launcher's own
interpreter start and teardown, which no account inside it can see; the lost-time figures are
the ones to hold to 5 % or 1 s. No assertions: figures only.

    PYTHONPATH=. .venv/bin/python scripts/bench_goodput.py
    PYTHONPATH=. .venv/bin/python scripts/bench_goodput.py --runs 5 --steps 60 --step-s 0.1
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "scripts" / "bench_workers" / "steady_failures.py"


def _stamps(stdout: str, kind: str) -> list[dict[str, Any]]:
    found = []
    for line in stdout.splitlines():
        at = line.find(kind + " {")
        if at >= 0:
            found.append(json.loads(line[at + len(kind) + 1 :]))
    return found


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def one_run(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "elastic_run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "2",
        "--no-live",
        "--log-dir",
        str(log_dir),
        str(WORKER),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "STEPS": str(args.steps),
        "STEP_S": str(args.step_s),
        "FAIL_STEP": str(args.fail_step),
        "FAILURES": "2",
    }
    began = time.time()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.bound)
    ended = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"the job failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    stamps, fails = _stamps(proc.stdout, "STAMP"), _stamps(proc.stdout, "FAIL")
    first = {r: min(s["t"] for s in stamps if s["restart"] == r) for r in (0, 1, 2)}
    fail_at = {f["restart"]: f["t"] for f in fails}
    outside = {
        "wall_s": ended - began,
        "startup_s": first[0] - began,
        "restart_s": [first[r + 1] - fail_at[r] for r in (0, 1)],
        "end_s": ended - max(s["t"] for s in stamps),
    }
    outside["lost_s"] = outside["startup_s"] + sum(outside["restart_s"]) + outside["end_s"]
    (run_dir,) = log_dir.iterdir()
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    account = next(e["fields"] for e in reversed(events) if e["kind"] == "goodput")
    return {"outside": outside, "account": account, "command": shlex.join(command)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--fail-step", type=int, default=10)
    parser.add_argument("--bound", type=float, default=300.0, help="seconds a run may take")
    args = parser.parse_args()
    diffs: dict[str, list[float]] = {"lost": [], "restart 1": [], "restart 2": []}
    command = ""
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            result = one_run(args, Path(tmp) / "logs")
        out, acc = result["outside"], result["account"]
        command = result["command"]
        costs = [r["lost_s"] for r in acc["restarts"]]
        print(f"\nrun {run + 1}: {'':24}{'outside':>10}{'account':>10}{'diff':>9}")
        rows = [
            ("wall (outside: + launcher)", out["wall_s"], acc["wall_s"]),
            ("start-up", out["startup_s"], acc["lost"]["startup"]),
            ("restart 1 (fail->step)", out["restart_s"][0], costs[0]),
            ("restart 2 (fail->step)", out["restart_s"][1], costs[1]),
            ("end (last step->exit)", out["end_s"], acc["lost"]["end"]),
            ("lost in all", out["lost_s"], acc["lost_s"]),
            ("training", out["wall_s"] - out["lost_s"], acc["training_s"]),
        ]
        for name, outside, inside in rows:
            print(f"  {name:30}{outside:10.3f}{inside:10.3f}{inside - outside:+9.3f}")
        print(
            f"  account: share {100 * acc['share']:.1f}%, restarts {acc['restart_count']}, "
            f"by cause {acc['lost']}"
        )
        diffs["lost"].append(acc["lost_s"] - out["lost_s"])
        diffs["restart 1"].append(costs[0] - out["restart_s"][0])
        diffs["restart 2"].append(costs[1] - out["restart_s"][1])
    print("\naccount - outside (s), over the runs:   first   median      p90     last")
    for name, values in diffs.items():
        print(
            f"  {name:34}{values[0]:+8.3f}{statistics.median(values):+9.3f}"
            f"{_pct(values, 0.9):+9.3f}{values[-1]:+9.3f}"
        )
    print(
        f"\ncommand (env STEPS={args.steps} STEP_S={args.step_s} FAIL_STEP={args.fail_step} "
        f"FAILURES=2):\n  {command}"
    )


if __name__ == "__main__":
    main()
