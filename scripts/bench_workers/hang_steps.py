"""bench_hang.py: a tiny gloo training loop where one rank blocks forever before an all_reduce.

Usage: hang_steps.py STEP_FILE STOP_FILE HANG_STEP. Each step is one all_reduce; the worker then
calls ``elastic_run.worker.progress(step)`` (a no-op under torchrun) and appends
``step <time> <node> <pid> <world_size> <step>`` to STEP_FILE. On attempt 0 the worker of node B
with local rank 1 writes ``hang <time>`` at step HANG_STEP and blocks forever before its
all_reduce, so every other rank waits inside it. The loop ends for everyone together once
STOP_FILE exists (it rides on the all_reduce).
"""

import os
import sys
import threading
import time

step_file, stop_file, hang_step = sys.argv[1], sys.argv[2], int(sys.argv[3])
node = os.environ.get("BENCH_NODE", "?")
pid = os.getpid()


def stamp(line: str) -> None:
    fd = os.open(step_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


stamp(f"start {time.time()!r} {node} {pid}")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from elastic_run.worker import progress  # noqa: E402

dist.init_process_group("gloo")
world = dist.get_world_size()
is_hanger = (
    node == "B"
    and os.environ["LOCAL_RANK"] == "1"
    and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
)
step = 0
while True:
    time.sleep(0.05)
    if is_hanger and step == hang_step:
        stamp(f"hang {time.time()!r} {node} {pid}")
        threading.Event().wait()  # blocks forever: the others wait in the all_reduce below
    flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0, 1.0])
    dist.all_reduce(flag)
    progress(step)
    stamp(f"step {time.time()!r} {node} {pid} {world} {step}")
    if flag[0].item() > 0:
        break
    step += 1
dist.destroy_process_group()
