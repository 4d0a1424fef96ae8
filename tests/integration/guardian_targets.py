"""What the workers of tests/integration/test_guardian_window.py run (a script or a callable).

A worker starts two grandchildren, then waits: one exec'd in a session of its own (out of
reach of the worker's session and of its parent-death signal) and one forked without an exec
(its /proc environment is the worker's own). It writes ``<pid> <exec'd> <forked>`` to
``<mark_dir>/grandchildren.pids`` once both run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

SLEEPER = "import signal\nwhile True: signal.pause()"


def start_grandchildren_then_wait(mark_dir: str) -> None:
    """Start the two grandchildren, write the pids, wait for a signal."""
    execd = subprocess.Popen([sys.executable, "-c", SLEEPER], start_new_session=True)
    forked = os.fork()
    if forked == 0:
        try:
            while True:
                signal.pause()
        finally:
            os._exit(0)
    mark = Path(mark_dir) / "grandchildren.pids"
    mark.with_suffix(".tmp").write_text(f"{os.getpid()} {execd.pid} {forked}")
    mark.with_suffix(".tmp").rename(mark)
    while True:
        signal.pause()


if __name__ == "__main__":
    start_grandchildren_then_wait(sys.argv[1])
