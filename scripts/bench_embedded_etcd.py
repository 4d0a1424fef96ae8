"""Benchmark: the rendezvous host dies. torchrun and elastic-run on c10d, elastic-run on
embedded-etcd, side by side (issue 26).

Three hosts as network namespaces on a bridge (``tests/netns_hosts.py``), each with its own
address; one agent per host (``--nnodes 2:3``), one worker each running
``scripts/bench_workers/train_steps.py`` (a gloo all_reduce loop that stamps every step). Once
all three train, the bench SIGKILLs host a's agent, its process group and its workers:

- ``torchrun c10d``: a's agent hosts the TCPStore (the endpoint is a's address);
- ``elastic-run c10d``: the same (``is_host`` by address);
- ``elastic-run embedded-etcd``: a, b and c each run one etcd member (``--rdzv-endpoint a,b,c``);
  a's member dies with its agent.

Per launcher it prints the outcome (trains on at WORLD_SIZE 2, or the survivors' exit codes) and
first/median/p90/last over the runs of: the time from the kill to the moment both survivors took
a step at WORLD_SIZE 2 (``trains again``), or to the moment both survivors exited (``exit``).
Heartbeat budget for both elastic-run backends: ``keep_alive_interval=0.25,
keep_alive_max_attempt=4`` (1 s), ``last_call_timeout=1``; torchrun with ``last_call_timeout=1``.
No assertions: figures only; the load average is printed beside them. Root only (``ip netns``).

``--case`` picks what happens to the hosts (default ``kill``, the comparison above):

- ``cut``: host a's network is cut for ``--cut-s`` seconds (30) and healed (elastic-run on
  embedded-etcd only): the time from the cut to b and c training at WORLD_SIZE 2, and from the
  heal to all three training at WORLD_SIZE 3 again (a back in the job);
- ``kill-two``: hosts a and b are SIGKILLed (two of the three etcd members: no quorum left;
  elastic-run on embedded-etcd only): the time from the kill to c's exit, and its exit code.

    PYTHONPATH=. .venv/bin/python scripts/bench_embedded_etcd.py --runs 3
    PYTHONPATH=. .venv/bin/python scripts/bench_embedded_etcd.py --case cut --runs 3
    PYTHONPATH=. .venv/bin/python scripts/bench_embedded_etcd.py --case kill-two --runs 3

``BENCH_KEEP=1`` keeps each run's agent logs (``a.log``, ``b.log``, ``c.log``, with the events)
and steps, and prints where.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.netns_hosts import Hosts  # noqa: E402

WORKER = Path(__file__).resolve().parent / "bench_workers" / "train_steps.py"
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 240.0
POLL_S = 0.05
CONF = "last_call_timeout=1,keep_alive_interval=0.25,keep_alive_max_attempt=4,read_timeout=3"
LAUNCHERS = ("torchrun-c10d", "elastic-run-c10d", "elastic-run-embedded-etcd")


@dataclass
class Outcome:
    trains_again_s: float | None  # both survivors stepped at WORLD_SIZE 2
    exit_s: float | None  # both survivors exited (kill-two: c exited)
    codes: tuple[int | None, ...]
    back_s: float | None = None  # cut: from the heal to all three stepping at WORLD_SIZE 3
    a_led: bool | None = None  # embedded-etcd: a's member led the cluster when it was hit


def _a_leads(hosts: Any) -> bool | None:
    """Whether host a's etcd member is the cluster's leader (asked from inside host a)."""
    etcdctl = shutil.which("etcdctl")
    if etcdctl is None:
        return None
    proc = hosts.run(
        1,
        [etcdctl, f"--endpoints=http://{hosts.addr(1)}:29410", "endpoint", "status", "-w", "json"],
        env=dict(os.environ, ETCDCTL_API="3"),
        stdout=subprocess.PIPE,
    )
    try:
        out, _ = proc.communicate(timeout=10)
        status = json.loads(out)[0]["Status"]
        return bool(status["header"]["member_id"] == status["leader"])
    except Exception:  # noqa: BLE001 - a figure beside the bench's, not the bench
        return None


def _steps(path: Path) -> list[tuple[float, str, int]]:
    """(time, node, world size) of every step line."""
    found = []
    try:
        text = path.read_text()
    except OSError:
        return []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[0] == "step":
            found.append((float(parts[1]), parts[2], int(parts[4])))
    return found


def _command(launcher: str, hosts: Hosts, i: int, run_id: str, tmp: Path) -> list[str]:
    addr = hosts.addr(i)
    common = ["--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-id", run_id]
    script = [str(WORKER), str(tmp / "steps"), str(tmp / "stop"), "-1"]
    if launcher == "torchrun-c10d":
        return [
            str(BIN / "torchrun"), *common, "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{hosts.addr(1)}:29400",
            # torch matches the endpoint against the host name, which resolves to loopback in
            # every namespace here: say which agent hosts the store.
            "--rdzv-conf", f"last_call_timeout=1,is_host={'true' if i == 1 else 'false'}",
            "--local-addr", addr, *script,
        ]  # fmt: skip
    conf = CONF
    if launcher == "elastic-run-c10d":
        backend, endpoint = "c10d", f"{hosts.addr(1)}:29400"
        conf += f",is_host={'true' if i == 1 else 'false'}"
    else:
        backend, endpoint = "embedded-etcd", ",".join(hosts.addrs)
    return [
        sys.executable, "-m", "elastic_run", *common, "--rdzv-backend", backend,
        "--rdzv-endpoint", endpoint, "--rdzv-conf", conf, "--local-addr", addr, "--no-live",
        "--log-dir", str(tmp / f"logs{i}"), *script,
    ]  # fmt: skip


def _kill_host(proc: Any) -> None:
    """SIGKILL an agent's process group and every process under it."""
    tree = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    for child in tree:
        try:
            child.kill()
        except psutil.Error:
            pass


def _first_at(steps: Path, world: int, after_wall: float, nodes: set[str]) -> float | None:
    """When every node of ``nodes`` had stepped at ``world`` after ``after_wall`` (epoch s)."""
    seen = [(t, n) for t, n, w in _steps(steps) if w == world and t > after_wall]
    if not {n for _, n in seen} >= nodes:
        return None
    return max(min(t for t, n2 in seen if n2 == n) for n in nodes)


def _cut(
    hosts: Hosts, procs: list[Any], steps: Path, tmp: Path, bound_s: float, cut_s: float
) -> Outcome:
    cut_wall = time.time()
    hosts.partition(1)
    trains = back = None
    while time.time() - cut_wall < cut_s:
        if trains is None:
            at = _first_at(steps, 2, cut_wall, {"b", "c"})
            trains = at - cut_wall if at is not None else None
        time.sleep(POLL_S)
    healed_wall = time.time()
    hosts.heal(1)
    while time.time() - healed_wall < bound_s:
        at = _first_at(steps, 3, healed_wall, {"a", "b", "c"})
        if at is not None:
            back = at - healed_wall
            break
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(POLL_S)
    (tmp / "stop").touch()
    for p in procs:
        try:
            p.wait(timeout=60)
        except Exception:  # noqa: BLE001 - the bench reports, it does not fail
            pass
    return Outcome(trains, None, tuple(p.poll() for p in procs), back)


def _kill_two(procs: list[Any], bound_s: float) -> Outcome:
    killed = time.monotonic()
    for proc in procs[:2]:
        _kill_host(proc)
    survivor = procs[2]
    while time.monotonic() - killed < bound_s and survivor.poll() is None:
        time.sleep(POLL_S)
    exit_s = time.monotonic() - killed if survivor.poll() is not None else None
    return Outcome(None, exit_s, (survivor.poll(),))


def run_once(launcher: str, bound_s: float, case: str = "kill", cut_s: float = 30.0) -> Outcome:
    hosts = Hosts(3)
    tmp = Path(tempfile.mkdtemp(prefix="bench-emb-"))
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), GLOO_SOCKET_IFNAME="eth0")
    env["OMP_NUM_THREADS"] = "1"
    procs = []
    try:
        for i, node in ((1, "a"), (2, "b"), (3, "c")):
            log = (tmp / f"{node}.log").open("wb")
            procs.append(
                hosts.run(
                    i,
                    _command(launcher, hosts, i, run_id, tmp),
                    env=dict(env, BENCH_NODE=node),
                    stdout=log,
                )
            )
        steps = tmp / "steps"
        deadline = time.monotonic() + START_TIMEOUT_S
        while {n for _, n, w in _steps(steps) if w == 3} != {"a", "b", "c"}:
            if time.monotonic() > deadline:
                return Outcome(None, None, tuple(p.poll() for p in procs[1:]))
            time.sleep(POLL_S)
        a_led = _a_leads(hosts) if launcher == "elastic-run-embedded-etcd" else None
        if case == "cut":
            return replace(_cut(hosts, procs, steps, tmp, bound_s, cut_s), a_led=a_led)
        if case == "kill-two":
            return _kill_two(procs, bound_s)
        killed_wall = time.time()
        killed = time.monotonic()
        _kill_host(procs[0])
        trains: float | None = None
        while time.monotonic() - killed < bound_s:
            at = _first_at(steps, 2, killed_wall, {"b", "c"})
            if at is not None:
                trains = at - killed_wall
                break
            if all(p.poll() is not None for p in procs[1:]):
                break
            time.sleep(POLL_S)
        exit_s = None
        if trains is None:
            while time.monotonic() - killed < bound_s and any(p.poll() is None for p in procs[1:]):
                time.sleep(POLL_S)
            if all(p.poll() is not None for p in procs[1:]):
                exit_s = time.monotonic() - killed
        else:
            (tmp / "stop").touch()
            for p in procs[1:]:
                try:
                    p.wait(timeout=60)
                except Exception:  # noqa: BLE001 - the bench reports, it does not fail
                    pass
        return Outcome(trains, exit_s, tuple(p.poll() for p in procs[1:]), a_led=a_led)
    finally:
        hosts.close()
        if os.environ.get("BENCH_KEEP"):
            print(f"  kept the run's logs and steps in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _stats(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (
        f"first {values[0]:.2f}  median {statistics.median(values):.2f}  p90 {p90:.2f}  "
        f"last {values[-1]:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bound", type=float, default=90.0, help="seconds to wait after the kill")
    parser.add_argument("--only", choices=LAUNCHERS, action="append")
    parser.add_argument("--case", choices=("kill", "cut", "kill-two"), default="kill")
    parser.add_argument("--cut-s", type=float, default=30.0, help="how long the cut lasts")
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("ip") is None:
        sys.exit("bench_embedded_etcd.py needs root and iproute2 (ip netns)")
    if args.case != "kill":
        _other_case(args)
        return
    launchers = args.only or list(LAUNCHERS)
    results: dict[str, list[Outcome]] = {name: [] for name in launchers}
    for _ in range(args.runs):
        for name in launchers:  # runs alternate between the launchers
            results[name].append(run_once(name, args.bound))
    print(f"host a (the rendezvous host / one etcd member) SIGKILLed; {args.runs} runs each; "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    for name in launchers:
        outs = results[name]
        trains = [o.trains_again_s for o in outs if o.trains_again_s is not None]
        exits = [o.exit_s for o in outs if o.exit_s is not None]
        codes = sorted({c for o in outs if o.trains_again_s is None for c in o.codes}, key=str)
        print(f"  {name:27} trains again at WORLD_SIZE 2 in {len(trains)}/{len(outs)} runs: "
              f"{_stats(trains)} s")  # fmt: skip
        if len(trains) < len(outs):
            print(f"  {'':27} otherwise the survivors exit with {codes}; time to exit: "
                  f"{_stats(exits)} s")  # fmt: skip
        if any(o.a_led is not None for o in outs):
            print(f"  {'':27} each run (seconds to training again, whether a's member led): "
                  + ", ".join(_run_text(o) for o in outs))  # fmt: skip


def _run_text(o: Outcome) -> str:
    took = f"{o.trains_again_s:.2f}" if o.trains_again_s is not None else f"exit {o.codes}"
    led = {True: "a led", False: "a followed", None: "leader unknown"}[o.a_led]
    return f"{took} ({led})"


def _other_case(args: argparse.Namespace) -> None:
    """``cut`` or ``kill-two``, elastic-run on embedded-etcd."""
    outs = [
        run_once("elastic-run-embedded-etcd", args.bound, args.case, args.cut_s)
        for _ in range(args.runs)
    ]
    load = os.getloadavg()[0]
    if args.case == "cut":
        print(f"host a's network cut for {args.cut_s:.0f} s, then healed; elastic-run on "
              f"embedded-etcd; {args.runs} runs; load average {load:.1f}")  # fmt: skip
        trains = [o.trains_again_s for o in outs if o.trains_again_s is not None]
        back = [o.back_s for o in outs if o.back_s is not None]
        print(f"  cut -> b and c train at WORLD_SIZE 2, in {len(trains)}/{len(outs)} runs: "
              f"{_stats(trains)} s")  # fmt: skip
        print(f"  heal -> a, b and c train at WORLD_SIZE 3, in {len(back)}/{len(outs)} runs: "
              f"{_stats(back)} s")  # fmt: skip
        print(f"  exit codes after the stop: {[o.codes for o in outs]}")
        print("  each run (seconds from the cut to b and c at WORLD_SIZE 2): "
              + ", ".join(_run_text(o) for o in outs))  # fmt: skip
        return
    print(f"hosts a and b (two of three etcd members) SIGKILLed; elastic-run on embedded-etcd; "
          f"{args.runs} runs; load average {load:.1f}")  # fmt: skip
    exits = [o.exit_s for o in outs if o.exit_s is not None]
    print(f"  kill -> c exits, in {len(exits)}/{len(outs)} runs: {_stats(exits)} s; "
          f"exit codes {[o.codes[0] for o in outs]}")  # fmt: skip


if __name__ == "__main__":
    main()
