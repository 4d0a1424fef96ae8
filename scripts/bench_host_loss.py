"""Benchmark: a host loss on embedded etcd, where the time goes, run by run (issue 38).

Three hosts as network namespaces on a bridge (``tests/netns_hosts.py``), each with its own
address; on each one elastic-run agent with the defaults (``--nnodes 2:3 --nproc-per-node 1
--rdzv-backend embedded-etcd --rdzv-endpoint a,b,c``, no ``--rdzv-conf``, no ``--max-restarts``)
and one worker running ``scripts/bench_workers/train_steps.py`` (a gloo all_reduce loop that
stamps every step). Once all three train at WORLD_SIZE 3, the bench waits a random moment
(uniform in ``[0, --window]`` s) and SIGKILLs every process of one host: its agent, its etcd
member (and keeper) and its worker. Runs alternate the victim: the host whose etcd member leads
the cluster (odd runs: 1, 3, ...), then a follower's host picked at random.

For each run it prints a row of where the time went, every figure in seconds from the kill:

- ``notice``: the first survivor's first word of the loss: its worker failed (the dead peer's
  gloo connection), or its agent saw the member-lost verdict, whichever came first;
- ``verdict``: the first survivor's agent acted on the member-lost verdict (``membership.changed``,
  or the ``restart`` of a worker failure that its look found behind the loss, not counted);
- ``leader``: a survivor's etcd member names a new leader (only when the leader's host died;
  read by a small poller of the member's status on each survivor, every 20 ms);
- ``round``: both survivors completed the new round (``rendezvous.complete``);
- ``started``: both survivors started their workers (``workers.started``);
- ``trains``: both survivors' workers took a step at WORLD_SIZE 2.

and the survivors' exit codes, their restart count afterwards, and each worker failure: when
the worker failed, whether it counted, and when its look ended (``worker.failed``). Then first / median / p90 / last of ``trains``, how many runs
were under 3 s, and every verdict seen.

``--torch-runs N`` (default 3) also times torchrun (c10d, torch's defaults but
``--max-restarts 3``, without which its survivors exit 1 on the dead peer's gloo error) on the
same three hosts in the same session, the runs interleaved: host a's agent hosts the TCPStore,
so torch can only recover when another host dies (host c is SIGKILLed: ``torchrun, c killed``);
``--torch-store-runs N`` (default 1) shows what it does when the store's host a dies.

    PYTHONPATH=. .venv/bin/python scripts/bench_host_loss.py --runs 10
    PYTHONPATH=. .venv/bin/python scripts/bench_host_loss.py --runs 10 --torch-runs 0 \
        --torch-store-runs 0 --rdzv-conf election_timeout=1    # etcd's own raft timing

No assertions: figures only; ``uptime`` is printed before and after. Root only (``ip netns``).
``BENCH_KEEP=1`` keeps each run's logs, events, steps and leader readings, and prints where.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_embedded_etcd import WORKER, _first_at, _kill_host, _steps

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.netns_hosts import Hosts  # noqa: E402

BIN = Path(sys.executable).parent
NAMES = ("a", "b", "c")
CLIENT_PORT = 29410
START_TIMEOUT_S = 240.0
POLL_S = 0.02
GOAL_S = 3.0

# Runs inside a survivor's namespace: reads its own etcd member's status every 20 ms through
# etcd's JSON gateway and prints ``<epoch s> <leader id>`` at start and whenever it changes.
_LEADER_POLLER = """
import json, sys, time, urllib.request
url, last = sys.argv[1], None
while True:
    try:
        req = urllib.request.Request(url, data=b"{}", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=0.5) as resp:
            leader = json.load(resp).get("leader", "0")
    except Exception:
        leader = "none"
    if leader != last:
        print(f"{time.time()!r} {leader}", flush=True)
        last = leader
    time.sleep(0.02)
"""


@dataclass
class Run:
    """One run: what was killed when, and what the survivors did, in seconds from the kill."""

    launcher: str
    victim: str = ""
    victim_led: bool | None = None  # its etcd member led the cluster
    victim_master: bool = False  # it held group rank 0 (the workers' MASTER_ADDR)
    delay_s: float = 0.0
    notice_s: float | None = None
    notice_by: str = ""
    verdict_s: float | None = None
    leader_s: float | None = None
    round_s: float | None = None
    started_s: float | None = None
    trains_s: float | None = None
    exit_s: float | None = None
    codes: dict[str, int | None] = field(default_factory=dict)
    restarts: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    reasons: set[str] = field(default_factory=set)
    # The raft terms whose leader the survivors' members saw elected: before the kill (the
    # start's election, and any needless one while all three trained) and after it.
    terms_before: set[int] = field(default_factory=set)
    terms_after: set[int] = field(default_factory=set)
    note: str = ""


RDZV_CONF: list[str] = []  # --rdzv-conf of elastic-run's agents (none: the defaults)


def _elastic_command(hosts: Hosts, i: int, run_id: str, tmp: Path) -> list[str]:
    return [
        sys.executable, "-m", "elastic_run", "--nnodes", "2:3", "--nproc-per-node", "1",
        *(["--rdzv-conf", RDZV_CONF[0]] if RDZV_CONF else []),
        "--rdzv-id", run_id, "--rdzv-backend", "embedded-etcd",
        "--rdzv-endpoint", ",".join(hosts.addrs), "--local-addr", hosts.addr(i), "--no-live",
        "--log-dir", str(tmp / f"logs-{NAMES[i - 1]}"),
        str(WORKER), str(tmp / "steps"), str(tmp / "stop"), "-1",
    ]  # fmt: skip


def _torch_command(hosts: Hosts, i: int, run_id: str, tmp: Path) -> list[str]:
    return [
        str(BIN / "torchrun"), "--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "3",
        "--rdzv-id", run_id, "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{hosts.addr(1)}:29400",
        # torch matches the endpoint against the host name, which resolves to loopback in every
        # namespace here: say which agent hosts the store.
        "--rdzv-conf", f"is_host={'true' if i == 1 else 'false'}",
        "--local-addr", hosts.addr(i),
        str(WORKER), str(tmp / "steps"), str(tmp / "stop"), "-1",
    ]  # fmt: skip


def _member_status(hosts: Hosts, i: int) -> tuple[str, str] | None:
    """(member id, leader id) of host i's etcd member, asked from inside host i."""
    proc = hosts.run(
        i,
        [
            "etcdctl",
            f"--endpoints=http://{hosts.addr(i)}:{CLIENT_PORT}",
            "endpoint",
            "status",
            "-w",
            "json",
        ],  # fmt: skip
        env=dict(os.environ, ETCDCTL_API="3"),
        stdout=subprocess.PIPE,
    )
    try:
        out, _ = proc.communicate(timeout=10)
        header = json.loads(out)[0]["Status"]
        return str(header["header"]["member_id"]), str(header["leader"])
    except Exception:  # noqa: BLE001 - no reading: the caller says "leader unknown"
        return None


def _leader_host(hosts: Hosts) -> int | None:
    """Which host's member leads the etcd cluster (1-based), None when it cannot be read."""
    ids: dict[str, int] = {}
    leader = None
    for i in (1, 2, 3):
        status = _member_status(hosts, i)
        if status is not None:
            ids[status[0]] = i
            leader = status[1]
    return ids.get(leader) if leader is not None else None


def _events(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _events_of(tmp: Path, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for path in sorted((tmp / f"logs-{name}").glob("*/events.jsonl")):
        found += _events(path)
    return found


def _first_ts(events: list[dict[str, Any]], kind: str, after: float) -> float | None:
    return next((e["ts"] for e in events if e["kind"] == kind and e["ts"] > after), None)


def _led_changes(path: Path, after: float, old: str | None) -> float | None:
    """When the poller's member first named a leader other than ``old`` after ``after``."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and float(parts[0]) > after and parts[1] not in ("0", "none", old):
            return float(parts[0])
    return None


def _start(hosts: Hosts, launcher: str, run_id: str, tmp: Path) -> list[Any]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), GLOO_SOCKET_IFNAME="eth0")
    env["OMP_NUM_THREADS"] = "1"
    procs = []
    for i, name in enumerate(NAMES, start=1):
        host_tmp = tmp / f"tmp-{name}"  # the member's folder (and its log) lands here
        host_tmp.mkdir()
        command = (_elastic_command if launcher == "elastic-run" else _torch_command)(
            hosts, i, run_id, tmp
        )
        procs.append(
            hosts.run(
                i,
                command,
                env=dict(env, BENCH_NODE=name, TMPDIR=str(host_tmp)),
                stdout=(tmp / f"{name}.log").open("wb"),
            )
        )
    return procs


def run_once(launcher: str, victim_kind: str, window_s: float, bound_s: float) -> Run:
    """One run; ``victim_kind``: ``leader``, ``follower`` (elastic-run), ``a`` or ``c`` (torch)."""
    run = Run(launcher)
    hosts = Hosts(3)
    tmp = Path(tempfile.mkdtemp(prefix="bench-hostloss-"))
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    pollers: list[Any] = []
    procs: list[Any] = []
    try:
        procs = _start(hosts, launcher, run_id, tmp)
        steps = tmp / "steps"
        deadline = time.monotonic() + START_TIMEOUT_S
        while {n for _, n, w in _steps(steps) if w == 3} != set(NAMES):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                run.note = "never trained at WORLD_SIZE 3"
                run.codes = {n: p.poll() for n, p in zip(NAMES, procs, strict=True)}
                return run
            time.sleep(POLL_S)
        run.delay_s = random.uniform(0.0, window_s)
        time.sleep(run.delay_s)
        old_leader: str | None = None
        if launcher == "elastic-run":
            led = _leader_host(hosts)
            if victim_kind == "leader" and led is not None:
                victim = led
            else:
                victim = random.choice([i for i in (1, 2, 3) if i != led])
            run.victim_led = None if led is None else victim == led
            status = _member_status(hosts, victim)
            old_leader = status[1] if status is not None else None
        else:
            victim = 1 if victim_kind == "a" else 3
        run.victim = NAMES[victim - 1]
        survivors = [i for i in (1, 2, 3) if i != victim]
        if launcher == "elastic-run":
            for i in survivors:
                url = f"http://{hosts.addr(i)}:{CLIENT_PORT}/v3/maintenance/status"
                out = (tmp / f"leader-{NAMES[i - 1]}").open("wb")
                pollers.append(
                    hosts.run(i, [sys.executable, "-c", _LEADER_POLLER, url], stdout=out)
                )
            ready = time.monotonic() + 10
            while time.monotonic() < ready and not all(
                (tmp / f"leader-{NAMES[i - 1]}").stat().st_size for i in survivors
            ):
                time.sleep(POLL_S)
        victim_events = _events_of(tmp, run.victim)
        complete = [e for e in victim_events if e["kind"] == "rendezvous.complete"]
        run.victim_master = bool(complete) and complete[-1]["fields"].get("group_rank") == 0
        killed_wall = time.time()
        killed = time.monotonic()
        _kill_host(procs[victim - 1])
        names = {NAMES[i - 1] for i in survivors}
        alive = [procs[i - 1] for i in survivors]
        while time.monotonic() - killed < bound_s:
            at = _first_at(steps, 2, killed_wall, names)
            if at is not None:
                run.trains_s = at - killed_wall
                break
            if all(p.poll() is not None for p in alive):
                break
            time.sleep(POLL_S)
        if launcher == "elastic-run":
            _read_elections(run, tmp, survivors, killed_wall)
        if run.trains_s is not None:
            (tmp / "stop").touch()
        for p in alive:
            try:
                p.wait(timeout=max(1.0, bound_s - (time.monotonic() - killed)))
            except subprocess.TimeoutExpired:
                pass
        if run.trains_s is None and all(p.poll() is not None for p in alive):
            run.exit_s = time.monotonic() - killed
        run.codes = {NAMES[i - 1]: procs[i - 1].poll() for i in survivors}
        if launcher == "elastic-run":
            _read_phases(run, tmp, survivors, killed_wall, old_leader)
        _read_restarts(run, tmp, names)
        return run
    finally:
        for p in pollers:
            p.kill()
        hosts.close()
        if os.environ.get("BENCH_KEEP"):
            print(f"  kept the run's logs in {tmp}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _read_phases(
    run: Run, tmp: Path, survivors: list[int], killed: float, old_leader: str | None
) -> None:
    notices: list[tuple[float, str]] = []
    verdicts, rounds, starts = [], [], []
    for i in survivors:
        name = NAMES[i - 1]
        events = _events_of(tmp, name)
        failed = [e for e in events if e["kind"] == "worker.failed" and e["ts"] > killed]
        for e in failed:
            # The event comes once the failure's look ended; the failure itself is older.
            at = e["fields"].get("failed_at") or e["ts"]
            notices.append((at, f"{name}'s worker failed"))
            counted = e["fields"].get("counted")
            run.failures.append(
                f"{name} +{at - killed:.2f}: {'counted' if counted else 'not counted'} "
                f"+{e['ts'] - killed:.2f}"
            )
        changed = [e for e in events if e["kind"] == "membership.changed" and e["ts"] > killed]
        for e in changed:
            run.reasons.add(str(e["fields"].get("reason")))
        # A failure that did not count is restarted for the verdict its look saw.
        spared = [
            e
            for e in events
            if e["kind"] == "restart" and e["ts"] > killed and not e["fields"].get("counted")
        ]
        if spared:
            run.reasons.add("restart, not counted")
        acted = sorted(e["ts"] for e in changed[:1] + spared[:1])
        if acted:
            verdicts.append(acted[0])
            notices.append((acted[0], f"{name} saw the verdict"))
        rounds.append(_first_ts(events, "rendezvous.complete", killed))
        starts.append(_first_ts(events, "workers.started", killed))
    if notices:
        first = min(notices)
        run.notice_s, run.notice_by = first[0] - killed, first[1]
    run.verdict_s = min(verdicts) - killed if verdicts else None
    run.round_s = max(rounds) - killed if rounds and None not in rounds else None  # type: ignore[operator]
    run.started_s = max(starts) - killed if starts and None not in starts else None  # type: ignore[operator]
    if run.victim_led:
        found = [
            _led_changes(tmp / f"leader-{NAMES[i - 1]}", killed, old_leader) for i in survivors
        ]
        known = [t for t in found if t is not None]
        run.leader_s = min(known) - killed if known else None


def _read_elections(run: Run, tmp: Path, survivors: list[int], killed: float) -> None:
    """The terms the survivors' members saw a leader elected in, before and after the kill.

    etcd 3.4's raft lines carry whole seconds (``raft2026/12/02 02:55:59 INFO: ... elected
    leader ... at term 2``): a line of the kill's second counts as after it. Read before the
    job ends (its members then remove their folders).
    """
    cut = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(int(killed)))
    for i in survivors:
        for path in (tmp / f"tmp-{NAMES[i - 1]}").glob("elastic-run-etcd-*/member.log"):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                if "elected leader" not in line or " at term " not in line:
                    continue
                term = int(line.rsplit(" at term ", 1)[1].split()[0])
                stamp = line.removeprefix("raft")[:19]
                (run.terms_after if stamp >= cut else run.terms_before).add(term)


def _read_restarts(run: Run, tmp: Path, names: set[str]) -> None:
    """Each survivor's TORCHELASTIC_RESTART_COUNT after the loss, from its workers' env."""
    for name in sorted(names):
        text = (tmp / f"{name}.log").read_text(errors="replace")
        for line in text.splitlines():
            if "restart count" in line and "workers.started" in line:
                run.restarts[name] = line.rsplit("restart count", 1)[1].strip(" )")


def _stats(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (
        f"first {values[0]:.2f}  median {statistics.median(values):.2f}  p90 {p90:.2f}  "
        f"last {values[-1]:.2f}"
    )


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _uptime() -> str:
    try:
        return subprocess.run(
            ["uptime"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return f"load average {os.getloadavg()}"


def _elastic_row(k: int, r: Run) -> str:
    who = r.victim + {True: " (leader", False: " (follower", None: " (?"}[r.victim_led]
    who += ", rank 0)" if r.victim_master else ")"
    fails = "; ".join(r.failures) or "none"
    fails += f"; terms elected before {sorted(r.terms_before)}, after {sorted(r.terms_after)}"
    restarts = ",".join(f"{n}={c}" for n, c in sorted(r.restarts.items())) or "-"
    return (
        f"  {k:>3} {who:15} {r.delay_s:5.2f} {_f(r.notice_s):>6} {r.notice_by:22} "
        f"{_f(r.verdict_s):>7} {_f(r.leader_s):>6} {_f(r.round_s):>6} {_f(r.started_s):>6} "
        f"{_f(r.trains_s):>6}  {r.codes}; {restarts}; {fails}{' ' + r.note if r.note else ''}"
    )


def _print_elastic(runs: list[Run]) -> None:
    print("elastic-run, embedded etcd; seconds from the kill:")
    print(
        f"  {'run':>3} {'victim':15} {'delay':>5} {'notice':>6} {'by':22} {'verdict':>7} "
        f"{'leader':>6} {'round':>6} {'start':>6} {'trains':>6}  exit codes; restart count; "
        "worker failures"
    )
    for k, r in enumerate(runs, start=1):
        print(_elastic_row(k, r))
    trains = [r.trains_s for r in runs if r.trains_s is not None]
    under = sum(1 for t in trains if t < GOAL_S)
    print(f"  trains again at WORLD_SIZE 2 in {len(trains)}/{len(runs)} runs, under {GOAL_S:.0f} s "
          f"in {under}/{len(runs)}: {_stats(trains)} s")  # fmt: skip
    for label, pick in (
        ("leader's host killed", lambda r: r.victim_led is True),
        ("a follower's host killed", lambda r: r.victim_led is False),
    ):
        part = [r.trains_s for r in runs if pick(r) and r.trains_s is not None]
        print(f"    {label}: {_stats(part)} s")
    for label, attr in (
        ("verdict", "verdict_s"),
        ("leader", "leader_s"),
        ("round", "round_s"),
        ("started", "started_s"),
    ):
        vals = [getattr(r, attr) for r in runs if getattr(r, attr) is not None]
        print(f"    {label:8} {_stats(vals)} s")
    needless = sum(max(0, len(r.terms_before) - 1) for r in runs)
    print(f"  elections while all three trained, beyond the start's one: {needless} "
          f"(over {len(runs)} runs)")  # fmt: skip
    codes = sorted({str(c) for r in runs for c in r.codes.values()})
    counted = sum(1 for r in runs for f in r.failures if ": counted" in f)
    reasons = sorted({x for r in runs for x in r.reasons})
    print(f"  verdicts seen: exit codes {codes}; membership reasons {reasons}; worker failures "
          f"{sum(len(r.failures) for r in runs)}, counted {counted}")  # fmt: skip


def _print_torch(runs: list[Run], label: str) -> None:
    if not runs:
        return
    trains = [r.trains_s for r in runs if r.trains_s is not None]
    print(f"torchrun c10d (--max-restarts 3, torch's defaults otherwise), {label}: trains again "
          f"at WORLD_SIZE 2 in {len(trains)}/{len(runs)} runs: {_stats(trains)} s")  # fmt: skip
    for k, r in enumerate(runs, start=1):
        took = (
            f"{r.trains_s:.2f} s"
            if r.trains_s is not None
            else (f"survivors exited after {r.exit_s:.2f} s" if r.exit_s is not None else "neither")
        )
        restarts = ",".join(f"{n}={c}" for n, c in sorted(r.restarts.items())) or "-"
        print(f"  {k:>3} delay {r.delay_s:.2f}: {took}; exit codes {r.codes}; restart count "
              f"{restarts}{' ' + r.note if r.note else ''}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--torch-runs", type=int, default=3)
    parser.add_argument("--torch-store-runs", type=int, default=1)
    parser.add_argument("--window", type=float, default=3.0, help="the kill comes in [0, window] s")
    parser.add_argument("--bound", type=float, default=90.0, help="seconds to wait after the kill")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--rdzv-conf",
        default="",
        help="elastic-run's --rdzv-conf (default none); election_timeout=1 gives etcd's defaults",
    )
    args = parser.parse_args()
    if args.rdzv_conf:
        RDZV_CONF.append(args.rdzv_conf)
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("etcdctl") is None:
        sys.exit("bench_host_loss.py needs root, iproute2 (ip netns) and etcdctl")
    if args.seed is not None:
        random.seed(args.seed)
    print(f"before: {_uptime()}", flush=True)
    elastic: list[Run] = []
    torch_c: list[Run] = []
    torch_a: list[Run] = []
    for k in range(max(args.runs, args.torch_runs, args.torch_store_runs)):
        if k < args.runs:
            elastic.append(
                run_once(
                    "elastic-run", "leader" if k % 2 == 0 else "follower", args.window, args.bound
                )  # fmt: skip
            )
            print(f"elastic-run {_elastic_row(k + 1, elastic[-1])}", flush=True)
        if k < args.torch_runs:
            torch_c.append(run_once("torchrun", "c", args.window, args.bound))
            print(f"torchrun, c killed: {_f(torch_c[-1].trains_s)} s, {torch_c[-1].codes}",
                  flush=True)  # fmt: skip
        if k < args.torch_store_runs:
            torch_a.append(run_once("torchrun", "a", args.window, args.bound))
            print(f"torchrun, a killed: {_f(torch_a[-1].trains_s)} s, exit after "
                  f"{_f(torch_a[-1].exit_s)} s, {torch_a[-1].codes}", flush=True)  # fmt: skip
    print(f"after: {_uptime()}")
    print(f"one host of three SIGKILLed (agent, etcd member, worker) at a random moment "
          f"[0, {args.window:.0f}] s into training; {os.cpu_count()} CPUs; elastic-run's "
          f"--rdzv-conf {args.rdzv_conf or '(none)'}")  # fmt: skip
    _print_elastic(elastic)
    _print_torch(torch_c, "host c (not the store's host) killed")
    _print_torch(torch_a, "host a (the store's host) killed")


if __name__ == "__main__":
    main()
