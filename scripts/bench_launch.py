"""Benchmark single-node launch and restart: elastic-run (default, cold, warm) against torchrun.

The four (elastic-run with its defaults, which is what users run: warm for a script that imports
anything outside the standard library, cold otherwise; ``--no-warm-start``; ``--warm-start``;
torchrun) run in the same invocation, alternating (default, cold, warm, torch, torch, warm, ...),
so a load that comes and goes on the machine falls on all alike; each cell is first / median /
p90 / last, and the ratios of the medians to torchrun's are printed.

(a) launch: the wall time of ``--standalone --nproc-per-node 2`` over a worker that only prints
    its rank (scripts/bench_workers/print_rank.py), from spawning the launcher to its exit.
(c) launch with torch: as (a), over a worker that imports torch first
    (scripts/bench_workers/print_rank_torch.py): what a warm start saves or costs at launch.
(b) restart: ``--standalone --nproc-per-node 2 --max-restarts 1`` over
    scripts/bench_workers/restart_stamp.py; local rank 1 stamps time.time() just before it exits
    1 on attempt 0, and again as its first line on attempt 1. The figure is the difference.

Runs itself in a fresh network namespace with only loopback (``unshare -n``) when it is root and
``unshare`` exists, so no port of another job on this host is in the way; ``--no-unshare`` skips
it. No assertions: figures only. On a small, shared machine the figures are noisy; the script
prints the load average next to them.

    PYTHONPATH=. .venv/bin/python scripts/bench_launch.py
    PYTHONPATH=. .venv/bin/python scripts/bench_launch.py --runs 9 --timeout 60
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_netns import reexec_in_netns

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKERS = Path(__file__).resolve().parent / "bench_workers"
BIN = Path(sys.executable).parent
IMPLS = ("default", "ours", "warm", "torch")
NAMES = {
    "default": "elastic-run default",
    "ours": "elastic-run cold",
    "warm": "elastic-run warm",
    "torch": "torchrun",
}


def launcher(impl: str) -> list[str]:
    """The launcher's command line up to the script (standalone, two workers)."""
    exe = "torchrun" if impl == "torch" else "elastic-run"
    flags = {"ours": ["--no-warm-start"], "warm": ["--warm-start"]}.get(impl, [])
    return [str(BIN / exe), *flags, "--standalone", "--nproc-per-node", "2"]


def child_env() -> dict[str, str]:
    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_job(command: list[str], timeout_s: float) -> tuple[float, str | None]:
    """Run one job; return (wall seconds, None) or (wall seconds, why it failed)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        command,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        return time.monotonic() - start, f"no exit within {timeout_s:g} s"
    wall = time.monotonic() - start
    if proc.returncode != 0:
        tail = " | ".join(err.strip().splitlines()[-2:])
        return wall, f"exit {proc.returncode}: {tail[:160]}"
    return wall, None


def launch_once(impl: str, timeout_s: float) -> float | str:
    """(a): seconds from spawning the launcher to its exit, or why it failed."""
    wall, error = run_job([*launcher(impl), str(WORKERS / "print_rank.py")], timeout_s)
    return error if error else wall


def launch_torch_once(impl: str, timeout_s: float) -> float | str:
    """(c): as (a), with a worker that imports torch."""
    wall, error = run_job([*launcher(impl), str(WORKERS / "print_rank_torch.py")], timeout_s)
    return error if error else wall


def restart_once(impl: str, timeout_s: float) -> float | str:
    """(b): seconds from rank 1's failure to its restarted self's first line, or why not."""
    with tempfile.TemporaryDirectory() as tmp:
        stamps = os.path.join(tmp, "stamps")
        command = [
            *launcher(impl),
            "--max-restarts",
            "1",
            str(WORKERS / "restart_stamp.py"),
            stamps,
        ]
        _, error = run_job(command, timeout_s)
        if error:
            return error
        fail = start = None
        for line in Path(stamps).read_text().splitlines():
            fields = line.split()
            if fields[0] == "fail":
                fail = float(fields[1])
            elif fields[0] == "start" and fields[1] == "1":
                start = float(fields[2])
        if fail is None or start is None:
            return "stamps missing"
        return start - fail


def alternate(
    measure: Callable[[str, float], float | str], runs: int, timeout_s: float, label: str
) -> dict[str, list[float | str]]:
    """Run ``measure`` ``runs`` times per launcher, alternating which one goes first."""
    results: dict[str, list[float | str]] = {impl: [] for impl in IMPLS}
    for i in range(runs):
        order = IMPLS if i % 2 == 0 else IMPLS[::-1]
        for impl in order:
            value = measure(impl, timeout_s)
            results[impl].append(value)
            shown = f"{value:.3f} s" if isinstance(value, float) else f"FAILED ({value})"
            print(f"  {label} run {i + 1} {impl:7s}: {shown}", file=sys.stderr, flush=True)
    return results


def summary(values: list[float | str]) -> tuple[float | None, str]:
    """(median or None, 'first / median / p90 / last' text of the successful runs, failures)."""
    ok = [v for v in values if isinstance(v, float)]
    failed = len(values) - len(ok)
    note = f", {failed} failed" if failed else ""
    if not ok:
        return None, f"all {failed} failed"
    med = statistics.median(ok)
    p90 = sorted(ok)[min(len(ok) - 1, int(0.9 * len(ok)))]
    return med, f"{ok[0]:.2f} / {med:.2f} / {p90:.2f} / {ok[-1]:.2f}{note}"


def main() -> None:
    """Parse arguments, run both figures, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5, help="runs per launcher and figure")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per job")
    parser.add_argument(
        "--only", choices=["launch", "launch-torch", "restart"], help="run one figure only"
    )
    parser.add_argument("--no-unshare", action="store_true", help="stay in this network")
    args = parser.parse_args()
    if not args.no_unshare:
        reexec_in_netns(__file__)

    load_before = os.getloadavg()[0]
    figures: list[tuple[str, dict[str, list[float | str]]]] = []
    if args.only in (None, "launch"):
        figures.append(
            ("(a) 2-worker launch, wall (s)", alternate(launch_once, args.runs, args.timeout, "a"))
        )
    if args.only in (None, "launch-torch"):
        figures.append(
            (
                "(c) 2-worker launch, import torch",
                alternate(launch_torch_once, args.runs, args.timeout, "c"),
            )
        )
    if args.only in (None, "restart"):
        figures.append(
            (
                "(b) restart, fail->first line (s)",
                alternate(restart_once, args.runs, args.timeout, "b"),
            )
        )
    load_after = os.getloadavg()[0]

    print(
        f"elastic-run (default, cold, warm) vs torchrun, --standalone --nproc-per-node 2, {args.runs} "
        f"alternating runs each, {os.cpu_count()} CPUs, load average {load_before:.2f} before / "
        f"{load_after:.2f} after"
    )
    print("(shared machine: figures are noisy; each cell: first / median / p90 / last, seconds)")
    print()
    head = "".join(f" {NAMES[impl]:>30} |" for impl in IMPLS)
    print(f"| figure                            |{head} default/torch | cold/torch | warm/torch |")
    rule = ("-" * 31 + ":|") * len(IMPLS)
    print(f"|-----------------------------------|{rule}--------------:|-----------:|-----------:|")
    for label, results in figures:
        meds, cells = {}, ""
        for impl in IMPLS:
            meds[impl], text = summary(results[impl])
            cells += f" {text:>30} |"
        ratios = []
        for impl in ("default", "ours", "warm"):
            mine, theirs = meds[impl], meds["torch"]
            ratios.append(f"{mine / theirs:.2f}" if mine is not None and theirs else "-")
        shown = f"{ratios[0]:>13} | {ratios[1]:>10} | {ratios[2]:>10}"
        print(f"| {label:33} |{cells} {shown} |")
    for label, results in figures:
        for impl in IMPLS:
            for value in dict.fromkeys(v for v in results[impl] if isinstance(v, str)):
                print(f"{label} {NAMES[impl]}: FAILED ({value})")


if __name__ == "__main__":
    main()
