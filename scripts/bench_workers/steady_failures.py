"""A steady DDP training loop over gloo whose rank FAIL_RANK raises at known steps (torch's own
``@record`` writes the error file), stamping every step and failure on stdout.

    STEPS=N         steps per attempt (default 40)
    STEP_S=S        seconds of "compute" per step (default 0.05)
    FAIL_RANK=r     the rank that fails (default 1)
    FAIL_STEP=k     it raises right after step k's optimizer step (default 10) ...
    FAILURES=n      ... on each of the first n attempts (TORCHELASTIC_RESTART_COUNT < n; default 2)

Lines (epoch seconds, this host's clock): ``STAMP {"rank", "restart", "step", "t"}`` after each
optimizer step (the auto beat happens inside it) and ``FAIL {"rank", "restart", "t"}`` just before
the failure is raised. The script imports nothing of elastic_run.
"""

import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel


def stamp(kind: str, **fields: object) -> None:
    print(f"{kind} " + json.dumps({**fields, "t": time.time()}), flush=True)


@record
def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    steps = int(os.environ.get("STEPS", "40"))
    step_s = float(os.environ.get("STEP_S", "0.05"))
    fails = rank == int(os.environ.get("FAIL_RANK", "1")) and restart < int(
        os.environ.get("FAILURES", "2")
    )
    fail_step = int(os.environ.get("FAIL_STEP", "10"))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        time.sleep(step_s)
        loss = model(torch.full((8, 4), float(rank + step))).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        stamp("STAMP", rank=rank, restart=restart, step=step)
        if fails and step == fail_step:
            stamp("FAIL", rank=rank, restart=restart)
            raise RuntimeError(f"injected failure at step {step} (restart {restart})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
