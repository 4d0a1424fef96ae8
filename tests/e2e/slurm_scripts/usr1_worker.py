"""A worker for the SIGUSR1 test: records SIGUSR1, keeps running, ends when told.

Usage: usr1_worker.py MARKER_DIR

Writes ``MARKER_DIR/ready-<rank>`` once its handler is installed, ``usr1-<rank>`` (its pid)
when SIGUSR1 arrives, and ends with ``done-<rank>`` (its pid and restart count) once
``MARKER_DIR/go`` exists; exits 9 if told nothing within 120 s.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType


def main() -> int:
    """Run the worker; see the module docstring."""
    marker_dir = Path(sys.argv[1])
    rank = os.environ["RANK"]
    pid = os.getpid()

    def on_usr1(signum: int, frame: FrameType | None) -> None:
        (marker_dir / f"usr1-{rank}").write_text(f"{pid}\n")

    signal.signal(signal.SIGUSR1, on_usr1)
    (marker_dir / f"ready-{rank}").write_text(f"{pid}\n")
    deadline = time.monotonic() + 120
    while not (marker_dir / "go").exists():
        if time.monotonic() > deadline:
            return 9
        time.sleep(0.05)
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    (marker_dir / f"done-{rank}").write_text(f"{pid} {restarts}\n")
    print(f"worker rank {rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
