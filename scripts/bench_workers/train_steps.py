"""bench_recovery.py: a tiny gloo training loop that stamps every step.

Usage: train_steps.py STEP_FILE STOP_FILE FAIL_STEP. Each step is one all_reduce of a small
tensor; the worker appends ``step <time> <node> <pid> <world_size> <step>`` to STEP_FILE
(``BENCH_NODE`` comes from its agent's environment). The loop ends for everyone together once
STOP_FILE exists (it rides on the all_reduce, so no worker leaves a collective early). With
FAIL_STEP >= 0, the worker of node B with local rank 1 writes ``fail <time>`` and exits 1 at that
step on attempt 0.
"""

import os
import sys
import time

step_file, stop_file, fail_step = sys.argv[1], sys.argv[2], int(sys.argv[3])
node = os.environ.get("BENCH_NODE", "?")
pid = os.getpid()


def stamp(line: str) -> None:
    fd = os.open(step_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


stamp(f"start {time.time()!r} {node} {pid}")  # before importing torch: the agent's share ends here

from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo", timeout=timedelta(seconds=120))
world = dist.get_world_size()
is_failer = (
    fail_step >= 0
    and node == "B"
    and os.environ["LOCAL_RANK"] == "1"
    and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
)
step = 0
while True:
    if is_failer and step == fail_step:
        stamp(f"fail {time.time()!r} {node} {pid}")
        sys.exit(1)
    flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0, 1.0])
    dist.all_reduce(flag)
    stamp(f"step {time.time()!r} {node} {pid} {world} {step}")
    if flag[0].item() > 0:
        break
    step += 1
    time.sleep(0.05)
dist.destroy_process_group()
