"""A --preload module for scripts/gpu_check.py: imports torch, as a user's library would."""

import torch

ready = torch.__version__
