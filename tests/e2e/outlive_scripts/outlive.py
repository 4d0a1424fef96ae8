"""A worker whose script ends but whose process does not: the way it blocks comes from argv.

    outlive.py thread [CODE]   a non-daemon thread blocked forever; then ``sys.exit(CODE)``
    outlive.py atexit [CODE]   an atexit handler that blocks forever; then ``sys.exit(CODE)``
    outlive.py raise           (with @record) a non-daemon thread blocked, then an exception
    outlive.py beat [CODE]     progress beats for a few steps, then as ``thread``
    outlive.py gloo            a gloo all_reduce across the job, then as ``thread``
    outlive.py abort [CODE]    an atexit handler that aborts the process (SIGABRT, as a native
                               crash in the interpreter's shutdown); then ``sys.exit(CODE)``
    outlive.py marked MARKER   an atexit handler that writes the file MARKER and blocks forever;
                               then an exception (status 1)

Each prints ``LAST LINE rank=R`` as its script's last act.
"""

import atexit
import os
import sys
import threading

from elastic_run.worker import progress, record

never = threading.Event()


def block_at_exit() -> None:
    never.wait()


@record
def main() -> int:
    how = sys.argv[1]
    code = int(sys.argv[2]) if len(sys.argv) > 2 and how != "marked" else 0
    if how == "beat":
        for step in range(8):
            progress(step)
        how = "thread"
    if how == "gloo":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        total = torch.ones(1)
        dist.all_reduce(total)
        assert int(total.item()) == dist.get_world_size()
        how = "thread"
    if how in ("thread", "raise"):
        threading.Thread(target=never.wait, name="forgotten").start()
    elif how == "atexit":
        atexit.register(block_at_exit)
    elif how == "abort":
        atexit.register(os.abort)
    elif how == "marked":
        marker = sys.argv[2]

        def in_shutdown() -> None:  # runs after the zygote was told the script's end
            with open(marker + ".tmp", "w") as file:
                file.write(str(os.getpid()))
            os.replace(marker + ".tmp", marker)  # whole, or not there
            never.wait()

        atexit.register(in_shutdown)
    print(f"LAST LINE rank={os.environ['RANK']}", flush=True)
    if how in ("raise", "marked"):
        raise RuntimeError("the script failed at its end")
    return code


if __name__ == "__main__":
    sys.exit(main())
