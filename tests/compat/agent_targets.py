"""Worker entrypoints for the agent compat tests: module-level, so a spawned worker can import them.

Each reads the worker environment the agent gives (torchrun's), as a function entrypoint in a
torch job would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ENV_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
)


def report(tag: str) -> dict[str, Any]:
    """Return the worker's environment and process facts, tagged."""
    print(f"worker {os.environ['RANK']} says {tag}", flush=True)
    return {
        "tag": tag,
        "pid": os.getpid(),
        "sid": os.getsid(0),
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
    }


def fail_on(rank: str, message: str) -> str:
    """Raise ValueError(message) on global rank ``rank``; return the rank elsewhere."""
    if os.environ["RANK"] == rank:
        raise ValueError(message)
    return os.environ["RANK"]


def fail_first_attempt() -> int:
    """Fail on the first attempt (restart count 0), return the restart count after."""
    count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if count == 0 and os.environ["LOCAL_RANK"] == "0":
        raise RuntimeError("first attempt fails")
    return count


def kill_self(sig: int) -> None:
    """Die by ``sig`` (a worker killed by a signal)."""
    os.kill(os.getpid(), sig)
    time.sleep(60)


def exit_with(code: int) -> None:
    """End with ``sys.exit(code)``."""
    sys.exit(code)


def put_on_queue(queue: Any) -> int:
    """Put (rank, pid) on a multiprocessing queue made by the agent's process (torch's example)."""
    queue.put((int(os.environ["RANK"]), os.getpid()))
    return int(os.environ["RANK"])


def unpicklable() -> Any:
    """Return a value that cannot be sent back to the agent."""
    return lambda: None


def with_grandchild_then_wait(out: str) -> None:
    """Start a grandchild that sleeps, write both pids to ``out/pids-<rank>``, then wait."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    path = Path(out) / f"pids-{os.environ['RANK']}"
    # The temporary name must not match the reader's ``pids-*``: it could read it half-written.
    tmp = Path(out) / f".writing-{os.environ['RANK']}"
    tmp.write_text(f"{os.getpid()} {child.pid}")
    tmp.rename(path)
    signal.pause()


def wait_for_file(path: str) -> str:
    """Wait until ``path`` exists, then return the rank."""
    while not os.path.exists(path):
        time.sleep(0.01)
    return os.environ["RANK"]
