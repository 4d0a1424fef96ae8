"""Two-worker gloo all-reduce: each rank contributes rank + 1 and prints the sum it got.

With FAIL_ATTEMPTS=N in the environment, rank 1 exits 1 after the all-reduce on attempts
0..N-1 (TORCHELASTIC_RESTART_COUNT), so the job restarts N times with a fresh process group.
"""

import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    # One write for the line (print makes two under -u; another rank's line could land between).
    sys.stdout.write(
        "RESULT " + json.dumps({"rank": rank, "sum": value.item(), "restart": restart}) + "\n"
    )
    sys.stdout.flush()
    fail_attempts = int(os.environ.get("FAIL_ATTEMPTS", "0"))
    dist.destroy_process_group()
    if rank == 1 and restart < fail_attempts:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
