"""bench_launch.py (a): a worker that only prints its rank."""

import os

print(f"rank {os.environ['RANK']}", flush=True)
