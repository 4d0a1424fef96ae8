"""A DDP training loop over gloo that imports nothing of elastic_run (its beats come from the
optimizer hook elastic-run installs), steered by environment variables.

    STEPS=N           steps (default 30)
    STEP_S=S          seconds of "compute" per step (default 0.02)
    HANG_RANK=r       rank r blocks forever in step HANG_STEP, between its forward and its
                      backward (outside any collective: its peer waits in the backward's
                      all_reduce)
    HANG_STEP=k       (default 10)
    HANG_ALWAYS=1     block on every attempt (default: only on TORCHELASTIC_RESTART_COUNT 0)

Prints ``RESULT {"rank": r, "weight": [...]}`` at the end: the same on every rank.
"""

import json
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def block_forever() -> None:
    threading.Event().wait()  # the blocking line the stacks must name


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    steps = int(os.environ.get("STEPS", "30"))
    step_s = float(os.environ.get("STEP_S", "0.02"))
    hang_rank = int(os.environ.get("HANG_RANK", "-1"))
    hang_step = int(os.environ.get("HANG_STEP", "10"))
    hangs = rank == hang_rank and (restart == 0 or os.environ.get("HANG_ALWAYS") == "1")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        time.sleep(step_s)
        inputs = torch.full((8, 4), float(rank + step))
        loss = model(inputs).square().mean()
        if hangs and step == hang_step:
            block_forever()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    weight = [round(float(w), 6) for w in model.module.weight.flatten()]
    print("RESULT " + json.dumps({"rank": rank, "weight": weight}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
