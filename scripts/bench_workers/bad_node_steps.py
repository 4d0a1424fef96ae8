"""bench_bad_node.py: a tiny DDP training loop (gloo) whose bad node crashes at every start.

Usage: bad_node_steps.py STEP_FILE STEPS. The worker appends ``start <time> <node> <restart>``
before torch loads, then ``step <time> <node> <world_size> <restart> <step>`` after each of
STEPS optimizer steps of a small DDP model (0.1 s apart: each step is a progress beat, as in
any training script), and exits 0. On the node whose agent has ``BENCH_BAD=1`` it
appends ``crash <time> <node> <restart>`` and kills itself with SIGSEGV instead (a bad host).
"""

import os
import signal
import sys
import time

step_file, steps = sys.argv[1], int(sys.argv[2])
node = os.environ.get("BENCH_NODE", "?")
restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def stamp(line: str) -> None:
    fd = os.open(step_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


stamp(f"start {time.time()!r} {node} {restart}")
if os.environ.get("BENCH_BAD") == "1":
    stamp(f"crash {time.time()!r} {node} {restart}")
    os.kill(os.getpid(), signal.SIGSEGV)

from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
world = dist.get_world_size()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(steps):
    optimizer.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    optimizer.step()
    stamp(f"step {time.time()!r} {node} {world} {restart} {step}")
    time.sleep(0.1)
dist.destroy_process_group()
