"""A plain DDP training loop over gloo that imports nothing of elastic_run, steered by environment
variables (its beats and work marks come from the hooks elastic-run installs).

Each step: a forward (rank SLOW_RANK's takes SLOW_S longer, inside its module's forward), the
backward (DDP's gradient all_reduce), the optimizer step, then an all_reduce of the loss for the
log, as many scripts do.

    STEPS=N           steps (default 100000: the tests stop the job)
    STEP_S=S          seconds of data loading per step on every rank (default 0.02)
    SLOW_RANK=r       rank r's forward takes SLOW_S (default 0.15) more
    HANG_RANK=r       rank r blocks forever before the loss all_reduce of step HANG_STEP (outside
                      any collective: the others wait inside that all_reduce)
    HANG_STEP=k       (default 10)
"""

import os
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def block_forever() -> None:
    threading.Event().wait()  # the blocking line the stacks must name


class Net(torch.nn.Module):
    def __init__(self, extra_s: float) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.extra_s = extra_s

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.extra_s:
            time.sleep(self.extra_s)  # this rank's extra work, inside its forward
        return self.linear(inputs)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    steps = int(os.environ.get("STEPS", "100000"))
    step_s = float(os.environ.get("STEP_S", "0.02"))
    slow = rank == int(os.environ.get("SLOW_RANK", "-1"))
    hang_rank = int(os.environ.get("HANG_RANK", "-1"))
    hang_step = int(os.environ.get("HANG_STEP", "10"))
    torch.manual_seed(0)
    model = DistributedDataParallel(Net(float(os.environ.get("SLOW_S", "0.15")) if slow else 0.0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        time.sleep(step_s)
        inputs = torch.full((8, 4), float(rank + step) / 100)
        loss = model(inputs).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == hang_rank and step == hang_step:
            block_forever()
        logged = loss.detach().clone()
        dist.all_reduce(logged)  # the loss for the log
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
