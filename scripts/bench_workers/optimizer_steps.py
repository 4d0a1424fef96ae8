"""A bench worker: STEPS optimizer steps of a small model, each timed; imports nothing of
elastic_run (any beat comes from elastic-run's optimizer hook). Prints ``STEPS [ns, ...]``.

    python optimizer_steps.py STEPS WIDTH
"""

import json
import sys
import time

import torch


def main() -> None:
    steps, width = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(width, width)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    inputs = torch.randn(32, width)
    times = []
    for _ in range(steps):
        started = time.perf_counter_ns()
        optimizer.zero_grad()
        model(inputs).square().mean().backward()
        optimizer.step()
        times.append(time.perf_counter_ns() - started)
    print("STEPS " + json.dumps(times), flush=True)


if __name__ == "__main__":
    main()
