"""The processes of the timer compat tests: a timer server, or a worker that arms timers.

Either side is torch's (``torch.distributed.elastic.timer``) or ours (``elastic_run.elastic.timer``),
called only through the names and arguments torch documents.

    python timer_roles.py server torch|ours FIFO
        starts FileTimerServer(FIFO, "compat", max_interval=0.1, log_event=...), prints each
        log_event as a JSON line {"event": name, "request": {...} | null}, stops at stdin EOF.
    python timer_roles.py worker torch|ours FIFO expire|release
        expire: configure(FileTimerClient(FIFO, signal=SIGTERM)), then hangs in
            ``expires(after=2, scope="hang")``.
        release: leaves ``expires(after=2, scope="released")`` with a SIGKILL client, then hangs
            in ``expires(after=4, scope="fires")`` with a SIGTERM client. Requests are handled
            in order, so had the release been lost, "released" would fire first, with SIGKILL.
        Prints "armed" once it hangs.
"""

from __future__ import annotations

import importlib
import json
import signal
import sys
from types import ModuleType
from typing import Any


def api(kind: str) -> ModuleType:
    """The timer module of ``kind``: torch's or ours."""
    name = {"torch": "torch.distributed.elastic.timer", "ours": "elastic_run.elastic.timer"}[kind]
    return importlib.import_module(name)


def serve(timer: ModuleType, fifo: str) -> None:
    def log_event(name: str, request: Any) -> None:  # a FileTimerRequest, torch's or ours
        payload = None if request is None else json.loads(request.to_json())
        print(json.dumps({"event": name, "request": payload}), flush=True)

    server = timer.FileTimerServer(fifo, "compat", max_interval=0.1, log_event=log_event)
    server.start()
    sys.stdin.read()
    server.stop()


def work(timer: ModuleType, fifo: str, scenario: str) -> None:
    if scenario == "expire":
        timer.configure(timer.FileTimerClient(fifo, signal=signal.SIGTERM))
        with timer.expires(after=2, scope="hang"):  # time to say "armed" first
            print("armed", flush=True)
            signal.pause()
    elif scenario == "release":
        killer = timer.FileTimerClient(fifo)  # SIGKILL, torch's default
        # Released long before its 2 s; were it not, its SIGKILL would come before the next
        # timer's SIGTERM (4 s, time to say "armed" first).
        with timer.expires(after=2, scope="released", client=killer):
            pass
        terminator = timer.FileTimerClient(fifo, signal=signal.SIGTERM)
        with timer.expires(after=4, scope="fires", client=terminator):
            print("armed", flush=True)
            signal.pause()
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


def main() -> None:
    role, kind, fifo, *rest = sys.argv[1:]
    if role == "server":
        serve(api(kind), fifo)
    else:
        work(api(kind), fifo, rest[0])


if __name__ == "__main__":
    main()
