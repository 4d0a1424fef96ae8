"""Benchmark multi-node recovery: elastic-run against torchrun, side by side.

Two agents (nodes A and B) on 127.0.0.1 with the c10d rendezvous backend, two workers each,
running scripts/bench_workers/train_steps.py: a tiny gloo all_reduce loop that appends a
timestamped line per step to a file. Both agents start at once; node A hosts the rendezvous
store (``--rdzv-conf is_host=true``, B ``is_host=false``).

(a) worker failure (``--nnodes 2``): node B's local rank 1 exits 1 at step ``--fail-step`` on
    attempt 0. The figure runs from its ``fail`` stamp to the moment all four workers started
    after it have taken a step. Between the stamp and the process's end lies the worker's own
    interpreter teardown (about 0.45 s with torch loaded, for any launcher), which no launcher
    can see; so the bench also stamps the process's end (a pidfd) and reports the spawn time
    from there: the launchers' own share.
(b) node loss (``--nnodes 1:2``): once all four train, the bench SIGKILLs node B's agent, its
    process group and its workers (B does not host the store). The figure runs from the kill to
    the moment both workers that A started after it have taken a step in a world of two.

Each run gets ``--bound`` seconds to recover; where it does not, the row says so and what was
seen (new workers started, or none). torchrun runs again for (b) with
``--rdzv-conf last_call_timeout=1`` unless ``--skip-torch-lct1``. Runs alternate between the
launchers. Runs itself in a fresh network namespace with only loopback (``unshare -n``) when it
is root and ``unshare`` exists; ``--no-unshare`` skips it. No assertions: figures only. On a
small, shared machine the figures are noisy; the load average is printed next to them.

    PYTHONPATH=. .venv/bin/python scripts/bench_recovery.py
    PYTHONPATH=. .venv/bin/python scripts/bench_recovery.py --runs 5 --bound 90 --only b
"""

from __future__ import annotations

import argparse
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
WORKER = Path(__file__).resolve().parent / "bench_workers" / "train_steps.py"
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 180.0
POLL_S = 0.05


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Step:
    """One line of the step file."""

    kind: str  # start, step or fail
    time: float
    node: str
    pid: int
    world: int = 0


def read_steps(path: str) -> list[Step]:
    """Parse the step file (a line cut short by a concurrent append is skipped)."""
    steps = []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        fields = line.split()
        try:
            world = int(fields[4]) if fields[0] == "step" else 0
            steps.append(Step(fields[0], float(fields[1]), fields[2], int(fields[3]), world))
        except (IndexError, ValueError):
            continue
    return steps


def recovery_times(
    steps: list[Step], since: float, nodes: set[str], world: int
) -> tuple[list[float], list[float]]:
    """Start times and first step times of the workers started after ``since`` on ``nodes``.

    Only steps taken in a world of ``world`` count; both lists are sorted.
    """
    starts = {
        s.pid: s.time for s in steps if s.kind == "start" and s.time > since and s.node in nodes
    }
    first: dict[int, float] = {}
    for s in steps:
        if s.kind == "step" and s.pid in starts and s.world == world and s.pid not in first:
            first[s.pid] = s.time
    return sorted(starts.values()), sorted(first.values())


@dataclass
class Job:
    """Two agents of one launcher over one step file, and everything they start."""

    impl: str
    nnodes: str
    fail_step: int
    rdzv_conf: str
    tmp: str
    step_file: str = ""
    stop_file: str = ""
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def command(self, port: int, run_id: str, node: str) -> list[str]:
        exe = "torchrun" if self.impl == "torch" else "elastic-run"
        flags = {"ours": ["--no-warm-start"], "warm": ["--warm-start"]}.get(self.impl, [])
        command = [
            str(BIN / exe),
            *flags,
            "--nnodes",
            self.nnodes,
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            run_id,
            "--local-addr",
            "127.0.0.1",
            "--max-restarts",
            "3",
            "--log-dir",
            os.path.join(self.tmp, f"logs_{node}"),
        ]
        # A hosts the store; both start together (with last_call_timeout=1 a node that starts
        # seconds after the other would miss the first round).
        conf = ",".join(
            c for c in (f"is_host={'true' if node == 'A' else 'false'}", self.rdzv_conf) if c
        )
        command += ["--rdzv-conf", conf]
        return [*command, str(WORKER), self.step_file, self.stop_file, str(self.fail_step)]

    def start(self) -> None:
        """Start nodes A (the store's host) and B at once."""
        self.step_file = os.path.join(self.tmp, "steps")
        self.stop_file = os.path.join(self.tmp, "stop")
        port, run_id = free_port(), f"bench-{uuid.uuid4().hex[:8]}"
        for node in ("A", "B"):
            env = dict(os.environ, BENCH_NODE=node, TORCH_CPP_LOG_LEVEL="ERROR")
            env["OMP_NUM_THREADS"] = "1"
            env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
            with open(os.path.join(self.tmp, f"agent_{node}.log"), "wb") as log:
                self.agents[node] = subprocess.Popen(
                    self.command(port, run_id, node),
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )

    def wait_training(self, world: int) -> None:
        """Wait until four workers have each taken a few steps in a world of ``world``."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            counts: dict[int, int] = {}
            for s in read_steps(self.step_file):
                if s.kind == "step" and s.world == world:
                    counts[s.pid] = counts.get(s.pid, 0) + 1
            if len(counts) >= world and min(counts.values()) >= 5:
                return
            if any(agent.poll() is not None for agent in self.agents.values()):
                raise RuntimeError("an agent exited before training started")
            time.sleep(POLL_S)
        raise RuntimeError(f"training did not start within {START_TIMEOUT_S:g} s")

    def kill_node(self, node: str) -> float:
        """SIGKILL a node's agent, its process group and its workers; return when."""
        agent = self.agents[node]
        try:
            tree = psutil.Process(agent.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        killed_at = time.time()
        try:
            os.killpg(agent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for proc in tree:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        agent.wait()
        return killed_at

    def stop(self) -> None:
        """Kill both agents and every process that runs over this job's step file."""
        for node in self.agents:
            self.kill_node(node)
        for proc in psutil.process_iter(["cmdline"]):
            if self.step_file in (proc.info["cmdline"] or []):
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass


class ExitClock:
    """The moment a process that is not our child ends (a pidfd turns readable), or None."""

    def __init__(self, pid: int) -> None:
        self.at: float | None = None
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return  # already reaped: the moment is lost, the run reports no exit figure

        def wait() -> None:
            select.select([fd], [], [])
            self.at = time.time()
            os.close(fd)

        threading.Thread(target=wait, daemon=True).start()


@dataclass
class Outcome:
    """One run: seconds from the failure (a) or the kill (b), None where it did not happen.

    Attributes:
        trained: until the last of the new workers took its first step in the new world.
        spawned: until the last of the first set of new workers started, before importing torch.
        spawned_from_exit: (a) the same, from the failed worker process's end.
        note: what happened within the bound where the workers did not train again.
    """

    trained: float | None = None
    spawned: float | None = None
    spawned_from_exit: float | None = None
    note: str = ""


def measure(
    figure: str, impl: str, rdzv_conf: str, fail_step: int, bound_s: float, keep: str | None
) -> Outcome:
    """One run of (a) or (b): what happened within the bound."""
    nnodes = "2" if figure == "a" else "1:2"
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(impl, nnodes, fail_step if figure == "a" else -1, rdzv_conf, tmp)
        try:
            job.start()
            job.wait_training(world=4)
            if figure == "b":
                since = job.kill_node("B")
                nodes, world, wanted = {"A"}, 2, 2
            else:
                since = 0.0
                nodes, world, wanted = {"A", "B"}, 4, 4
            deadline = time.time() + bound_s
            exit_clock: ExitClock | None = None
            while True:
                steps = read_steps(job.step_file)
                if figure == "a" and not since:
                    fails = [s for s in steps if s.kind == "fail"]
                    if fails:
                        exit_clock = ExitClock(fails[0].pid)
                    since = fails[0].time if fails else 0.0
                    deadline = (since or time.time()) + bound_s
                starts, firsts = recovery_times(steps, since, nodes, world) if since else ([], [])
                outcome = Outcome()
                if len(starts) >= wanted:
                    # The first full set of new workers: the restart that answered the failure.
                    outcome.spawned = starts[wanted - 1] - since
                    ended = exit_clock.at if exit_clock is not None else None
                    if ended is not None:
                        outcome.spawned_from_exit = starts[wanted - 1] - ended
                if len(firsts) >= wanted:
                    outcome.trained = firsts[wanted - 1] - since
                    return outcome
                if time.time() > deadline:
                    outcome.note = (
                        f"did not train again within {bound_s:g} s "
                        f"({len(starts)} new workers started, {len(firsts)} trained)"
                    )
                    return outcome
                time.sleep(POLL_S)
        except RuntimeError as exc:
            log = Path(tmp, "agent_A.log")
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            return Outcome(note=f"{exc} {' '.join(tail)[:120]}")
        finally:
            job.stop()
            if keep:
                dest = Path(keep, f"{figure}-{impl}{'-' + rdzv_conf if rdzv_conf else ''}")
                dest = dest.with_name(f"{dest.name}-{uuid.uuid4().hex[:4]}")
                shutil.copytree(tmp, dest)


_NAMES = {"ours": "elastic-run cold", "warm": "elastic-run warm", "torch": "torchrun"}


def summary(values: list[Outcome], attr: str) -> tuple[float | None, str]:
    """(median or None, 'first / median / p90 / last' text noting the runs that never did)."""
    ok = [x for v in values if (x := getattr(v, attr)) is not None]
    if not ok:
        return None, f"never, {len(values)} of {len(values)} runs"
    med = statistics.median(ok)
    p90 = sorted(ok)[min(len(ok) - 1, int(0.9 * len(ok)))]
    missed = len(values) - len(ok)
    note = f", {missed} of {len(values)} never" if missed else ""
    return med, f"{ok[0]:.2f} / {med:.2f} / {p90:.2f} / {ok[-1]:.2f}{note}"


def shown(value: Outcome) -> str:
    """One run as a line."""
    parts = [
        f"{name} {x:.3f} s"
        for name, x in (
            ("trained", value.trained),
            ("spawned", value.spawned),
            ("spawned from the exit", value.spawned_from_exit),
        )
        if x is not None
    ]
    return ", ".join(parts + ([value.note] if value.note else []))


def main() -> None:
    """Parse arguments, run the figures, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3, help="runs per row")
    parser.add_argument(
        "--bound", type=float, default=60.0, help="seconds a run may take to recover"
    )
    parser.add_argument("--fail-step", type=int, default=20, help="(a): the failing step")
    parser.add_argument("--only", choices=["a", "b"], help="run one figure only")
    parser.add_argument("--skip-torch-lct1", action="store_true", help="no last_call_timeout=1 row")
    parser.add_argument(
        "--launcher",
        choices=["ours", "warm", "torch"],
        help="run one launcher only (default: all; ours: elastic-run cold, warm: --warm-start)",
    )
    parser.add_argument("--keep-logs", metavar="DIR", help="copy each run's logs and steps here")
    parser.add_argument("--no-unshare", action="store_true", help="stay in this network")
    args = parser.parse_args()
    if not args.no_unshare:
        reexec_in_netns(__file__)

    rows: list[tuple[str, str, str]] = []  # (figure, impl, rdzv_conf)
    if args.only in (None, "a"):
        rows += [("a", "ours", ""), ("a", "warm", ""), ("a", "torch", "")]
    if args.only in (None, "b"):
        rows += [("b", "ours", ""), ("b", "warm", ""), ("b", "torch", "")]
        if not args.skip_torch_lct1:
            rows.append(("b", "torch", "last_call_timeout=1"))
    if args.launcher:
        rows = [row for row in rows if row[1] == args.launcher]
    results: dict[tuple[str, str, str], list[Outcome]] = {row: [] for row in rows}
    load_before = os.getloadavg()[0]
    for figure in ("a", "b"):
        mine = [row for row in rows if row[0] == figure]
        for i in range(args.runs):
            for row in mine if i % 2 == 0 else mine[::-1]:
                value = measure(figure, row[1], row[2], args.fail_step, args.bound, args.keep_logs)
                results[row].append(value)
                conf = f" {row[2]}" if row[2] else ""
                print(
                    f"  ({figure}) run {i + 1} {row[1]}{conf}: {shown(value)}",
                    file=sys.stderr,
                    flush=True,
                )
    load_after = os.getloadavg()[0]

    print(
        f"recovery, 2 agents x 2 gloo workers on 127.0.0.1, c10d, {args.runs} alternating runs "
        f"per row, bound {args.bound:g} s, {os.cpu_count()} CPUs, load average "
        f"{load_before:.2f} before / {load_after:.2f} after"
    )
    print(
        "(shared machine: figures are noisy; each cell: first / median / p90 / last; 'spawned': until"
    )
    print(" the last new worker's first line, before it imports torch; 'from the exit': from the")
    print(" failed worker process's end, after its own interpreter teardown)")
    print()
    labels = {
        "a": "(a) worker failure (s)",
        "b": "(b) node SIGKILL (s)",
    }
    columns = [("training again", "trained"), ("spawned", "spawned")]
    if any(row[0] == "a" for row in rows):
        columns.append(("spawned, from the exit", "spawned_from_exit"))
    head = "".join(f" {name:34} |" for name, _ in columns)
    print(f"| {'figure':22} | {'launcher':38} |{head}")
    print(f"|{'-' * 24}|{'-' * 40}|" + "".join(f"{'-' * 35}:|" for _ in columns))
    for row in rows:
        figure, impl, conf = row
        name = _NAMES[impl]
        launcher = f"{name} ({conf})" if conf else f"{name} (defaults)"
        # (b) has no failed worker process: no figure "from the exit".
        texts = [
            "-" if figure == "b" and attr == "spawned_from_exit" else summary(results[row], attr)[1]
            for _, attr in columns
        ]
        cells = "".join(f" {text:>34} |" for text in texts)
        print(f"| {labels[figure]:22} | {launcher:38} |{cells}")
    print()
    for figure in ("a", "b"):
        for name, attr in columns:
            theirs = summary(results.get((figure, "torch", ""), []), attr)[0]
            for impl in ("ours", "warm"):
                ours = summary(results.get((figure, impl, ""), []), attr)[0]
                if ours is not None and theirs:  # (b) from the exit: None on both sides
                    print(
                        f"({figure}) {name}: {_NAMES[impl]} / torchrun (defaults) = "
                        f"{ours / theirs:.2f}"
                    )
    for row in rows:
        for note in dict.fromkeys(v.note for v in results[row] if v.note):
            print(f"({row[0]}) {row[1]} {row[2]}: {note}".replace("  ", " "))


if __name__ == "__main__":
    main()
