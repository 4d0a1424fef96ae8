"""A --preload module for scripts/gpu_check.py that asks whether CUDA is there at import time.

``device = "cuda" if torch.cuda.is_available() else "cpu"`` at module level is a common idiom.
It initialises no CUDA context (``torch.cuda.is_initialized()`` stays False), but by default it
asks the CUDA driver for the device count, and torch then forbids CUDA in forked children
("Cannot re-initialize CUDA in forked subprocess"). Warm workers are forked children.
"""

import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
