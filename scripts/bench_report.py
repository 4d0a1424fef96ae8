"""Benchmark ``elastic-run report`` on a large synthetic job: its build time and page size.

Writes a job's logs the way the agents do (``<dir>/node<i>/<run>_<hex>/events.jsonl`` plus the
workers' ``attempt_<n>/<local_rank>/`` folders of the nodes with a verdict), then builds the
report in this process ``--runs`` times as the command does: reading every file, parsing,
booking, aligning (``make_report``), rendering the page and writing it. Prints first, median,
p90 and last of the whole build (wall time, and this process's CPU time: steadier on a shared
machine), the time of each stage of the last run, and the page's size.

The job: ``--nodes`` nodes over ``--span-s`` seconds (default a week), each node logging about
``--events`` events (its rounds: every round completes, starts the workers, and ends with a
change of membership), its clock off by up to 3 s; node 17's worker fails in round 0, node 42's
hangs in round 1 (0 with two rounds), node 99 is a straggler, node ``nodes // 2`` is lost in the last round (its log
stops; its peers name it). torch's launcher has no report of a job: nothing to set beside it.

    .venv/bin/python scripts/bench_report.py
    .venv/bin/python scripts/bench_report.py --nodes 1000 --events 100 --runs 3
    .venv/bin/python scripts/bench_report.py --nodes 100 --events 10000 --runs 1
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from elastic_run.cli.report.command import make_report, write_page  # noqa: E402
from elastic_run.cli.report.html_page import render_page  # noqa: E402

RUN = "bench-job"


def _line(ts: float, kind: str, message: str, **fields: object) -> str:
    body = {"v": 1, "ts": round(ts, 6), "kind": kind, "message": message, "fields": fields}
    return json.dumps(body, separators=(",", ":"))


def write_job(root: Path, nodes: int, events: int, span_s: float, seed: int = 1) -> int:
    """Write the synthetic job's logs under ``root``; return the events written."""
    rng = random.Random(seed)
    rounds = max(2, (events - 5) // 5)
    round_s = span_s / rounds
    t0 = 1_790_000_000.0
    lost_node = nodes // 2
    hang_round = min(1, rounds - 2)
    written = 0
    for i in range(nodes):
        skew = rng.uniform(-3, 3)
        run_dir = root / f"node{i}" / f"{RUN}_{i:08x}"
        run_dir.mkdir(parents=True)
        lines: list[str] = []

        def at(t: float, skew: float = skew) -> float:
            return t0 + t + skew + rng.uniform(0, 0.02)

        lines.append(_line(at(0.5), "agent.started", "agent up", run_id=RUN, nproc_per_node=8))
        lines.append(_line(at(0.5), "rendezvous.joining", "joining", attempt=0))
        lost = False
        for r in range(rounds):
            start = 5.0 + r * round_s
            lines.append(
                _line(
                    at(start),
                    "rendezvous.complete",
                    f"round {r} complete",
                    round=r,
                    group_rank=i,
                    group_world_size=nodes,
                    world_size=8 * nodes,
                    restart_count=min(r, 2),
                )
            )
            lines.append(
                _line(
                    at(start + 2),
                    "workers.started",
                    "started 8 workers",
                    ranks=list(range(8 * i, 8 * i + 8)),
                    attempt=r,
                    pids=[],
                )
            )
            end = start + round_s - 3
            if i == 0 and r == 0 and nodes > 99:
                lines.append(
                    _line(
                        at(start + round_s / 2),
                        "straggler",
                        "rank 792 is a straggler",
                        rank=8 * 99,
                        host="h99",
                        node="h99-1-x",
                        ratio=2.5,
                    )
                )
            if r == rounds - 1:
                if i == lost_node:
                    lost = True
                    break
                lines.append(
                    _line(
                        at(end - round_s / 3),
                        "membership.changed",
                        "a member was lost",
                        reason="member_lost",
                        lost=[f"h{lost_node}-1-x"],
                        waiting=0,
                    )
                )
                lines.append(
                    _line(
                        at(end - round_s / 3 + 0.1),
                        "workers.stopped",
                        "stopped",
                        by="agent",
                        reason="member_lost",
                    )
                )
                lines.append(
                    _line(at(end - round_s / 3 + 0.2), "succeeded", "every worker succeeded")
                )
                break
            if i == 17 and r == 0:
                lines.append(
                    _line(
                        at(end),
                        "worker.failed",
                        "worker rank 136 (local 0) failed: exit code 1",
                        local_rank=0,
                        rank=136,
                        exitcode=1,
                        counted=True,
                        failed_at=at(end),
                    )
                )
                lines.append(_line(at(end), "restart", "restarting", restarts=1, counted=True))
            elif i == 42 and r == hang_round:
                lines.append(
                    _line(
                        at(end),
                        "worker.hung",
                        "rank 336 stuck",
                        rank=336,
                        local_rank=0,
                        silent_s=600.0,
                        where="train.py:88",
                    )
                )
                lines.append(
                    _line(
                        at(end),
                        "worker.failed",
                        "worker rank 336 (local 0) failed: killed",
                        local_rank=0,
                        rank=336,
                        exitcode=-9,
                        counted=True,
                        failed_at=at(end),
                    )
                )
                lines.append(_line(at(end), "restart", "restarting", restarts=2, counted=True))
            else:
                lines.append(
                    _line(
                        at(end),
                        "membership.changed",
                        "the round ended on another node",
                        reason="round_ended",
                        cause="worker_failure",
                        waiting=0,
                    )
                )
            lines.append(
                _line(at(end + 0.1), "workers.stopped", "stopped", by="agent", reason="round_ended")
            )
            lines.append(_line(at(end + 0.2), "rendezvous.joining", "joining", attempt=r + 1))
        if not lost:
            wall = span_s
            restarts = [
                {
                    "cause": "membership",
                    "lost_s": 3.0,
                    "detection_s": 0.0,
                    "stop_s": 0.1,
                    "rendezvous_s": 0.2,
                    "worker_start_s": 2.0,
                    "first_beat_s": 1.0,
                }
            ] * min(rounds - 1, 64)
            lost_s = {
                "startup": 8.0,
                "restart.detection": 0.0,
                "restart.stop": 0.1 * (rounds - 1),
                "restart.rendezvous": 3.2 * (rounds - 1),
                "restart.worker_start": 2.0 * (rounds - 1),
                "restart.first_beat": 1.0 * (rounds - 1),
                "stall": 0.0,
                "end": 2.0,
            }
            training = wall - sum(lost_s.values())
            lines.append(
                _line(
                    at(span_s),
                    "goodput",
                    "goodput",
                    v=1,
                    wall_s=wall,
                    training_s=training,
                    share=training / wall,
                    lost_s=wall - training,
                    lost=lost_s,
                    restart_count=rounds - 1,
                    nodes=1,
                    ended=True,
                    restarts=restarts,
                )
            )
        (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")
        written += len(lines)
        if i in (17, 42):
            rank_dir = run_dir / f"attempt_{0 if i == 17 else hang_round}" / "0"
            rank_dir.mkdir(parents=True)
            (rank_dir / "stderr.log").write_text("Traceback ...\n")
            (rank_dir / "error.json").write_text(
                json.dumps(
                    {
                        "message": {
                            "message": "RuntimeError: synthetic",
                            "extraInfo": {"timestamp": "0"},
                        }
                    }
                )
            )
    return written


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--events", type=int, default=10, help="events per node (about)")
    parser.add_argument("--span-s", type=float, default=7 * 86400.0)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "logs"
        begun = time.perf_counter()
        written = write_job(logs, args.nodes, args.events, args.span_s)
        print(
            f"wrote {written} events of {args.nodes} nodes over {args.span_s:.0f} s in "
            f"{time.perf_counter() - begun:.1f} s"
        )
        page = Path(tmp) / "report.html"
        totals: list[float] = []
        cpus: list[float] = []
        stages: dict[str, float] = {}
        for _ in range(args.runs):
            cpu = time.process_time()
            t = [time.perf_counter()]
            report, _nodes, _problems = make_report([str(logs)], None)  # as the command does
            assert report is not None
            t.append(time.perf_counter())
            text = render_page(report, tmp)
            t.append(time.perf_counter())
            write_page(text, page)
            t.append(time.perf_counter())
            totals.append(t[-1] - t[0])
            cpus.append(time.process_time() - cpu)
            stages = {
                name: t[k + 1] - t[k]
                for k, name in enumerate(("read and build", "render", "write"))
            }
        size = page.stat().st_size
        print(
            f"build (read + report + page), {args.runs} runs: first {totals[0]:.2f} s, "
            f"median {statistics.median(totals):.2f} s, p90 {_p(totals, 0.9):.2f} s, "
            f"last {totals[-1]:.2f} s"
        )
        print(
            f"  its CPU time (this process; steadier on a loaded machine): first {cpus[0]:.2f} s, "
            f"median {statistics.median(cpus):.2f} s, p90 {_p(cpus, 0.9):.2f} s, last {cpus[-1]:.2f} s"
        )
        print("last run by stage: " + ", ".join(f"{k} {v:.2f} s" for k, v in stages.items()))
        print(
            f"page: {size / 1e6:.2f} MB, {len(report.rows)} rows for {len(report.lanes)} nodes, "
            f"{len(report.markers)} markers, {len(report.verdicts())} verdicts"
        )


if __name__ == "__main__":
    main()
