"""torch.distributed.elastic.multiprocessing.errors.error_handler: the error file's writer."""

from __future__ import annotations

from elastic_run.worker.error_handler import ErrorHandler

__all__ = [
    "ErrorHandler",
]
