"""A gloo training loop for the report test, steered by environment variables (node names from
``MN_NODE``, as the multi-node harness sets them).

Each step: sleep STEP_S (its "compute"; STRAGGLER_S more on the node STRAGGLER_NODE names),
``sync_point()``, an all_reduce, ``progress(step)``. It steps until a rank sees ``$MN_OUT/go``
(the all_reduce tells every rank, so all stop at the same step; at most MAX_WAIT_S, then it
exits 2), so the test steers the job's rounds by files. In a round of
three nodes (WORLD_SIZE 3, one worker each):

    FAIL_NODE=n     node n's worker raises at step FAIL_STEP (default 5) while
                    TORCHELASTIC_RESTART_COUNT is 0 (``@record``: its error.json says why)
    HANG_NODE=n     node n's worker blocks for ever before the all_reduce of step HANG_STEP
                    (default 8) while TORCHELASTIC_RESTART_COUNT is 1
"""

import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from elastic_run.worker import progress, record, sync_point


def block_forever() -> None:
    threading.Event().wait()  # the blocking line the stacks name


@record
def main() -> int:
    dist.init_process_group("gloo")
    node = os.environ["MN_NODE"]
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    full = os.environ["WORLD_SIZE"] == "3"
    step_s = float(os.environ.get("STEP_S", "0.05"))
    extra_s = (
        float(os.environ.get("STRAGGLER_S", "0"))
        if os.environ.get("STRAGGLER_NODE") == node
        else 0.0
    )
    go = Path(os.environ["MN_OUT"]) / "go"
    deadline = time.monotonic() + float(os.environ.get("MAX_WAIT_S", "240"))
    step = 0
    while True:
        if time.monotonic() > deadline:
            return 2
        time.sleep(step_s + extra_s)
        sync_point()
        if full and restart == 0 and node == os.environ.get("FAIL_NODE"):
            if step == int(os.environ.get("FAIL_STEP", "5")):
                raise RuntimeError(f"injected failure on node {node} at step {step}")
        if full and restart == 1 and node == os.environ.get("HANG_NODE"):
            if step == int(os.environ.get("HANG_STEP", "8")):
                block_forever()
        value = torch.tensor([float(go.exists())])  # every rank stops at the same step
        dist.all_reduce(value)
        progress(step)
        step += 1
        if value.item() > 0:
            break
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
