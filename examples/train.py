"""A small DDP training that resumes from its checkpoints: runs under elastic-run or torchrun.

    elastic-run --standalone --nproc-per-node 2 examples/train.py --steps 300
    torchrun    --standalone --nproc-per-node 2 examples/train.py --steps 300

Each rank trains the same MLP on its own slice of a synthetic regression set (fixed seed), with
gloo on CPU or NCCL on the GPU named by LOCAL_RANK. Rank 0 writes a checkpoint (model,
optimizer, step) every ``--checkpoint-every`` steps, atomically (temporary file, then rename);
on start every rank loads the latest checkpoint and resumes from its step, so a restarted
worker group loses at most ``--checkpoint-every`` steps. At the end rank 0 prints
``done: steps=<N> final_loss=<x>`` and writes ``<checkpoint-dir>/final.json``.

For tests: ``--fail-at-step K`` makes global rank ``--fail-rank`` raise at step K in the first
attempt only (TORCHELASTIC_RESTART_COUNT 0), so the restarted group succeeds;
``--sleep-per-step`` slows training down; ``--handle-usr1`` checkpoints on SIGUSR1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

try:
    from elastic_run.worker import record
except ImportError:  # plain torchrun, without elastic-run installed
    from torch.distributed.elastic.multiprocessing.errors import record  # type: ignore[assignment]

CHECKPOINT_NAME = "checkpoint.pt"
FINAL_NAME = "final.json"
FEATURES = 16
SAMPLES = 4096


@dataclass(frozen=True)
class Args:
    """The command line, parsed."""

    steps: int
    log_every: int
    checkpoint_dir: Path
    checkpoint_every: int
    batch_size: int
    lr: float
    seed: int
    fail_at_step: int | None
    fail_rank: int
    sleep_per_step: float
    handle_usr1: bool


def parse_args(argv: list[str] | None = None) -> Args:
    """Parse the command line.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The parsed arguments.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=300, help="total optimizer steps")
    parser.add_argument("--log-every", type=int, default=50, help="rank 0 prints the loss")
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--checkpoint-every", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fail-at-step", type=int, default=None, help="inject a failure")
    parser.add_argument("--fail-rank", type=int, default=1, help="global rank that fails")
    parser.add_argument("--sleep-per-step", type=float, default=0.0, help="seconds")
    parser.add_argument("--handle-usr1", action="store_true", help="checkpoint on SIGUSR1")
    ns = parser.parse_args(argv)
    if ns.steps < 0 or ns.log_every < 1 or ns.checkpoint_every < 1 or ns.batch_size < 1:
        parser.error("--steps must be >= 0; --log-every, --checkpoint-every, --batch-size >= 1")
    return Args(
        steps=ns.steps,
        log_every=ns.log_every,
        checkpoint_dir=ns.checkpoint_dir,
        checkpoint_every=ns.checkpoint_every,
        batch_size=ns.batch_size,
        lr=ns.lr,
        seed=ns.seed,
        fail_at_step=ns.fail_at_step,
        fail_rank=ns.fail_rank,
        sleep_per_step=ns.sleep_per_step,
        handle_usr1=ns.handle_usr1,
    )


def init_distributed() -> torch.device:
    """Join the process group the launcher describes (env://), or a group of one without one.

    Returns:
        The device this rank trains on: ``cuda:LOCAL_RANK`` with NCCL, else the CPU with gloo.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        backend, device = "nccl", torch.device("cuda", local_rank)
    else:
        backend, device = "gloo", torch.device("cpu")
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)
    else:  # `python examples/train.py`: a world of one needs no launcher
        dist.init_process_group(backend, init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    return device


def make_dataset(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The synthetic regression set, identical on every rank.

    Args:
        seed: the generator seed.

    Returns:
        Inputs ``(SAMPLES, FEATURES)`` and targets ``(SAMPLES, 1)``.
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=gen)
    w = torch.randn(FEATURES, 1, generator=gen)
    y = x @ w + 0.5 * torch.sin(3 * x[:, :1]) + 0.05 * torch.randn(SAMPLES, 1, generator=gen)
    return x, y


def make_model(seed: int) -> nn.Module:
    """The MLP, with the same initial weights on every rank.

    Args:
        seed: the initialization seed.

    Returns:
        The model.
    """
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 1))


def save_checkpoint(
    directory: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Write the checkpoint atomically: a temporary file in the same directory, then rename.

    Args:
        directory: the checkpoint directory (created if missing).
        step: the number of completed steps.
        model: the model (not the DDP wrapper).
        optimizer: its optimizer.
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / CHECKPOINT_NAME
    tmp = directory / f".{CHECKPOINT_NAME}.{os.getpid()}.tmp"
    state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)


def load_checkpoint(
    directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> int:
    """Load the latest checkpoint into ``model`` and ``optimizer`` if there is one.

    Args:
        directory: the checkpoint directory.
        model: the model (not the DDP wrapper).
        optimizer: its optimizer.
        device: where the tensors go.

    Returns:
        The step to resume from (0 without a checkpoint).
    """
    path = directory / CHECKPOINT_NAME
    if not path.exists():
        return 0
    # weights_only: tensors and plain containers only; a checkpoint cannot run code.
    state = torch.load(path, map_location=device, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def write_json_atomically(path: Path, payload: dict[str, object]) -> None:
    """Write ``payload`` as JSON to ``path`` via a temporary file and a rename.

    Args:
        path: the destination.
        payload: the JSON object.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, sort_keys=True) + "\n")
    os.replace(tmp, path)


# The last collectives' work handles, held until the interpreter exits. gloo runs a collective
# on a thread of its own, which drops its handle (and with it the collective's tensors) a moment
# after the collective completed; DDP keeps the process group, and so that thread, alive past
# destroy_process_group(). When that moment falls after Python began shutting down, freeing the
# tensors cannot take the GIL and the process aborts ("terminate called without an active
# exception" after the script's last line, about once in 50 runs on a busy machine). Held here,
# the last handles are freed by the interpreter itself, on the main thread.
_held_works: list[dist.Work] = []


def wait_holding(work: dist.Work | None) -> None:
    """Wait for a collective started with ``async_op=True``; hold its handle (see above)."""
    assert work is not None
    work.wait()
    _held_works[:] = [*_held_works[-3:], work]


def mean_over_ranks(value: torch.Tensor) -> float:
    """The mean of a scalar across every rank (a collective: every rank must call it).

    Args:
        value: a scalar tensor.

    Returns:
        The mean over the world.
    """
    total = value.detach().clone().reshape(1)
    wait_holding(dist.all_reduce(total, async_op=True))
    return float(total.item()) / dist.get_world_size()


class Usr1Flag:
    """Records SIGUSR1; the training loop checks it between steps and acts."""

    def __init__(self) -> None:
        self.raised = False

    def install(self) -> None:
        """Install the handler for SIGUSR1."""
        signal.signal(signal.SIGUSR1, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.raised = True


def train(args: Args) -> None:
    """Train, checkpoint and resume as the module docstring describes.

    Args:
        args: the parsed command line.

    Raises:
        RuntimeError: the injected failure (``--fail-at-step``).
    """
    device = init_distributed()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    usr1 = Usr1Flag()
    if args.handle_usr1:
        usr1.install()

    x, y = make_dataset(args.seed)
    x, y = x[rank::world_size].to(device), y[rank::world_size].to(device)
    model = make_model(args.seed).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start = load_checkpoint(args.checkpoint_dir, model, optimizer, device)
    if start and rank == 0:
        print(f"resumed from step {start}", flush=True)
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    loss_fn = nn.MSELoss()

    def checkpoint(step: int) -> None:
        save_checkpoint(args.checkpoint_dir, step, model, optimizer)

    for step in range(start + 1, args.steps + 1):
        if step == args.fail_at_step and rank == args.fail_rank and restarts == 0:
            raise RuntimeError(f"injected failure at step {step} on rank {rank}")
        lo = ((step - 1) * args.batch_size) % x.shape[0]
        xb, yb = x[lo : lo + args.batch_size], y[lo : lo + args.batch_size]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(xb), yb)
        loss.backward()
        optimizer.step()
        if step % args.log_every == 0:
            mean_loss = mean_over_ranks(loss)
            if rank == 0:
                print(f"step {step}/{args.steps} loss {mean_loss:.6f}", flush=True)
        if usr1.raised:
            usr1.raised = False
            print(f"rank {rank} got SIGUSR1, checkpointing", flush=True)
            checkpoint(step)
        elif rank == 0 and step % args.checkpoint_every == 0:
            checkpoint(step)
        if args.sleep_per_step > 0:
            time.sleep(args.sleep_per_step)

    with torch.no_grad():
        final_loss = mean_over_ranks(loss_fn(model(x), y))
    if rank == 0:
        steps = max(start, args.steps)
        if steps > start and steps % args.checkpoint_every:
            checkpoint(steps)
        print(f"done: steps={steps} final_loss={final_loss:.6f}", flush=True)
        write_json_atomically(
            args.checkpoint_dir / FINAL_NAME,
            {
                "steps": steps,
                "world_size": world_size,
                "final_loss": final_loss,
                "restarts": restarts,
            },
        )
    wait_holding(dist.barrier(async_op=True))
    dist.destroy_process_group()


@record
def main(argv: list[str] | None = None) -> None:
    """Entry point.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    train(parse_args(argv))


if __name__ == "__main__":
    main()
