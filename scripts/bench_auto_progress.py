"""Benchmark the step-time cost of automatic progress beats (the optimizer hook).

Runs scripts/bench_workers/optimizer_steps.py (a small model's optimizer steps, each timed in
the worker; it imports nothing of elastic_run) under ``elastic-run --standalone`` with automatic
beats (the default) and with ``--no-auto-progress``, alternating, ``--rounds`` times each.
Prints, for each mode, the first, min, median, p90 and last per-step time over all its rounds'
steps, and the overhead: the difference of the medians and of the minimums, in microseconds and
in percent of the mode without beats. On a shared machine the median moves with other work; the
minimum (a step nobody preempted) is the steadier estimate of the hook's own cost.

    .venv/bin/python scripts/bench_auto_progress.py
    .venv/bin/python scripts/bench_auto_progress.py --steps 20000 --width 64 --rounds 3
    .venv/bin/python scripts/bench_auto_progress.py --ddp --steps 3000 --width 512

``--ddp`` runs two workers training one DistributedDataParallel model over gloo (what the issue's
"DDP training script" is); the times are rank 0's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "scripts" / "bench_workers" / "optimizer_steps.py"


def _run(steps: int, width: int, auto: bool, cold: bool, ddp: bool) -> list[int]:
    with tempfile.TemporaryDirectory() as logs:
        command = [
            str(Path(sys.executable).with_name("elastic-run")),
            "--standalone",
            "--nproc-per-node",
            "2" if ddp else "1",
            "--no-live",
            "--log-dir",
            logs,
            "--auto-progress" if auto else "--no-auto-progress",
            "--no-warm-start" if cold else "--warm-start",
            str(WORKER),
            str(steps),
            str(width),
            *(["ddp"] if ddp else []),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=os.environ)
    if done.returncode != 0:
        raise SystemExit(f"elastic-run exited {done.returncode}:\n{done.stderr}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("STEPS "))
    times: list[int] = json.loads(line[len("STEPS ") :])
    return times


def _p(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--width", type=int, default=128, help="the model's width")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cold", action="store_true", help="cold workers (default: warm)")
    parser.add_argument("--ddp", action="store_true", help="two workers, DDP over gloo")
    args = parser.parse_args()
    runs: dict[bool, list[list[int]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for auto in (False, True):
            runs[auto].append(_run(args.steps, args.width, auto, args.cold, args.ddp))
    print(
        f"{args.steps} optimizer steps x {args.rounds} rounds, Linear({args.width}, "
        f"{args.width}){', DDP over gloo, 2 workers' if args.ddp else ''}, batch 32, "
        f"{'cold' if args.cold else 'warm'} workers; per-step times in us (rank 0)"
    )
    medians: dict[bool, float] = {}
    minimums: dict[bool, float] = {}
    for auto in (False, True):
        all_steps = [t for run in runs[auto] for t in run]
        first = statistics.mean(run[0] for run in runs[auto]) / 1000
        last = statistics.mean(run[-1] for run in runs[auto]) / 1000
        medians[auto] = _p(all_steps, 0.5)
        minimums[auto] = min(all_steps) / 1000
        name = "auto beats" if auto else "--no-auto-progress"
        print(
            f"  {name:<20} first {first:9.1f}  min {minimums[auto]:7.2f}  "
            f"median {medians[auto]:7.2f}  "
            f"p90 {_p(all_steps, 0.9):7.2f}  last {last:7.2f}"
        )
    for label, values in (("median", medians), ("min", minimums)):
        delta = values[True] - values[False]
        print(
            f"  overhead ({label}): {delta:+.2f} us per step ({100 * delta / values[False]:+.2f} %)"
        )


if __name__ == "__main__":
    main()
