"""A bench worker: STEPS optimizer steps of a small model, each timed; imports nothing of
elastic_run (any beat comes from elastic-run's optimizer hook). Prints ``STEPS [ns, ...]``.
With ``ddp``, the model is wrapped in DistributedDataParallel over gloo (run it with two
workers or more); rank 0 prints.

    python optimizer_steps.py STEPS WIDTH [ddp]
"""

import json
import sys
import time

import torch


def main() -> None:
    steps, width = int(sys.argv[1]), int(sys.argv[2])
    ddp = sys.argv[3:] == ["ddp"]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(width, width)
    if ddp:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    inputs = torch.randn(32, width)
    times = []
    for _ in range(steps):
        started = time.perf_counter_ns()
        optimizer.zero_grad()
        model(inputs).square().mean().backward()
        optimizer.step()
        times.append(time.perf_counter_ns() - started)
    if not ddp:
        print("STEPS " + json.dumps(times), flush=True)
        return
    if dist.get_rank() == 0:
        print("STEPS " + json.dumps(times), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
