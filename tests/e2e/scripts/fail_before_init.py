"""Rank 1 exits 1 before joining the process group on its agent's first attempt.

Every other worker (and rank 1 after a restart) joins a gloo group, all-reduces rank + 1 and
prints ``RESULT {"rank", "sum", "restart"}``. On the first attempt rank 0 waits in
``init_process_group`` for a rank 1 that never comes, until its agent restarts it.
"""

import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if os.environ["RANK"] == "1" and restart == 0:
        return 1
    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    result = {"rank": dist.get_rank(), "sum": value.item(), "restart": restart}
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")  # one write (see allreduce.py)
    sys.stdout.flush()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
