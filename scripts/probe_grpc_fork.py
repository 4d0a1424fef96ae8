"""Does spawning children break while gRPC (an etcd client) is busy in this process?

The agent spawns workers with fork + exec and, where util-linux's setpriv is missing, with a
``preexec_fn`` (which makes subprocess fork the whole process instead of vfork). gRPC
registers fork handlers (pthread_atfork) that run in such a child; an old comment said they
abort it. This probe measures it, once per value of GRPC_ENABLE_FORK_SUPPORT (unset, false,
true), each in a fresh interpreter (gRPC reads the variable when it loads):

- start a local etcd (EtcdServer) and an EtcdClient with gRPC busy: a heartbeat lease kept
  alive by the keeper thread, a thread blocked on a watch, a thread doing puts and gets;
- spawn ``--children`` processes with ``subprocess.Popen(..., preexec_fn=<prctl>)`` (fork)
  and as many without a preexec_fn (vfork), each running ``true``;
- count children that did not exit 0 (an abort reads -6), that hung (no exit within 10 s),
  and etcd operations that failed meanwhile; print the spawn times.

Usage: PYTHONPATH=. .venv/bin/python scripts/probe_grpc_fork.py [--children 300]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def _kill_unexeced_children(spawned: threading.Event, stuck: list[int]) -> None:
    """After 10 s without ``spawned``, SIGKILL children of this process still running Python."""
    if spawned.wait(10):
        return
    import psutil

    for child in psutil.Process().children():
        if child.exe() == sys.executable or child.name().startswith("python"):
            stuck.append(child.pid)
            child.kill()


def _one_run(children: int) -> dict[str, object]:
    from elastic_run.rendezvous.api import RendezvousParameters
    from elastic_run.rendezvous.etcd.backend import create_etcd_backend
    from elastic_run.rendezvous.etcd.server import EtcdServer

    libc = ctypes.CDLL("libc.so.6", use_errno=True)

    def death_signal() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    server = EtcdServer()
    server.start()
    params = RendezvousParameters("etcd", server.endpoint, "probe", 1, 1, read_timeout="10")
    backend = create_etcd_backend(params)
    stop = threading.Event()
    failures: list[str] = []
    ops = [0]

    def busy() -> None:
        while not stop.is_set():
            try:
                backend.heartbeat("n0")
                backend.set("k", b"v")
                backend.get_many(["k", "missing"])
                ops[0] += 1
            except Exception as exc:  # counted and printed: the point of the probe
                failures.append(repr(exc))

    def watching() -> None:
        while not stop.is_set():
            try:
                backend.wait_for(["never"], 0.5)
            except Exception as exc:  # counted and printed
                failures.append(repr(exc))

    threads = [threading.Thread(target=busy), threading.Thread(target=watching)]
    for t in threads:
        t.start()
    result: dict[str, object] = {
        "GRPC_ENABLE_FORK_SUPPORT": os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "<unset>")
    }
    try:
        for how in ("preexec_fn (fork)", "no preexec_fn (vfork)"):
            bad: dict[str, int] = {}
            hung = 0
            times: list[float] = []
            for _ in range(children):
                start = time.perf_counter()
                # A child stuck between fork and exec blocks Popen itself (it waits for the
                # exec): a watchdog kills such a child after 10 s and counts it as hung.
                spawned = threading.Event()
                stuck: list[int] = []
                guard = threading.Thread(target=_kill_unexeced_children, args=(spawned, stuck))
                guard.start()
                proc = subprocess.Popen(
                    ["true"],
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    close_fds=True,
                    preexec_fn=death_signal if how.startswith("preexec") else None,
                )
                spawned.set()
                guard.join()
                times.append(time.perf_counter() - start)
                code = proc.wait(timeout=10)
                if stuck:
                    hung += 1
                    if hung >= 3:
                        break  # enough to know; each costs 10 s
                elif code != 0:
                    bad[str(code)] = bad.get(str(code), 0) + 1
            result[how] = {
                "children": len(times),
                "exit codes other than 0": bad,
                "hung": hung,
                "spawn ms median": round(statistics.median(times) * 1000, 2),
                "spawn ms max": round(max(times) * 1000, 2),
            }
        # gRPC still works in the parent after all those forks.
        backend.set("after", b"1")
        result["etcd works after"] = backend.get("after") == b"1"
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        backend.close()
        server.stop()
    result["etcd ops during"] = ops[0]
    result["etcd op failures"] = failures[:5]
    result["etcd op failure count"] = len(failures)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--children", type=int, default=300)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one_run(args.children)))
        return 0
    for value in (None, "false", "true"):
        env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
        if value is not None:
            env["GRPC_ENABLE_FORK_SUPPORT"] = value
        out = subprocess.run(
            [sys.executable, __file__, "--one", "--children", str(args.children)],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
        if out.returncode != 0 or not line:
            print(f"GRPC_ENABLE_FORK_SUPPORT={value}: the probe exited {out.returncode}")
            print(out.stderr[-3000:])
            continue
        print(json.dumps(json.loads(line), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
