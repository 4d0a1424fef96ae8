"""Benchmark a restart after a worker failure, every node's side: elastic-run against torchrun.

N agents (``--nodes``, default 3 and 8) on 127.0.0.1, one worker each, c10d (node 0 hosts the
store: ``--rdzv-conf is_host=true``, the others ``is_host=false``), the defaults but for
``--max-restarts`` (the default 0 ends the job at the first failure), ``--local-addr`` and, for
elastic-run, ``--max-node-failures 1000`` (a node whose workers fail again with other ranks is
excluded as a bad host at the second failure: right for a real job, not for this bench). The
workers (scripts/bench_workers/ddp_steps.py) train a small DDP model over gloo and stamp their
start (before importing torch) and every step. Each launcher runs one job per N; once every
worker has trained a few steps the bench SIGKILLs node 0's worker, waits until the job trains
again at full world, lets it train, and does it again (``--runs`` times).

Per failure, from the killed worker's death (a pidfd turning readable):
  stopped      until every other node's worker of that attempt has ended (pidfds): whether its
               agent stopped it or it failed by itself on the dead peer's gloo connection
  spawned      until the last node's new worker started (its first line, before it imports
               torch): the launcher's share of the restart
  trained      until every new worker took a step at full world (DDP set-up, torch's, included)
and for elastic-run, from node 0's decision (its ``worker.failed`` event's ``decided_at``: before
its look at the members, its store write and its notice; older code: the event itself, which
comes after them) until every other node's worker ended (``decided -> stopped``), with how each other node learned that the round
ended (``membership.changed`` ``learned_by``: ``notice``, ``look``, or its own failure).

Runs itself in a fresh network namespace with only loopback (``unshare -n``) when it is root;
``--no-unshare`` skips it. No assertions: figures (first / median / p90 / last), and every
failure seen. The load average is printed beside them.

    PYTHONPATH=. .venv/bin/python scripts/bench_restart_notice.py
    PYTHONPATH=. .venv/bin/python scripts/bench_restart_notice.py --nodes 3 --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from bench_netns import reexec_in_netns

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "bench_workers" / "ddp_steps.py"
BIN = Path(sys.executable).parent
POLL_S = 0.02
TRAIN_STEPS = 5  # steps every worker takes at full world before the next kill


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Stamp:
    kind: str  # start or step
    time: float
    node: str
    pid: int
    world: int = 0


def read_stamps(path: Path) -> list[Stamp]:
    """Parse the stamp file (a line cut short by a concurrent append is skipped)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        f = line.split()
        try:
            world = int(f[4]) if f[0] == "step" else 0
            out.append(Stamp(f[0], float(f[1]), f[2], int(f[3]), world))
        except (IndexError, ValueError):
            continue
    return out


class EndClock:
    """When a process that is not our child ends (its pidfd turns readable)."""

    def __init__(self, pid: int) -> None:
        self.at: float | None = None
        self.done = threading.Event()
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            self.done.set()
            return

        def wait() -> None:
            select.select([fd], [], [])
            self.at = time.time()
            os.close(fd)
            self.done.set()

        threading.Thread(target=wait, daemon=True).start()


@dataclass
class Failure:
    """One failure's figures (seconds), None where it did not happen within the bound."""

    stopped: float | None = None
    spawned: float | None = None
    trained: float | None = None
    decided_stopped: float | None = None
    event_stopped: float | None = None  # from node 0's worker.failed event (older code's decision)
    learned: dict[str, str] = field(default_factory=dict)  # node -> how it learned
    # From node 0's decision to each phase on the slowest other node (elastic-run, seconds):
    # the notice arrived, the store confirmed it, the workers were signalled, the worker ended.
    phases: dict[str, float] = field(default_factory=dict)
    death_decided: float | None = None  # the killed worker's death -> node 0's decision
    note: str = ""


class Job:
    """N agents of one launcher over one stamp file."""

    def __init__(self, launcher: str, nodes: int, runs: int, tmp: Path) -> None:
        self.launcher = launcher
        self.n = nodes
        self.runs = runs
        self.tmp = tmp
        self.stamps = tmp / "stamps"
        self.stop_file = tmp / "stop"
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.port = free_port()
        self.run_id = f"notice-{uuid.uuid4().hex[:8]}"

    def names(self) -> list[str]:
        return [f"n{i}" for i in range(self.n)]

    def command(self, name: str) -> list[str]:
        exe = "torchrun" if self.launcher == "torch" else "elastic-run"
        conf = f"is_host={'true' if name == 'n0' else 'false'}"
        command = [
            str(BIN / exe),
            "--nnodes", str(self.n), "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
            "--rdzv-id", self.run_id, "--rdzv-conf", conf, "--local-addr", "127.0.0.1",
            "--max-restarts", str(self.runs + 5),
        ]  # fmt: skip
        if self.launcher == "ours":
            # The bench kills node 0's worker again and again, with other ranks each time: the
            # node judgement would (rightly) exclude it as a bad host at the second.
            command += ["--max-node-failures", "1000"]
            command += ["--log-dir", str(self.tmp / "logs" / name), "--no-live"]
        return [*command, str(WORKER), str(self.stamps), str(self.stop_file)]

    def start(self) -> None:
        for name in self.names():
            env = dict(os.environ, BENCH_NODE=name, TORCH_CPP_LOG_LEVEL="ERROR")
            env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
            with (self.tmp / f"{name}.log").open("wb") as log:
                self.agents[name] = subprocess.Popen(
                    self.command(name),
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            if name == "n0":
                time.sleep(0.5)  # n0 binds the store first

    def current(self, since: float) -> dict[str, int] | None:
        """node -> pid of its worker started after ``since`` that trained TRAIN_STEPS steps at
        full world; None until every node has one."""
        started = {s.pid: s.node for s in read_stamps(self.stamps) if s.kind == "start"}
        counts: dict[int, int] = {}
        for s in read_stamps(self.stamps):
            if s.kind == "step" and s.world == self.n and s.time > since and s.pid in started:
                counts[s.pid] = counts.get(s.pid, 0) + 1
        by_node = {started[p]: p for p, c in counts.items() if c >= TRAIN_STEPS}
        return by_node if len(by_node) == self.n else None

    def wait_current(self, since: float, bound_s: float) -> dict[str, int]:
        deadline = time.time() + bound_s
        while time.time() < deadline:
            found = self.current(since)
            if found is not None:
                return found
            dead = [n for n, a in self.agents.items() if a.poll() is not None]
            if dead:
                raise RuntimeError(f"agent(s) {dead} exited: {self.tail(dead[0])}")
            time.sleep(POLL_S)
        raise RuntimeError(f"not training at world {self.n} within {bound_s:g} s")

    def tail(self, name: str) -> str:
        text = (self.tmp / f"{name}.log").read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-3:])[:300]

    def events(self, name: str) -> list[dict[str, object]]:
        out = []
        for path in (self.tmp / "logs" / name).glob("**/events.jsonl"):
            for line in path.read_text().splitlines():
                if line.strip():
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        continue
        return out

    def stop(self) -> None:
        self.stop_file.touch()
        deadline = time.time() + 30
        for agent in self.agents.values():
            try:
                agent.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        for agent in self.agents.values():
            if agent.poll() is None:
                try:
                    os.killpg(agent.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                agent.wait()
        for proc in psutil.process_iter(["cmdline"]):
            if str(self.stamps) in (proc.info["cmdline"] or []):
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass


def measure(job: Job, workers: dict[str, int], bound_s: float) -> tuple[Failure, float]:
    """Kill node 0's worker; return the figures and when it died."""
    clocks = {name: EndClock(pid) for name, pid in workers.items()}
    os.kill(workers["n0"], signal.SIGKILL)
    clocks["n0"].done.wait(10)
    death = clocks["n0"].at or time.time()
    out = Failure()
    others = [n for n in workers if n != "n0"]
    if all(clocks[n].done.wait(max(0.0, death + bound_s - time.time())) for n in others):
        ends = [clocks[n].at for n in others]
        if all(e is not None for e in ends):
            out.stopped = max(e for e in ends if e is not None) - death
    deadline = death + bound_s
    while time.time() < deadline:
        stamps = read_stamps(job.stamps)
        starts = {s.pid: s for s in stamps if s.kind == "start" and s.time > death}
        by_node = {s.node: s.time for s in starts.values()}
        if len(by_node) == job.n and out.spawned is None:
            out.spawned = max(by_node.values()) - death
        first: dict[int, float] = {}
        for s in stamps:
            if s.kind == "step" and s.pid in starts and s.world == job.n:
                first.setdefault(s.pid, s.time)
        if len({starts[p].node for p in first}) == job.n:
            out.trained = max(first.values()) - death
            break
        time.sleep(POLL_S)
    else:
        out.note = f"did not train again within {bound_s:g} s"
    if job.launcher == "ours":
        # The decision: before node 0's look, its store write and its notice (``decided_at``),
        # else (older code) its ``worker.failed`` event, which comes after all three.
        failed = [
            e
            for e in job.events("n0")
            if e.get("kind") == "worker.failed" and float(e["ts"]) >= death - 1  # type: ignore[arg-type]
        ]
        decided = [
            float(e.get("fields", {}).get("decided_at") or e["ts"])  # type: ignore[arg-type, union-attr]
            for e in failed
        ]
        ends = [clocks[n].at for n in others]
        if decided and all(e is not None for e in ends):
            out.decided_stopped = max(e for e in ends if e is not None) - min(decided)
            out.event_stopped = max(e for e in ends if e is not None) - min(
                float(e["ts"])  # type: ignore[arg-type]
                for e in failed
            )
        if decided:
            out.death_decided = min(decided) - death
        for name in others:
            how = "?"
            for e in job.events(name):
                if float(e.get("ts", 0)) < death - 1:  # type: ignore[arg-type]
                    continue
                fields = e.get("fields") or {}
                assert isinstance(fields, dict)
                if e.get("kind") == "worker.failed":
                    how = "own failure"
                    break
                if e.get("kind") == "membership.changed":
                    how = str(fields.get("learned_by", "?"))
                    if decided:
                        for phase in PHASES[:3]:
                            at = fields.get(phase)
                            if isinstance(at, (int, float)):
                                was = out.phases.get(phase, float("-inf"))
                                out.phases[phase] = max(was, float(at) - min(decided))
                    break
            out.learned[name] = how
        if decided and all(e is not None for e in ends):
            out.phases["ended"] = max(e for e in ends if e is not None) - min(decided)
    return out, death


PHASES = ("notice_at", "learned_at", "signalled_at", "ended")
PHASE_NAMES = {
    "notice_at": "notice arrived",
    "learned_at": "confirmed (store read)",
    "signalled_at": "workers signalled",
    "ended": "worker ended",
}


def run_job(
    launcher: str, nodes: int, runs: int, bound_s: float, keep: str | None
) -> list[Failure]:
    with tempfile.TemporaryDirectory(prefix="bench-notice-") as tmp:
        job = Job(launcher, nodes, runs, Path(tmp))
        results: list[Failure] = []
        try:
            job.start()
            since = 0.0
            for i in range(runs):
                workers = job.wait_current(since, bound_s if i else 300.0)
                result, since = measure(job, workers, bound_s)
                results.append(result)
                print(f"  {launcher} {nodes} nodes, run {i + 1}: {shown(result)}", flush=True)
        except RuntimeError as exc:
            results.append(Failure(note=str(exc)))
            print(f"  {launcher} {nodes} nodes: {exc}", flush=True)
        finally:
            job.stop()
            if keep and any(r.note for r in results):
                dest = Path(keep, f"{launcher}-{nodes}-{uuid.uuid4().hex[:4]}")
                shutil.copytree(tmp, dest)
                print(f"  logs kept in {dest}", flush=True)
        return results


def shown(f: Failure) -> str:
    parts = [
        f"{name} {x:.3f}"
        for name, x in (
            ("stopped", f.stopped),
            ("decided->stopped", f.decided_stopped),
            ("event->stopped", f.event_stopped),
            ("spawned", f.spawned),
            ("trained", f.trained),
        )
        if x is not None
    ]
    if f.learned:
        parts.append("learned " + ",".join(f"{n}:{h}" for n, h in f.learned.items()))
    if f.phases:
        parts.append(
            "phases "
            + " ".join(
                f"{p.removesuffix('_at')} {f.phases[p]:.3f}" for p in PHASES if p in f.phases
            )
        )
    return ", ".join(parts + ([f.note] if f.note else []))


def distribution(values: list[float | None]) -> str:
    ok = [v for v in values if v is not None]
    if not ok:
        return "-"
    ordered = sorted(ok)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    missed = len(values) - len(ok)
    text = f"{ok[0]:.3f} / {statistics.median(ok):.3f} / {p90:.3f} / {ok[-1]:.3f}"
    return text + (f" ({missed} missing)" if missed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, nargs="+", default=[3, 8])
    parser.add_argument("--runs", type=int, default=10, help="failures per job")
    parser.add_argument("--bound", type=float, default=60.0, help="seconds to train again")
    parser.add_argument("--launcher", choices=["ours", "torch"], help="one launcher only")
    parser.add_argument("--keep-logs", metavar="DIR", help="copy a failed job's logs here")
    parser.add_argument("--no-unshare", action="store_true", help="stay in this network")
    args = parser.parse_args()
    if not args.no_unshare:
        reexec_in_netns(__file__)
    launchers = [args.launcher] if args.launcher else ["ours", "torch"]
    load_before = os.getloadavg()
    results: dict[tuple[str, int], list[Failure]] = {}
    for nodes in args.nodes:
        for launcher in launchers:
            results[(launcher, nodes)] = run_job(
                launcher, nodes, args.runs, args.bound, args.keep_logs
            )
    load_after = os.getloadavg()
    names = {"ours": "elastic-run", "torch": "torchrun"}
    print()
    print(
        f"restart after node 0's worker is SIGKILLed: N agents x 1 gloo DDP worker on 127.0.0.1, "
        f"c10d, the defaults (--max-restarts {args.runs + 5}; elastic-run --max-node-failures "
        f"1000), {args.runs} failures per job, "
        f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.1f}' for x in load_before)} "
        f"before / {' '.join(f'{x:.1f}' for x in load_after)} after"
    )
    print("seconds from the killed worker's death; each cell: first / median / p90 / last")
    print()
    columns = [
        ("every node's workers stopped", "stopped"),
        ("node 0's decision -> stopped", "decided_stopped"),
        ("its worker.failed event -> stopped", "event_stopped"),
        ("spawned (launcher's share)", "spawned"),
        ("training again at full world", "trained"),
    ]
    print("| nodes | launcher | " + " | ".join(name for name, _ in columns) + " |")
    print("|---|---|" + "---:|" * len(columns))
    for (launcher, nodes), values in results.items():
        cells = [distribution([getattr(v, attr) for v in values]) for _, attr in columns]
        print(f"| {nodes} | {names[launcher]} | " + " | ".join(cells) + " |")
    print()
    for (launcher, nodes), values in results.items():
        if launcher == "ours":
            learned: dict[str, int] = {}
            for v in values:
                for how in v.learned.values():
                    learned[how] = learned.get(how, 0) + 1
            print(f"{nodes} nodes, elastic-run: how the other nodes learned of the round's end: "
                  + ", ".join(f"{h} {c}" for h, c in sorted(learned.items())))  # fmt: skip
        if launcher == "ours" and any(v.phases for v in values):
            print(
                f"{nodes} nodes, elastic-run, from node 0's decision (its worker.failed), the "
                "slowest other node: "
                + "; ".join(
                    f"{PHASE_NAMES[p]} {distribution([v.phases.get(p) for v in values])}"
                    for p in PHASES
                )
                + f"; the death -> node 0's decision {distribution([v.death_decided for v in values])}"
            )
        for note in dict.fromkeys(v.note for v in values if v.note):
            print(f"{nodes} nodes, {names[launcher]}: {note}")


if __name__ == "__main__":
    main()
