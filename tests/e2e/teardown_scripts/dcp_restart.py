"""Issue 28's job: DDP over gloo, a DCP save at step 5, rank 1 dies at step 7 of the first
attempt; the restart loads the checkpoint, finishes step 9, all-reduces the loss, prints its
result and calls ``destroy_process_group()``.

    dcp_restart.py CHECKPOINT_DIR

Prints ``RESULT rank=R loss=L start=S`` as its last line (``start`` is the step it resumed at).
The model, the optimizer and the process group stay the script's globals, as in a user's script.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.nn.parallel import DistributedDataParallel

STEPS = 10
SAVE_AT = 5
DIE_AT = 7

checkpoint = sys.argv[1]
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
torch.manual_seed(0)
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
start = 0
if os.path.exists(os.path.join(checkpoint, ".metadata")):
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 0}
    dcp.load(state, checkpoint_id=checkpoint)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = int(state["step"]) + 1
loss = torch.zeros(())
for step in range(start, STEPS):
    inputs = torch.randn(16, 8)
    loss = model(inputs).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step == SAVE_AT:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        dcp.save(state, checkpoint_id=checkpoint)
    if step == DIE_AT and attempt == 0 and rank == 1:
        os._exit(17)
total = loss.detach().clone()
dist.all_reduce(total)
sys.stdout.write(f"RESULT rank={rank} loss={total.item():.6f} start={start}\n")
sys.stdout.flush()
dist.destroy_process_group()
