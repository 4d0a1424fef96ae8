"""torch.distributed.elastic.multiprocessing.errors: how a worker's failure reaches the agent."""

from __future__ import annotations

from elastic_run.multiprocessing_errors import (
    ChildFailedError,
    ErrorHandler,
    ProcessFailure,
    get_error_handler,
    record,
)

__all__ = [
    "ChildFailedError",
    "ErrorHandler",
    "ProcessFailure",
    "get_error_handler",
    "record",
]
