"""torch.distributed.elastic.multiprocessing.errors.handlers: the error handler in use."""

from __future__ import annotations

from elastic_run.worker.error_handler import get_error_handler

__all__ = [
    "get_error_handler",
]
