"""chaos.py: a tiny gloo training loop that checkpoints its step and resumes from it.

Usage: checkpoint_steps.py STEP_FILE STOP_FILE CHECKPOINT EVERY. At its start each worker reads
CHECKPOINT (the step to resume from; 0 when absent) and appends
``resume <time> <node> <pid> <world_size> <step>`` to STEP_FILE. Each step is one all_reduce of a
small tensor; after it the worker appends ``step <time> <node> <pid> <world_size> <step>``
(``BENCH_NODE`` comes from its agent's environment), and every EVERY steps global rank 0 writes
the next step to CHECKPOINT (a temporary file renamed over it, so a reader sees a whole number),
as a DDP script saves its model from rank 0. The loop ends for everyone together once STOP_FILE
exists (it rides on the all_reduce, so no worker leaves a collective early).
"""

import os
import sys
import time

step_file, stop_file, checkpoint, every = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
node = os.environ.get("BENCH_NODE", "?")
pid = os.getpid()


def stamp(line: str) -> None:
    fd = os.open(step_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def save(step: int) -> None:
    partial = f"{checkpoint}.{pid}"
    with open(partial, "w") as f:
        f.write(f"{step}\n")
    os.replace(partial, checkpoint)


from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

try:
    with open(checkpoint) as f:
        step = int(f.read())
except FileNotFoundError:
    step = 0
dist.init_process_group("gloo", timeout=timedelta(seconds=120))
world = dist.get_world_size()
rank = dist.get_rank()
stamp(f"resume {time.time()!r} {node} {pid} {world} {step}")
while True:
    flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0, 1.0])
    dist.all_reduce(flag)
    stamp(f"step {time.time()!r} {node} {pid} {world} {step}")
    if flag[0].item() > 0:
        break
    step += 1
    if rank == 0 and step % every == 0:
        save(step)
    time.sleep(0.05)
dist.destroy_process_group()
