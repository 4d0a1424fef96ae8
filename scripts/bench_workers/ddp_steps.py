"""bench_restart_notice.py: a small gloo DDP trainer that stamps its start and every step.

Usage: ddp_steps.py STEP_FILE STOP_FILE. Appends ``start <time> <node> <pid>`` before it imports
torch (the launcher's share ends there), then trains a small model wrapped in
DistributedDataParallel over gloo (each step's backward all-reduces the gradients) and appends
``step <time> <node> <pid> <world_size> <step>`` after each optimizer step (``BENCH_NODE`` comes
from its agent's environment). Every tenth step rank 0 saves the model (a checkpoint, as a DDP
script does). The loop ends for everyone together once STOP_FILE exists (it rides on an
all_reduce, so no worker leaves a collective early).
"""

import os
import sys
import time

step_file, stop_file = sys.argv[1], sys.argv[2]
node = os.environ.get("BENCH_NODE", "?")
pid = os.getpid()


def stamp(line: str) -> None:
    fd = os.open(step_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


stamp(f"start {time.time()!r} {node} {pid}")

from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=timedelta(seconds=120))
world, rank = dist.get_world_size(), dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
inputs = torch.randn(16, 64)
checkpoint = f"{stop_file}.ckpt"
step = 0
while True:
    optimizer.zero_grad()
    model(inputs).square().mean().backward()
    optimizer.step()
    stamp(f"step {time.time()!r} {node} {pid} {world} {step}")
    if rank == 0 and step % 10 == 0:
        torch.save(model.module.state_dict(), checkpoint + ".tmp")
        os.replace(checkpoint + ".tmp", checkpoint)
    flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
    dist.all_reduce(flag)
    if flag[0].item() > 0:
        break
    step += 1
    time.sleep(0.02)
dist.destroy_process_group()
