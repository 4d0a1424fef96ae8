"""bench_launch.py (b): stamp a failure on attempt 0 and the first line of attempt 1.

Usage: restart_stamp.py STAMP_FILE. Local rank 1 writes ``fail <time.time()>`` and exits 1 on
attempt 0 (TORCHELASTIC_RESTART_COUNT=0); rank 0 waits there to be stopped. On attempt 1 every
worker first writes ``start <rank> <time.time()>`` and exits 0. Lines are appended with
O_APPEND, one write each, so the two workers never interleave.
"""

import time

now = time.time()

import os  # noqa: E402 - the stamp comes first: it is the restarted worker's first line
import sys  # noqa: E402


def stamp(line: str) -> None:
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


rank = os.environ["LOCAL_RANK"]
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    if rank == "1":
        stamp(f"fail {time.time()!r}")
        sys.exit(1)
    time.sleep(120)  # stopped by the agent when rank 1 fails
    sys.exit(0)
stamp(f"start {rank} {now!r}")
