"""Chaos trials: a 3-agent gloo job with one random fault each, then every figure per fault.

Each trial starts three ``elastic-run`` agents (A, B, C; ``--nnodes 2:3``, two workers each) on
127.0.0.1 running scripts/bench_workers/checkpoint_steps.py (a gloo all_reduce per step, each
step stamped to a file, global rank 0 checkpointing the step every ``--checkpoint-every`` steps,
every new worker resuming from the checkpoint), waits until all three train, lets them train
``--before`` s, injects one fault, waits until the job trains again, asks the workers to stop,
and checks how every agent ended.

Settings: the defaults, but for ``--max-restarts 3`` (the default 0 would end the job at the
first worker failure) and what three agents on one address need: ``--local-addr 127.0.0.1``
and, on c10d, ``--rdzv-conf is_host=true`` for A (``is_host=false`` for B and C).

c10d trials (``--trials``, default 20; A hosts the TCPStore), one fault picked at random (from
``--faults``, default all three):
  kill-agent    SIGKILL of a non-hosting agent (B or C), its process group and its workers
  kill-worker   SIGKILL of one worker (any node)
  stop-agent    SIGSTOP of a non-hosting agent for 10 s, then SIGCONT
etcd trials (``--etcd-trials``, default 10) on a 3-member etcd:
  kill-member+agent  SIGKILL of one etcd member and of one agent (A included: any of the three)

Per fault it prints: completed (every surviving agent exited 0 after the stop file), steps
lost (read from the stamps: the steps the workers of before the fault finished, up to the last
one they finished, detection time included, minus the step the first new world resumed from),
time to training again (from the fault until every worker of the new world, all started after
the fault, took a step), orphans (processes of the trial alive after its agents ended),
hangs (an agent that did not exit within ``--bound`` s). Every failure is listed; a failed
trial's directory (each agent's output and log tree, the step stamps) is kept and named.

    PYTHONPATH=. .venv/bin/python scripts/chaos.py
    PYTHONPATH=. .venv/bin/python scripts/chaos.py --trials 6 --etcd-trials 0 --seed 1
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "scripts" / "bench_workers" / "checkpoint_steps.py"
NPROC = 2
C10D_FAULTS = ("kill-agent", "kill-worker", "stop-agent")
ETCD_FAULT = "kill-member+agent"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Step:
    kind: str  # step (finished) or resume (a worker's start, from the checkpoint)
    at: float
    node: str
    pid: int
    world: int
    step: int


def read_steps(path: Path) -> list[Step]:
    out: list[Step] = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[0] in ("step", "resume"):
            out.append(
                Step(
                    parts[0], float(parts[1]), parts[2], int(parts[3]), int(parts[4]), int(parts[5])
                )
            )
    return out


@dataclass
class Outcome:
    fault: str
    completed: bool = False
    steps_lost: int | None = None
    to_training_s: float | None = None
    orphans: int = 0
    hangs: int = 0
    failures: list[str] = field(default_factory=list)
    kept: str = ""


class Trial:
    def __init__(self, tmp: Path, backend: str, endpoint: str, bound_s: float, every: int) -> None:
        self.tmp = tmp
        self.backend = backend
        self.endpoint = endpoint
        self.bound_s = bound_s
        self.every = every
        self.checkpoint = tmp / "checkpoint"
        self.steps = tmp / "steps"
        self.stop_file = tmp / "stop"
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.seen: set[int] = set()
        self.run_id = f"chaos-{os.getpid()}-{int(time.monotonic() * 1000)}"

    def start(self, node: str) -> None:
        conf = []
        if self.backend == "c10d":
            conf = ["--rdzv-conf", "is_host=true" if node == "A" else "is_host=false"]
        command = [
            sys.executable, "-m", "elastic_run", "--nnodes", "2:3",
            "--nproc-per-node", str(NPROC), "--rdzv-backend", self.backend,
            "--rdzv-endpoint", self.endpoint, "--rdzv-id", self.run_id, *conf,
            "--max-restarts", "3", "--local-addr", "127.0.0.1",
            "--log-dir", str(self.tmp / "logs" / node),
            str(WORKER), str(self.steps), str(self.stop_file), str(self.checkpoint),
            str(self.every),
        ]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(REPO), BENCH_NODE=node)
        with (self.tmp / f"{node}.log").open("wb") as log:
            self.agents[node] = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def remember(self) -> None:
        for proc in self.agents.values():
            try:
                self.seen.add(proc.pid)
                self.seen.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass

    def wait_for(self, predicate: object, what: str) -> bool:
        deadline = time.monotonic() + self.bound_s
        while time.monotonic() < deadline:
            self.remember()
            if predicate():  # type: ignore[operator]
                return True
            time.sleep(0.1)
        return False

    def training(self, world: int, after: float = 0.0) -> float | None:
        """The time of the first step after which ``world`` new workers all stepped."""
        steps = read_steps(self.steps)
        before = {s.pid for s in steps if s.at <= after}  # workers that stepped before: not new
        by_pid: dict[int, float] = {}
        for s in steps:
            if s.kind == "step" and s.at > after and s.world == world and s.pid not in before:
                by_pid.setdefault(s.pid, s.at)
        if len(by_pid) < world:
            return None
        return sorted(by_pid.values())[world - 1]

    def steps_lost(self, after: float) -> int | None:
        """Steps finished by the workers of before ``after`` minus the step the next world resumed
        from (None until a worker started after ``after`` resumed)."""
        steps = read_steps(self.steps)
        old = {s.pid for s in steps if s.at <= after}
        done = max((s.step + 1 for s in steps if s.kind == "step" and s.pid in old), default=0)
        resumed = [s for s in steps if s.kind == "resume" and s.at > after and s.pid not in old]
        if not resumed:
            return None
        return done - min(resumed, key=lambda s: s.at).step

    def workers(self, node: str) -> list[psutil.Process]:
        try:
            return psutil.Process(self.agents[node].pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def finish(self, out: Outcome, expect_dead: set[str]) -> None:
        self.stop_file.touch()
        for node, proc in self.agents.items():
            if node in expect_dead:
                continue
            try:
                code = proc.wait(timeout=self.bound_s)
            except subprocess.TimeoutExpired:
                out.hangs += 1
                out.failures.append(f"agent {node} did not exit in {self.bound_s:g} s")
                continue
            if code != 0:
                out.failures.append(f"agent {node} exited {code}")
        out.completed = not out.failures
        self.remember()
        time.sleep(1.0)  # let the last reaped processes go
        alive = [p for p in self.seen if psutil.pid_exists(p) and _not_zombie(p)]
        out.orphans = len(alive)
        if alive:
            out.failures.append(f"orphans: {sorted(alive)}")

    def kill_all(self) -> None:
        self.remember()
        for proc in self.agents.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for pid in self.seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in self.agents.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_node(trial: Trial, node: str) -> None:
    procs = [psutil.Process(trial.agents[node].pid), *trial.workers(node)]
    try:
        os.killpg(trial.agents[node].pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    trial.agents[node].wait(timeout=30)


def run_trial(
    backend: str,
    fault: str,
    rng: random.Random,
    bound_s: float,
    etcd: object,
    every: int,
    before_s: float,
) -> Outcome:
    out = Outcome(fault)
    tmp = Path(tempfile.mkdtemp(prefix="chaos-"))
    endpoint = (
        f"127.0.0.1:{free_port()}" if backend == "c10d" else ",".join(etcd.endpoints)  # type: ignore[attr-defined]
    )
    trial = Trial(tmp, backend, endpoint, bound_s, every)
    dead: set[str] = set()
    try:
        trial.start("A")
        if backend == "c10d":
            time.sleep(1.0)  # A binds the store first
        trial.start("B")
        trial.start("C")
        full = 3 * NPROC
        if not trial.wait_for(lambda: trial.training(full) is not None, "3 training"):
            out.failures.append(f"never trained at WORLD_SIZE {full}")
            return out
        time.sleep(before_s)
        at = time.time()
        if fault == "kill-agent":
            victim = rng.choice(["B", "C"])
            kill_node(trial, victim)
            dead.add(victim)
            world = 2 * NPROC
        elif fault == "kill-worker":
            victim = rng.choice(["A", "B", "C"])
            workers = [p for p in trial.workers(victim) if WORKER.name in " ".join(p.cmdline())]
            rng.choice(workers or trial.workers(victim)).kill()
            world = 3 * NPROC
        elif fault == "stop-agent":
            victim = rng.choice(["B", "C"])
            trial.agents[victim].send_signal(signal.SIGSTOP)
            time.sleep(10.0)
            trial.agents[victim].send_signal(signal.SIGCONT)
            world = 2 * NPROC
        else:  # an etcd member and an agent
            etcd.kill_member(rng.randrange(3))  # type: ignore[attr-defined]
            victim = rng.choice(["A", "B", "C"])
            kill_node(trial, victim)
            dead.add(victim)
            world = 2 * NPROC
        out.fault = f"{fault}"
        if not trial.wait_for(lambda: trial.training(world, at) is not None, "training again"):
            out.failures.append(f"did not train again at WORLD_SIZE {world} in {bound_s:g} s")
        else:
            first = trial.training(world, at)
            out.to_training_s = (first or at) - at
            out.steps_lost = trial.steps_lost(at)
        if fault == "stop-agent":
            # The stopped agent rejoins: wait for the three of them again before stopping.
            trial.wait_for(lambda: trial.training(full, at) is not None, "3 again")
        trial.finish(out, dead)
    finally:
        trial.kill_all()
        if out.failures or not out.completed:
            out.kept = str(tmp)  # its logs: why it failed
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        if backend == "etcd":
            for i in range(3):
                if not etcd.is_member_running(i):  # type: ignore[attr-defined]
                    etcd.restart_member(i)  # type: ignore[attr-defined]
    return out


def distribution(values: list[float], digits: int) -> str:
    """first / median / p90 / last, in the order measured."""
    if not values:
        return "-"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    shown = (values[0], statistics.median(values), p90, values[-1])
    return " / ".join(f"{v:.{digits}f}" for v in shown)


def report(outcomes: list[Outcome]) -> None:
    faults = sorted({o.fault for o in outcomes})
    print("steps lost and time to training again: first / median / p90 / last")
    print(f"{'fault':<20}{'trials':>7}{'completed':>10}{'steps lost':>24}"
          f"{'to training again, s':>26}{'orphans':>9}{'hangs':>7}")  # fmt: skip
    for fault in faults:
        rows = [o for o in outcomes if o.fault == fault]
        times = [o.to_training_s for o in rows if o.to_training_s is not None]
        lost = [float(o.steps_lost) for o in rows if o.steps_lost is not None]
        print(f"{fault:<20}{len(rows):>7}{sum(o.completed for o in rows):>10}"
              f"{distribution(lost, 0):>24}{distribution(times, 1):>26}"
              f"{sum(o.orphans for o in rows):>9}{sum(o.hangs for o in rows):>7}")  # fmt: skip
    failures = [(o.fault, f) for o in outcomes for f in o.failures]
    print(f"failures: {len(failures)}")
    for fault, text in failures:
        print(f"  {fault}: {text}")
    for o in outcomes:
        if o.kept:
            print(f"  logs of a failed {o.fault} trial: {o.kept}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="c10d trials")
    parser.add_argument("--etcd-trials", type=int, default=10, help="trials on a 3-member etcd")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--faults",
        default=",".join(C10D_FAULTS),
        help="the c10d faults to pick from, comma-separated (default: all three)",
    )
    parser.add_argument("--bound", type=float, default=120.0, help="seconds for each wait")
    parser.add_argument(
        "--checkpoint-every", type=int, default=10, help="rank 0 checkpoints every N steps"
    )
    parser.add_argument(
        "--before", type=float, default=2.0, help="seconds of training before the fault"
    )
    args = parser.parse_args()
    faults = tuple(f for f in args.faults.split(",") if f)
    if not faults or any(f not in C10D_FAULTS for f in faults):
        parser.error(f"--faults: pick from {', '.join(C10D_FAULTS)}")
    rng = random.Random(args.seed)
    outcomes: list[Outcome] = []
    started = time.monotonic()
    print(
        f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
        f"{NPROC} workers per node, checkpoint every {args.checkpoint_every} steps",
        flush=True,
    )
    for i in range(args.trials):
        fault = rng.choice(faults)
        outcomes.append(
            run_trial("c10d", fault, rng, args.bound, None, args.checkpoint_every, args.before)
        )
        o = outcomes[-1]
        print(f"c10d trial {i}: {fault}: completed={o.completed} to_training={o.to_training_s} "
              f"steps_lost={o.steps_lost} orphans={o.orphans} hangs={o.hangs} {o.failures} "
              f"(load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    if args.etcd_trials and shutil.which("etcd"):
        from elastic_run.rendezvous.etcd.server import EtcdServer

        with EtcdServer(members=3) as etcd:  # started on entry, stopped on exit
            for i in range(args.etcd_trials):
                outcomes.append(
                    run_trial(
                        "etcd",
                        ETCD_FAULT,
                        rng,
                        args.bound,
                        etcd,
                        args.checkpoint_every,
                        args.before,
                    )
                )
                o = outcomes[-1]
                print(f"etcd trial {i}: completed={o.completed} to_training={o.to_training_s} "
                      f"steps_lost={o.steps_lost} orphans={o.orphans} hangs={o.hangs} "
                      f"{o.failures} (load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    loads = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average at end: {loads}; {time.monotonic() - started:.0f} s")
    report(outcomes)


if __name__ == "__main__":
    main()
