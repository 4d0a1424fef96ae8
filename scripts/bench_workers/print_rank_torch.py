"""bench_launch.py (c): a worker that imports torch, then prints its rank."""

import os

import torch

print(f"rank {os.environ['RANK']} torch {torch.__version__}", flush=True)
