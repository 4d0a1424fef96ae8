"""A small gloo training loop for the hang and straggler tests, steered by environment variables.

Each step: sleep STEP_S (the "compute"), an optional straggler delay, ``sync_point()``, an
all_reduce of (rank + 1 + step), then ``progress(step)``. RESULT is the sum of the reduced
values over every step, the same for every rank and for any run that completes.

    STEPS=N             steps (default 40)
    STEP_S=S            seconds of "compute" per step (default 0.05)
    FIRST_STEP_X=K      the first step lasts K times longer
    CHECKPOINT_AT=k     after step k, a checkpoint pause of CHECKPOINT_S seconds writing to
                        OUT_DIR (it writes storage the whole time)
    HANG_RANK=r         rank r blocks forever before the all_reduce of step HANG_STEP
                        (first attempt only: TORCHELASTIC_RESTART_COUNT 0)
    HANG_STEP=k         (default 20)
    STRAGGLER_RANK=r    rank r sleeps STRAGGLER_S (default 0.05) more per step
    NO_BEATS=1          never call progress()
    PRINT_EVERY=k       print a line every k steps
    STEP_FILE=path      write "<rank> <step>" there after every step (the tests watch it)
"""

import json
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from elastic_run.worker import progress, sync_point


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def block_forever() -> None:
    threading.Event().wait()  # the blocking line the stacks must name


def checkpoint(out: Path, rank: int, seconds: float) -> None:
    end = time.monotonic() + seconds
    path = out / f"ckpt-{rank}.bin"
    chunk = os.urandom(1 << 20)
    with path.open("wb") as f:
        while time.monotonic() < end:
            f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
            f.seek(0)


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    steps = env_int("STEPS", 40)
    step_s = float(os.environ.get("STEP_S", "0.05"))
    hang_rank = env_int("HANG_RANK", -1)
    hang_step = env_int("HANG_STEP", 20)
    straggler = env_int("STRAGGLER_RANK", -1)
    straggler_s = float(os.environ.get("STRAGGLER_S", "0.05"))
    first_x = float(os.environ.get("FIRST_STEP_X", "1"))
    ckpt_at = env_int("CHECKPOINT_AT", -1)
    ckpt_s = float(os.environ.get("CHECKPOINT_S", "0"))
    beats = os.environ.get("NO_BEATS") != "1"
    every = env_int("PRINT_EVERY", 0)
    step_file = os.environ.get("STEP_FILE")
    out = Path(os.environ.get("OUT_DIR", "."))
    total = 0.0
    for step in range(steps):
        time.sleep(step_s * (first_x if step == 0 else 1.0))
        if rank == straggler:
            time.sleep(straggler_s)
        if beats:
            sync_point()
        if rank == hang_rank and step == hang_step and restart == 0:
            block_forever()
        value = torch.tensor([float(rank + 1 + step)])
        dist.all_reduce(value)
        total += value.item()
        if beats:
            progress(step)
        if step == ckpt_at:
            checkpoint(out, rank, ckpt_s)
        if every and step % every == 0:
            print(f"rank {rank} step {step} total {total:.0f}", flush=True)
        if step_file:
            Path(f"{step_file}.{rank}").write_text(f"{rank} {step} {restart}")
    print("RESULT " + json.dumps({"rank": rank, "total": total, "restart": restart}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
